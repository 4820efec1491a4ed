"""Masks built by `torch.vmap` over index functions, written as the broadcasting they compute.

transformers 4.53 to 4.57 build every mask by vmapping a mask function of (batch, head, q, kv) indices over four
index vectors (transformers 5 still does for custom mask functions, such as Gemma 3's image tokens). Dynamo records
the vmap as functorch's batching calls around the function's per-index body:

    _vmap_increment_nesting(B); b = _add_batch_dim(batch_arange, 0, 1)       one level per index vector,
    ...                         kv = _add_batch_dim(kv_arange, 0, 4)          outermost first
    visible = (kv <= q) & (aten.index(padding_mask, [b, kv]) ...)           0-d per index tuple
    m = _remove_batch_dim(visible, 4, Sk, 0); ... ; mask = _remove_batch_dim(m, 1, B, 0)

With every index vector 1-D and every value in the body 0-d per index tuple, the vmap computes the body on the index
vectors broadcast against each other, level l on dim l - 1 (what transformers 5 writes without vmap):

    b = batch_arange[:, None, None, None]; ...; kv = kv_arange[None, None, None, :]
    visible = (kv <= q) & padding_mask[b, kv]
    mask = visible.expand(B, 1, Sq, Sk).contiguous()

`unvmap` rewrites each such region so; the mask proofs (masks.py) then read it as they read transformers 5's masks.
A region with any other call (a batched tensor of more than one element, a reduction, an op not known to act
elementwise) is left as it is.
"""

from __future__ import annotations

import operator

import torch
from torch._functorch import predispatch
from torch.fx import GraphModule, Node

from .graph_edit import NodeMaker
from .spellings import value

_MACHINERY = {predispatch._vmap_increment_nesting, predispatch._vmap_decrement_nesting,
              predispatch.lazy_load_decompositions}

_ELEMENTWISE_FUNCTIONS = {
    operator.le, operator.lt, operator.ge, operator.gt, operator.eq, operator.ne, operator.and_, operator.or_,
    operator.xor, operator.invert, operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
    operator.neg, torch.le, torch.lt, torch.ge, torch.gt, torch.eq, torch.ne, torch.logical_and, torch.logical_or,
    torch.logical_not, torch.logical_xor, torch.bitwise_and, torch.bitwise_or, torch.bitwise_not, torch.where,
    torch.abs, torch.add, torch.sub, torch.mul, torch.floor_divide, torch.remainder}
_ELEMENTWISE_METHODS = {
    "le", "lt", "ge", "gt", "eq", "ne", "__le__", "__lt__", "__ge__", "__gt__", "__eq__", "__ne__", "__and__",
    "__or__", "__xor__", "__invert__", "__rand__", "__ror__", "logical_and", "logical_or", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_not", "add", "sub", "mul", "__add__", "__sub__", "__mul__", "__radd__",
    "__rsub__", "__rmul__", "__floordiv__", "__mod__", "floor_divide", "remainder", "abs", "__neg__", "neg", "bool",
    "long", "int", "to"}
_SCALAR_FACTORIES = {"new_ones", "new_zeros", "new_full"}
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index, operator.getitem}  # t[b, kv]; transformers' vmap
# writes it as aten.index (its `TransformGetItemToIndex`)


def unvmap(gm: GraphModule, fake_mode) -> int:
    """Rewrite every vmapped index-function region of the graph as broadcasting; returns how many were."""
    rewritten = 0
    for region in _regions(gm):
        if _rewrite(gm, region, fake_mode):
            rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _regions(gm: GraphModule) -> list[list[Node]]:
    """The nodes of each outermost vmap nesting, in graph order, from its first increment to its last decrement."""
    regions, current, depth = [], None, 0
    for node in gm.graph.nodes:
        if node.target is predispatch._vmap_increment_nesting:
            if depth == 0:
                current = []
            depth += 1
        if current is not None:
            current.append(node)
        if node.target is predispatch._vmap_decrement_nesting:
            depth -= 1
            if depth == 0:
                regions.append(current)
                current = None
            elif depth < 0:
                return []
    return regions


