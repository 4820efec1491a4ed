"""The pattern families, in the order they claim a node, and the passes that run them.

    FAMILIES      sdpa_calls.FAMILY              F.scaled_dot_product_attention -> fa4::attention
                  handwritten_attention.FAMILY   softmax(q @ k^T * c + mask) @ v -> fa4::attention
                  opaque_attention.FAMILY        F.multi_head_attention_forward, flex_attention: kept, with a record
                  int8_linear.FAMILY             x @ dequantize(w_int8, scale)^T -> fa4::int8_linear (post-grad)
                  int8_int8_linear.FAMILY        _int_mm(x_int8, w_int8^T) * x_scale * w_scale -> fa4::int8_int8_linear
                                                 (post-grad)
                  nvfp4_linear.FAMILY            x @ dequantize(w_fp4, block, global)^T -> fa4::nvfp4_linear (post-grad)
                  fp8_linear.FAMILY              _scaled_mm(x_fp8, w_fp8^T, x_scale, w_scale), x @ dequantize(w_fp8,
                                                 scale)^T -> fa4::fp8_linear (post-grad)

    GROUPINGS     sibling_linears.FAMILY         fa4::nvfp4_linear / fa4::int8_linear calls of one x -> one
                                                 fa4::nvfp4_sibling_linears / fa4::int8_sibling_linears (post-grad,
                                                 over what FAMILIES wrote)
                  gated_linears.FAMILY           silu(gate) * up of two NVFP4 siblings over one row of x -> one
                                                 fa4::nvfp4_gated_linear (post-grad, over what sibling_linears wrote;
                                                 option `gated_linears`)

Around the TORCH_IR families, five passes that rewrite no op of a family: vmapped_masks.unvmap and
overwritten_masks.overwrite (before: masks written as the broadcasting or the value they compute),
multihead_attention.open_multihead and encoder_layer.open_encoder_layers (before: nn.MultiheadAttention's call and
nn.TransformerEncoderLayer's fused inference call written as the SDPA call and layer they compute) and
rotary_tables.compute_once (after; option `rotary_tables`: a rotary embedding's cos / sin computed once).

A family's stage says which graph it sees: TORCH_IR families run on the Dynamo graph in the backend,
before AOTAutograd (`run_torch_ir_passes`: their ops' autograd formulas then serve training); POST_GRAD
families run on Inductor's aten graphs through its `post_grad_custom_pre_pass` hook (post_grad.py), where
AOTAutograd has decomposed tensor subclasses (torchao's quantized weights). Adding a family is a module
with a `FAMILY` and an entry here.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch._guards import detect_fake_mode
from torch.fx import GraphModule, Node

from . import (encoder_layer, fp8_linear, gated_linears, handwritten_attention, int8_int8_linear, int8_linear,
               multihead_attention, nvfp4_linear, opaque_attention, overwritten_masks, rotary_tables, sdpa_calls,
               sibling_linears, vmapped_masks)
from .family import TORCH_IR, Context, Family
from .graph_edit import erased
from .masks import BodyConstants, Outside
from .records import Decline, Record
from .spellings import location, module_path

log = logging.getLogger("fa4_inductor.lowering")

FAMILIES: tuple[Family, ...] = (sdpa_calls.FAMILY, handwritten_attention.FAMILY, opaque_attention.FAMILY,
                                int8_linear.FAMILY, int8_int8_linear.FAMILY, nvfp4_linear.FAMILY, fp8_linear.FAMILY)
GROUPINGS: tuple[Family, ...] = (sibling_linears.FAMILY, gated_linears.FAMILY)  # each a pass of its own, in order


def module_buffers(gm: GraphModule, example_inputs) -> dict:
    """Placeholder -> (source name, real tensor) for the graph inputs that are module buffers.

    Masks may be read from them by value (masks.py), under a guard on their version counter (the backend's);
    inference tensors, which have none, are excluded, as are parameters and user inputs."""
    constants = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, example in zip(placeholders, example_inputs):
        grapharg = node.meta.get("grapharg")
        source = getattr(grapharg, "source", None)
        name = source.name if source is not None else ""
        name = name() if callable(name) else name  # a method before torch 2.12, a property after
        if "._buffers[" in name and isinstance(example, torch.Tensor) and not _is_fake(example) \
                and not example.is_inference():
            constants[node] = (name, example)
    return constants


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


READ_BY_VALUE = "fa4_read_by_value"
"""`gm.meta` key: the graph input positions of the module buffers a rewrite read by value (a mask), which
the backend watches for later in-place updates (backend.py)."""


def run_families(context: Context, stage: str, families=FAMILIES) -> list[Record]:
    """Offer every node of the graph to the enabled families of `stage`, in order; the first whose candidate
    it is rewrites it or declines. One record per candidate."""
    mine = [f for f in families if f.stage == stage and f.enabled(context.options)]
    records = []
    for node in list(context.gm.graph.nodes):
        if erased(node):
            continue  # removed by an earlier rewrite
        family = next((f for f in mine if f.is_candidate(node)), None)
        if family is None:
            continue
        where, module = location(node), module_path(node)
        try:
            text = family.rewrite(node, context)
        except Decline as e:
            records.append(Record(family.name, where, False, str(e), module))
            continue
        if text is not None:
            records.append(Record(family.name, where, True, text, module))
    return records


def run_torch_ir_passes(gm: GraphModule, example_inputs, options) -> list[Record]:
    """The TORCH_IR families over a Dynamo graph, in place, and over the bodies of its activation-checkpointed
    regions (`_checkpointed_bodies`); one record per candidate."""
    fake_mode = _fake_mode_of_graph(gm) or detect_fake_mode(example_inputs)
    records, read_by_value = _run_graph(gm, options, fake_mode, module_buffers(gm, example_inputs))
    placeholders = _placeholders(gm)
    gm.meta[READ_BY_VALUE] = [placeholders.index(n) for n in read_by_value]
    for record in records:
        log.debug("%s", record)
    return records


def _run_graph(gm: GraphModule, options, fake_mode, constants: dict) -> tuple[list[Record], set]:
    """The records of one graph and its checkpointed bodies, and the placeholders of `gm` whose module buffers a
    rewrite read by value."""
    vmapped_masks.unvmap(gm, fake_mode)
    overwritten_masks.overwrite(gm, fake_mode)
    multihead_attention.open_multihead(gm, fake_mode)
    encoder_layer.open_encoder_layers(gm, fake_mode)
    context = Context(gm, options, fake_mode, constants=constants)
    records = run_families(context, TORCH_IR)
    if options.rotary_tables:
        rotary_tables.compute_once(gm, fake_mode)
    read_by_value = set(context.read_by_value)
    for node, body in _checkpointed_bodies(gm):
        outer = dict(zip(_placeholders(body), node.args[1:]))  # the body's inputs are the region's operands
        body_constants = BodyConstants(
            {p: constants[a] for p, a in outer.items() if a in constants},
            {p: Outside(a, constants, context.mutations, node) for p, a in outer.items()
             if isinstance(a, Node) and a not in constants})
        body_records, body_read = _run_graph(body, options, fake_mode, body_constants)
        module = module_path(node)
        records += [r if r.module else dataclasses.replace(r, module=module) for r in body_records]
        read_by_value |= {outer[p] for p in body_read}
    gm.graph.lint()
    gm.recompile()
    return records, read_by_value


def _checkpointed_bodies(gm: GraphModule) -> list:
    """(region node, body) of every `torch.utils.checkpoint` region of the graph: Dynamo writes the region as
    `tag_activation_checkpoint(body, *operands)` over a subgraph module (HF's `gradient_checkpointing_enable`
    puts each decoder layer in one), which AOTAutograd inlines, recomputing it in the backward."""
    return [(node, getattr(gm, node.args[0].target)) for node in gm.graph.nodes
            if node.target is torch.ops.higher_order.tag_activation_checkpoint
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "get_attr"]


def _placeholders(gm: GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _fake_mode_of_graph(gm: GraphModule):
    """The fake mode of the example values Dynamo recorded (not the tracing context's, which may differ)."""
    for node in gm.graph.nodes:
        mode = getattr(node.meta.get("example_value"), "fake_mode", None)
        if mode is not None:
            return mode
    return None
