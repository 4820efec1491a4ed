"""`fa4::nvfp4_linear` calls of one x -> one `fa4::nvfp4_sibling_linears`, on Inductor's aten graphs (POST_GRAD),
after the families have rewritten the linears (`passes.GROUPINGS`).

    x2d = view(x, [M, K])                                    (one view node or one per call, as AOTAutograd wrote it)
    nvfp4_linear(x2d, w_q, block_q, global_q, bias_q [, scale_layout=L])
    nvfp4_linear(x2d, w_k, block_k, global_k, bias_k [, scale_layout=L])
    nvfp4_linear(x2d, w_v, block_v, global_v, bias_v [, scale_layout=L])
    becomes  outs = nvfp4_sibling_linears(x2d, [w_q, w_k, w_v], [block_q, ...], [global_q, ...], [bias_q, ...],
                                          scale_layout=L);  outs[0], outs[1], outs[2] in the three calls' places

A decoder layer's q / k / v projections read its first norm's output, gate / up its second's: one launch instead of
several at decode (`kernels/nvfp4_sibling_linears.py`). Calls group by the x they read (the same node, or views of
one node to one shape) and their scale layout, up to three a group in graph order; W4A4 calls
(`quantize_activations`) stay as they are. The group takes the place of its last call and the graph is sorted
again, so that what read an earlier call's output comes after it.
"""

from __future__ import annotations

import operator

import torch
from torch._inductor.pattern_matcher import stable_topological_sort
from torch.fx import Node

from ..kernels import NVFP4_LINEAR, NVFP4_SIBLING_LINEARS
from ..kernels.nvfp4_sibling_linears import MAX_WEIGHTS
from .family import POST_GRAD, Context, Family
from .graph_edit import NodeMaker, erase_dead
from .spellings import shape

aten = torch.ops.aten
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _groupable(node: Node) -> bool:
    return node.op == "call_function" and node.target is NVFP4_LINEAR and \
        not node.kwargs.get("quantize_activations", False)


def _source(x: Node) -> tuple:
    """What x reads: (node, shape) through one view, so that views of one tensor to one shape count as one x. The
    shape as text: symbolic sizes compare by their expressions, with no guard."""
    dims = tuple(str(d) for d in shape(x))
    if x.op == "call_function" and x.target in VIEWS and isinstance(x.args[0], Node):
        return x.args[0], dims
    return x, dims


def siblings(node: Node) -> list[Node]:
    """The groupable `fa4::nvfp4_linear` calls that read node's x with node's scale layout, in graph order (node
    among them)."""
    x = node.args[0]
    base, _ = _source(x)
    readers = [x] if base is x else [v for v in base.users if _source(v) == _source(x)] + [x]
    layout = node.kwargs.get("scale_layout", "rowmajor")
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    calls = {u for r in readers for u in r.users
             if _groupable(u) and u.args[0] is r and u.kwargs.get("scale_layout", "rowmajor") == layout}
    return sorted(calls, key=order.__getitem__)


def is_candidate(node: Node) -> bool:
    return _groupable(node) and len(siblings(node)) > 1


def rewrite(node: Node, context: Context) -> str | None:
    group = siblings(node)[:MAX_WEIGHTS]
    if node is not group[0]:
        return None  # an earlier call's group takes it
    graph = context.gm.graph
    sizes = ", ".join("x".join(str(s) for s in shape(call.args[1])) for call in group)
    record = f"fa4.nvfp4_sibling_linears(x[{'x'.join(str(s) for s in shape(node.args[0]))}], {len(group)} weights: {sizes})"
    last = group[-1]
    operands = [list(call.args) + [None] * (5 - len(call.args)) for call in group]
    with graph.inserting_before(last):
        make = NodeMaker(graph, last, context.fake_mode)
        layout = {"scale_layout": node.kwargs["scale_layout"]} if "scale_layout" in node.kwargs else {}
        outs = make(NVFP4_SIBLING_LINEARS, node.args[0], *([o[i] for o in operands] for i in range(1, 5)), **layout)
        for i, call in enumerate(group):
            call.replace_all_uses_with(make(operator.getitem, outs, i, name=f"{call.name}_sibling"))
    erase_dead(graph, group)
    stable_topological_sort(graph)
    return record


FAMILY = Family("nvfp4_sibling_linears", POST_GRAD, is_candidate, rewrite)