def _rewrite(gm: GraphModule, region: list[Node], fake_mode) -> bool:
    adds = [n for n in region if n.target is predispatch._add_batch_dim]
    removes = [n for n in region if n.target is predispatch._remove_batch_dim]
    levels = sorted(n.args[1] for n in removes)
    depth = sum(n.target is predispatch._vmap_increment_nesting for n in region)
    if not removes or len(levels) != depth or levels != list(range(levels[0], levels[0] + depth)):
        return False
    dim = {level: i for i, level in enumerate(levels)}
    # The removes run innermost first, each over the previous one's result, each moving its level to dim 0.
    chain = sorted(removes, key=lambda n: -n.args[1])
    if any(n.args[3] != 0 for n in chain) or any(b.args[0] is not a or len(a.users) != 1
                                                   for a, b in zip(chain, chain[1:])):
        return False
    if any(n.args[1] != 0 or n.args[2] not in dim or not _vector(n.args[0]) for n in adds):
        return False
    members = set(region)
    body = [n for n in region if n.target not in _MACHINERY and n.target is not predispatch._add_batch_dim
            and n.target is not predispatch._remove_batch_dim]
    batched = set(adds)
    for node in body:
        if not _per_index(node, batched):
            return False
        if any(a in batched for a in node.all_input_nodes):
            batched.add(node)
    if any(u not in members for n in body for u in n.users) or chain[0].args[0] not in batched:
        return False

    out = chain[-1]
    make = NodeMaker(gm.graph, out, fake_mode)
    new: dict[Node, Node] = {}
    for add in adds:
        where = [None] * depth
        where[dim[add.args[2]]] = slice(None)
        with gm.graph.inserting_before(add):
            new[add] = make(operator.getitem, add.args[0], tuple(where))
    with gm.graph.inserting_before(out):
        for node in body:
            args = torch.fx.node.map_arg(node.args, lambda a: new.get(a, a))
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: new.get(a, a))
            if node.target in _INDEXING:
                new[node] = make(operator.getitem, args[0], tuple(args[1]))
            else:
                new[node] = make(node.target, *args, **kwargs)
        sizes = [n.args[2] for n in reversed(chain)]
        mask = make("contiguous", make("expand", new[chain[0].args[0]], *sizes))
    out.replace_all_uses_with(mask)
    for node in reversed(region):
        if not node.users:
            gm.graph.erase_node(node)
    return True


def _vector(node) -> bool:
    v = value(node) if isinstance(node, Node) else None
    return isinstance(v, torch.Tensor) and v.dim() == 1


def _per_index(node: Node, batched: set) -> bool:
    """Whether `node` computes, per index tuple, what it computes on the broadcast index vectors: an elementwise op
    of 0-d values, a 0-d constant (`x.new_ones(())`), or a tensor indexed by one index tensor per dim (`t[b, kv]`,
    t not batched)."""
    if node.op == "call_method" and node.target in _SCALAR_FACTORIES:
        return tuple(node.args[1]) == () if len(node.args) > 1 else False
    if node.op == "call_function" and node.target in _INDEXING:
        table, indices = node.args[0], node.args[1]
        v = value(table)
        return table not in batched and isinstance(v, torch.Tensor) and isinstance(indices, (list, tuple)) \
            and len(indices) == v.dim() and all(isinstance(i, Node) for i in indices)
    elementwise = node.target in _ELEMENTWISE_FUNCTIONS if node.op == "call_function" else \
        node.target in _ELEMENTWISE_METHODS if node.op == "call_method" else False
    if not elementwise:
        return False
    for a in node.all_input_nodes:  # tensors that are not batched must be 0-d to broadcast as they did per index
        v = value(a)
        if a not in batched and isinstance(v, torch.Tensor) and v.dim() != 0:
            return False
    if node.op == "call_method" and node.target == "to":
        return all(isinstance(a, (torch.device, torch.dtype, str)) for a in node.args[1:]) and \
            set(node.kwargs) <= {"device", "dtype"}
    return True
