"""Tensor-subclass weights (torchao's quantized tensors) handed to the compiled graph as their inner tensors.

Dynamo passes a module's parameters to the compiled graph on every call, and AOTAutograd unwraps each tensor subclass
among them through the subclass's `__tensor_flatten__` (and, for torchao's, its `__torch_function__` on `size()` and
`stride()`) around every call, in Python before torch 2.13: two thirds of the profiled host time of a host-bound fp8
decode step over 112 torchao linears (H100, torch 2.11, docs/benchmarks.md session 52). This rewrite makes the graph
take each such weight's inner tensors instead and rebuild the subclass inside the graph, where AOTAutograd traces
through it at compile time; the aten graph is the one AOTAutograd's own unwrapping produces. At run time
`InnerTensorArgs.expand` reads the inner tensors by attribute name.

    w: Float8Tensor (placeholder)           w.qdata, w.scale (placeholders)
    linear(x, w)                   ->       w' = rebuild_Float8Tensor(w.qdata, w.scale)
                                            linear(x, w')

Taken: static inputs (parameters and buffers, Dynamo's `_dynamo_static_input_type`) that need no gradient, whose
inner tensors are plain tensors with static shapes, and that the graph does not write in place. Dynamo's
guards on each subclass's metadata (`__tensor_flatten__`'s context, sizes, strides) hold for every call this graph
serves, so the context read at compile time is the one every call's weight has.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional, Sequence

import torch
from torch.fx import GraphModule, Node
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .graph_edit import copy_of_dynamo_graph
from .mutations import written


class InnerTensorArgs:
    """How a call's arguments become the rewritten graph's: the argument at each position of `inner_names` gives
    way to its attributes of those names, in order; the others pass as they are."""

    def __init__(self, inner_names: dict[int, tuple[str, ...]], count: int):
        self.inner_names = inner_names
        self._getters = [operator.attrgetter(*inner_names[i]) if i in inner_names else None for i in range(count)]

    def expand(self, args: Sequence[Any]) -> list:
        out: list = []
        for arg, get in zip(args, self._getters):
            if get is None:
                out.append(arg)
            else:
                inner = get(arg)
                out.extend(inner) if isinstance(inner, tuple) else out.append(inner)
        return out


def _rebuilder(t: torch.Tensor, names: tuple[str, ...]) -> Callable[..., torch.Tensor]:
    """A function of t's inner tensors (in `names` order) that builds a tensor of t's subclass with t's metadata."""
    cls, (_, context), size, stride = type(t), t.__tensor_flatten__(), tuple(t.shape), tuple(t.stride())

    def rebuild(*inner: torch.Tensor) -> torch.Tensor:
        return cls.__tensor_unflatten__(dict(zip(names, inner)), context, size, stride)

    rebuild.__name__ = rebuild.__qualname__ = f"rebuild_{cls.__name__}"
    return rebuild


def _static_shape(t: torch.Tensor) -> bool:
    return not any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))


def _unwrappable(node: Node, t: Any) -> Optional[tuple[str, ...]]:
    """The inner tensors' attribute names of a subclass weight this rewrite takes, else None. Shapes are read from
    Dynamo's fake value, which is symbolic where the compiled graph takes any size."""
    fake = node.meta.get("example_value")
    if not (is_traceable_wrapper_subclass(t) and not t.requires_grad and fake is not None
            and node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")
            and getattr(node, "_dynamo_source", None) is not None):
        return None
    names, _ = t.__tensor_flatten__()
    if not names or any(type(getattr(t, name)) not in (torch.Tensor, torch.nn.Parameter) for name in names):
        return None
    if not _static_shape(fake) or not all(_static_shape(getattr(fake, name)) for name in names):
        return None
    if any(written(user) for user in node.users):  # an in-place method, `+=`, `out=` or `inplace=True` on it
        return None
    return tuple(names)


def take_inner_tensors(gm: GraphModule, example_inputs: Sequence[Any]
                       ) -> Optional[tuple[GraphModule, list, InnerTensorArgs]]:
    """A copy of gm that takes its subclass weights' inner tensors (module docstring), its example inputs, and how
    to expand a call's arguments for it; None where no input qualifies."""
    from torch._dynamo.source import AttrSource

    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(example_inputs):
        return None
    taken = {i: names for i, (node, t) in enumerate(zip(placeholders, example_inputs))
             if (names := _unwrappable(node, t)) is not None}
    if not taken:
        return None
    gm = copy_of_dynamo_graph(gm)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    inputs: list = []
    for i, (node, t) in enumerate(zip(placeholders, example_inputs)):
        names = taken.get(i)
        if names is None:
            inputs.append(t)
            continue
        fake = node.meta.get("example_value")
        inner_nodes = []
        with gm.graph.inserting_before(node):
            for name in names:
                inner = gm.graph.placeholder(f"{node.name}_{name}")
                inner._dynamo_source = AttrSource(node._dynamo_source, name)
                inner.meta["tensor_dict"] = dict(node.meta["tensor_dict"])
                inner.meta["example_value"] = getattr(fake, name)
                inner_nodes.append(inner)
                inputs.append(getattr(t, name))
        with gm.graph.inserting_before(first_op):
            rebuilt = gm.graph.call_function(_rebuilder(t, names), tuple(inner_nodes))
        rebuilt.meta.update({k: v for k, v in node.meta.items() if k in ("example_value", "val", "stack_trace")})
        node.replace_all_uses_with(rebuilt)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm, inputs, InnerTensorArgs(taken, len(example_inputs))
