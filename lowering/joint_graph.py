"""The joint stage: dequantized weights recomputed in the backward instead of saved, through Inductor's
`joint_custom_pre_pass` (the forward and backward as one graph, before the partitioner splits them).

A training step over frozen quantized weights (fine-tuning around int8 / NVFP4 / fp8 linears) computes each
weight in the model's dtype from its codes and scales, and the backward needs it again for the input's gradient:

    w = convert_element_type(codes, bf16) * scale        codes, scale: placeholders (primals), no gradient
    out = mm(x, t(w))                                    forward
    grad_x = mm(grad_out, w)                             backward

Inductor's partitioner saves `w` for the backward (it does not recompute what the backward must materialize for
a matmul), so a compiled step holds a copy of every quantized weight in the model's dtype from its forward to its
backward: 2 bytes a weight beside the 1 (int8, fp8) or 0.56 (NVFP4) the codes take, where eager holds none. This
pass marks every node computed from primals alone, with a quantized primal among them (int8, uint8, fp8), as
MUST_RECOMPUTE (the checkpoint policy the partitioner honours): the forward saves the codes and scales (inputs,
already held), and the backward computes `w` again, transiently, one layer at a time. The forward's
dequantize-then-matmul then no longer escapes the forward graph, so the POST_GRAD families rewrite it as they do
at inference. Factory calls, views and constants are recomputable leaves; random and in-place ops, matmuls,
attention and custom ops stop a chain; a primal the graph writes is not a leaf, and a node that already carries a
recompute policy (activation checkpointing) keeps it. By default (`recompute_dequantized_weights` None) chains from
packed 4-bit codes (uint8: NVFP4) are left to the partitioner: their step measured slower recomputed than default
compile's on the H200 (docs/benchmarks.md session 55); True marks them too. Inductor runs the hook on inference
graphs too (no tangents): those are left alone. Like the post-grad hook's, this object says what it does in
`uuid()` for the FX graph cache.
"""

from __future__ import annotations

import logging

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx import Graph, Node
from torch.utils.checkpoint import CheckpointPolicy

from .mutations import Mutations, storage
from .post_grad import source_hash

log = logging.getLogger("fa4_inductor.lowering")

HOOK = "joint_custom_pre_pass"

QUANTIZED_DTYPES = (torch.int8, torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2)

_aten = torch.ops.aten
_MATMULS = {_aten.mm.default, _aten.bmm.default, _aten.addmm.default, _aten.baddbmm.default,
            _aten.convolution.default, _aten._scaled_mm.default, _aten._int_mm.default}


def _recomputable(node: Node) -> bool:
    target = node.target
    if target in _MATMULS or "attention" in str(target):
        return False
    if isinstance(target, torch._ops.OpOverload) and target.namespace not in ("aten", "prims"):
        return False  # custom ops (ours among them): what they cost is not known here
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.is_mutable:
        return False
    tags = getattr(target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags


def mark_dequantized_weights(graph: Graph, packed: bool = True) -> list[Node]:
    """Mark the nodes of a joint graph that are computed from primals alone, with a quantized primal among their
    inputs' ancestors, as recomputed in the backward (module docstring). `packed`: also those with packed 4-bit codes
    (uint8: NVFP4's e2m1 pairs) among them. Returns them (none for a graph without tangents)."""
    placeholders = graph.find_nodes(op="placeholder")
    if not any(str(p.target).startswith("tangents") for p in placeholders):
        return []  # an inference graph (Inductor runs the hook on those too): nothing is saved for a backward
    written = Mutations(graph).writes
    from_primals: dict[Node, frozenset] = {}  # node -> the dtypes of the quantized primals among its ancestors
    marked = []
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            if node.op == "placeholder" and str(node.target).startswith("tangents") or storage(node) in written:
                continue  # a primal the graph writes (`copy_` at its end): the backward would read the new value
            value = node.meta.get("val")
            quantized = isinstance(value, torch.Tensor) and value.dtype in QUANTIZED_DTYPES
            from_primals[node] = frozenset([value.dtype] if quantized else [])
            continue
        if node.op != "call_function" or not _recomputable(node):
            continue
        inputs = node.all_input_nodes
        if not all(i in from_primals for i in inputs):
            continue
        dtypes = frozenset().union(*(from_primals[i] for i in inputs))
        from_primals[node] = dtypes
        chosen = dtypes and (packed or torch.uint8 not in dtypes)
        if chosen and "recompute" not in node.meta:  # a user's activation-checkpointing policy stands
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            marked.append(node)
    return marked


def quantized(t) -> bool:
    """Whether t is a tensor of a quantized dtype, or a tensor subclass (torchao's quantized weights)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return isinstance(t, torch.Tensor) and (t.dtype in QUANTIZED_DTYPES or is_traceable_wrapper_subclass(t))


def quantized_inputs_written(gm) -> bool:
    """Whether a Dynamo graph writes a `quantized` input in place. Such a write can reach AOTAutograd's epilogue
    instead of the joint graph (a metadata change), where the pass cannot see it: `JointGraphPasses` then leaves
    the joint graph as it is."""
    written = Mutations(gm.graph).writes
    return any(quantized(node.meta.get("example_value")) and storage(node) in written
               for node in gm.graph.find_nodes(op="placeholder"))


class JointGraphPasses(CustomGraphPass):
    """The dequantized weights marked for recomputation (option `recompute_dequantized_weights`, unless Dynamo's
    graph `gm` writes a quantized input: `quantized_inputs_written`), then the pass the user had set on the same
    hook (if any)."""

    def __init__(self, options, gm, user_pass=None):
        self.options, self.user_pass = options, user_pass
        self.recompute = options.recompute_dequantized_weights is not False and not quantized_inputs_written(gm)
        self.packed = options.recompute_dequantized_weights is True

    def __call__(self, graph: Graph) -> None:
        if self.recompute:
            marked = mark_dequantized_weights(graph, packed=self.packed)
            if marked:
                log.debug("joint graph: %d nodes of dequantized weights recomputed in the backward", len(marked))
        if self.user_pass is not None:
            self.user_pass(graph)

    def uuid(self) -> str:
        user = self.user_pass.uuid() if hasattr(self.user_pass, "uuid") else repr(self.user_pass)
        return f"fa4_inductor-joint:{source_hash()}:{self.options!r}:{self.recompute}:{user}"
