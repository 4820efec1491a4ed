"""The rewrite passes in the order the backend runs them.

    1. attention (attention.py, with gqa.py and masks.py): SDPA calls and hand-written softmax
       attention -> `fa4::attention`, on the Dynamo torch-IR graph, before AOTAutograd, so the
       op's autograd formula serves training.

`run_torch_ir_passes` mutates the graph module in place and returns one record per candidate.
"""

from __future__ import annotations

import logging

import torch
from torch._guards import detect_fake_mode
from torch.fx import GraphModule

from .attention import rewrite_attention
from .records import Record

log = logging.getLogger("fa4_inductor.lowering")


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


def run_torch_ir_passes(gm: GraphModule, example_inputs, options) -> list[Record]:
    fake_mode = _fake_mode_of_graph(gm) or detect_fake_mode(example_inputs)
    records, read_by_value = rewrite_attention(gm, module_buffers(gm, example_inputs), options, fake_mode)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    gm.meta[READ_BY_VALUE] = [placeholders.index(n) for n in read_by_value]
    gm.graph.lint()
    gm.recompile()
    for record in records:
        log.debug("%s", record)
    return records


def _fake_mode_of_graph(gm: GraphModule):
    """The fake mode of the example values Dynamo recorded (not the tracing context's, which may differ)."""
    for node in gm.graph.nodes:
        mode = getattr(node.meta.get("example_value"), "fake_mode", None)
        if mode is not None:
            return mode
    return None
