"""Quantized linear calls of one x -> one sibling-linears op, on Inductor's aten graphs (POST_GRAD), after the
families have rewritten the linears (`passes.GROUPINGS`).

    x2d = view(x, [M, K])                                    (one view node or one per call, as AOTAutograd wrote it)
    nvfp4_linear(x2d, w_q, block_q, global_q, bias_q [, scale_layout=L])
    nvfp4_linear(x2d, w_k, block_k, global_k, bias_k [, scale_layout=L])
    nvfp4_linear(x2d, w_v, block_v, global_v, bias_v [, scale_layout=L])
    becomes  outs = nvfp4_sibling_linears(x2d, [w_q, w_k, w_v], [block_q, ...], [global_q, ...], [bias_q, ...],
                                          scale_layout=L);  outs[0], outs[1], outs[2] in the three calls' places

    int8_linear(x2d, w, scale, bias [, group_size=G, scale_after_matmul=A])   (2 or 3 of them)
    becomes  int8_sibling_linears(x2d, [w, ...], [scale, ...], [bias, ...], group_size=G, scale_after_matmul=A)

A decoder layer's q / k / v projections read its first norm's output, gate / up its second's: one launch instead of
several at decode (`kernels/nvfp4_sibling_linears.py`, `kernels/int8_sibling_linears.py`). Calls of one op group by
the x they read (the same node, or views of one node to one shape) and their keyword arguments, up to three a group
in graph order; W4A4 NVFP4 calls (`quantize_activations`) stay as they are. The group takes the place of its last
call and the graph is sorted again, so that what read an earlier call's output comes after it.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch._inductor.pattern_matcher import stable_topological_sort
from torch.fx import Node

from ..kernels import INT8_LINEAR, INT8_SIBLING_LINEARS, NVFP4_LINEAR, NVFP4_SIBLING_LINEARS
from ..kernels.library import MAX_SIBLINGS
from .family import POST_GRAD, Context, Family
from .graph_edit import NodeMaker, erase_dead
from .spellings import shape, value

aten = torch.ops.aten
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


class Siblings(NamedTuple):
    """How one linear op's calls group: the op they become, how many operands follow x (the trailing ones may be
    left out as None), the keyword arguments every call of a group shares, and what keeps a call out."""

    op: object
    operands: int
    kwargs: tuple[str, ...]
    excluded: tuple[str, ...] = ()


SIBLINGS = {NVFP4_LINEAR: Siblings(NVFP4_SIBLING_LINEARS, 4, ("scale_layout",), ("quantize_activations",)),
            INT8_LINEAR: Siblings(INT8_SIBLING_LINEARS, 3, ("group_size", "scale_after_matmul"))}


def _groupable(node: Node) -> bool:
    spec = SIBLINGS.get(node.target) if node.op == "call_function" else None
    return spec is not None and not any(node.kwargs.get(k, False) for k in spec.excluded)


def _source(x: Node) -> tuple:
    """What x reads: (node, shape) through one view, so that views of one tensor to one shape count as one x. The
    shape as text: symbolic sizes compare by their expressions, with no guard."""
    dims = tuple(str(d) for d in shape(x))
    if x.op == "call_function" and x.target in VIEWS and isinstance(x.args[0], Node):
        return x.args[0], dims
    return x, dims


def _flags(node: Node) -> dict:
    return {k: node.kwargs[k] for k in SIBLINGS[node.target].kwargs if k in node.kwargs}


def _siblings(node: Node) -> set[Node]:
    """The groupable calls of node's op that read node's x with node's keyword arguments (node among them)."""
    x = node.args[0]
    source = _source(x)
    readers = [x] if source[0] is x else [v for v in source[0].users
                                          if isinstance(value(v), torch.Tensor) and _source(v) == source]
    return {u for r in readers for u in r.users
            if u.target is node.target and _groupable(u) and u.args[0] is r and _flags(u) == _flags(node)}


def is_candidate(node: Node) -> bool:
    return _groupable(node) and len(_siblings(node)) > 1


def rewrite(node: Node, context: Context) -> str | None:
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    group = sorted(_siblings(node), key=order.__getitem__)[:MAX_SIBLINGS]
    if node is not group[0]:
        return None  # an earlier call's group takes it
    spec = SIBLINGS[node.target]
    graph = context.gm.graph
    sizes = ", ".join("x".join(str(s) for s in shape(call.args[1])) for call in group)
    record = (f"fa4.{spec.op._opname}(x[{'x'.join(str(s) for s in shape(node.args[0]))}], "
              f"{len(group)} weights: {sizes})")
    operands = [list(call.args[1:]) + [None] * (spec.operands - len(call.args) + 1) for call in group]
    last = group[-1]
    with graph.inserting_before(last):
        make = NodeMaker(graph, last, context.fake_mode)
        outs = make(spec.op, node.args[0], *([o[i] for o in operands] for i in range(spec.operands)), **_flags(node))
        for i, call in enumerate(group):
            call.replace_all_uses_with(make(operator.getitem, outs, i, name=f"{call.name}_sibling"))
    erase_dead(graph, group)
    stable_topological_sort(graph)
    return record


FAMILY = Family("sibling_linears", POST_GRAD, is_candidate, rewrite)
