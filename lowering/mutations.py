"""In-place updates in a Dynamo graph, for rewrites that move where a tensor is read.

Dynamo keeps in-place operations as they were written, each writing into the storage of its first
argument (or of `out=`):

    m[:, :3] = True            operator.setitem(m, (slice(None), slice(None, 3)), True)
    x.add_(1), x.tril_()       call_method add_ / tril_ (any method ending in one underscore)
    x += 1                     operator.iadd(x, 1)
    torch.add(a, b, out=c)     the `out` tensor
    F.relu(x, inplace=True)    x

Example values record which tensors share a storage (views do), so an update through a view is
seen on the tensor it views. A rewrite of attention reads its inputs where the replaced output
was, and masks are proven from the graph once: `Mutations.check_reads` says whether an update of
a tensor falls between where the original code read it and where the rewrite reads it.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from .records import Decline
from .spellings import sole_update, value

_AUGMENTED = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
              operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
              operator.imatmul}


def _in_place_name(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__") and not name.startswith("_")


def written(node: Node) -> list:
    """The arguments whose storage `node` writes (empty for a node that writes nothing)."""
    if node.op not in ("call_function", "call_method"):
        return []
    out = node.kwargs.get("out")
    targets = list(out) if isinstance(out, (tuple, list)) else [out] if out is not None else []
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    first = node.args[0] if node.args else None
    in_place_name = _in_place_name(name) and getattr(target, "__module__", None) not in ("operator", "_operator")
    if target is operator.setitem or target in _AUGMENTED or in_place_name or node.kwargs.get("inplace"):
        targets += list(first) if isinstance(first, (tuple, list)) else [first]
    elif isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        targets += [a for a in node.args if isinstance(a, Node)]
    return [t for t in targets if isinstance(t, Node)]


def storage(node) -> int | None:
    """An identity of the storage behind a tensor-valued node (shared by its views), None for other values."""
    v = value(node)
    if not isinstance(v, torch.Tensor):
        return None
    try:
        return v.untyped_storage()._cdata
    except (NotImplementedError, RuntimeError):  # a tensor subclass without a storage: its node stands for it
        return id(node)


class Mutations:
    """Every in-place write of a graph, by storage, and the graph's node order."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._index()

    def _index(self) -> None:
        self.position = {n: i for i, n in enumerate(self.graph.nodes)}
        self.writes: dict[int, list[Node]] = {}
        for node in self.graph.nodes:
            for target in written(node):
                key = storage(target)
                if key is not None:
                    self.writes.setdefault(key, []).append(node)

    def _at(self, node: Node) -> int:
        if node not in self.position:  # inserted by an earlier rewrite
            self._index()
        return self.position[node]

    def writer_between(self, tensor: Node, after: Node, before: Node) -> Node | None:
        """A node that writes the storage of `tensor` strictly between `after` and `before`, if any."""
        key = storage(tensor)
        if key is None:
            return None
        lo, hi = self._at(after), self._at(before)
        return next((w for w in self.writes.get(key, ()) if lo < self._at(w) < hi), None)

    def writes_before(self, tensor: Node, before: Node) -> list[Node]:
        """The nodes that write the storage of `tensor` before `before`."""
        key = storage(tensor)
        return [w for w in self.writes.get(key, ()) if self._at(w) < self._at(before)] if key is not None else []

    def check_reads(self, reads: dict, at: Node) -> None:
        """Decline when a tensor is updated in place between where the original code reads it and `at`,
        where the rewrite reads it. `reads`: tensor node -> the node of its original read."""
        for tensor, original in reads.items():
            writer = self.writer_between(tensor, original, at)
            if writer is not None:
                raise Decline(f"{tensor.name} is updated in place ({writer.format_node()}) between its read by the "
                              "attention and the point the rewrite reads it")

    def first_reads(self, tensors, output: Node, matched) -> dict:
        """Tensor -> its earliest reader among the nodes of a matched subgraph (and what leads from the tensor
        into it: a K/V repetition), for each of `tensors`."""
        inside = set(matched) | {output}
        reads = {}
        for tensor in tensors:
            readers = [u for u in tensor.users if u in inside or _reaches(u, inside)]
            if readers:
                reads[tensor] = min(readers, key=self._at)
        return reads

    def check_mask(self, mask: Node, use: Node) -> list[Node]:
        """Decline when a tensor the mask is built from is updated in place between its definition and its
        last read on the way to `use` (the op that applies the mask): the mask's structure was proven from the
        operations that built it, which such an update bypasses. Returns the tensors the mask is built from
        (its tensor-valued ancestors)."""
        sources = tensor_ancestors(mask)
        computation = set(sources) | {use}
        for tensor in sources:
            readers = [u for u in tensor.users if u in computation and not written(u)]
            last = max(readers, key=self._at, default=use)
            writer = self.writer_between(tensor, tensor, last)
            if writer is not None and not (writer in computation and tensor in writer.args[:1] and sole_update(writer)):
                raise Decline(f"mask not recognized: {tensor.name}, which it is built from, is updated in place "
                              f"({writer.format_node()})")
        return sources

def tensor_ancestors(node: Node) -> list[Node]:
    """`node` and every tensor-valued node it is computed from (sizes read off other tensors are not followed)."""
    seen, work = {node}, [node]
    while work:
        for parent in work.pop().all_input_nodes:
            if parent not in seen and isinstance(value(parent), torch.Tensor):
                seen.add(parent)
                work.append(parent)
    return list(seen)


def _reaches(node: Node, targets: set, limit: int = 8) -> bool:
    """Whether a short chain of single-tensor ops leads from node into targets (a K/V repetition)."""
    frontier = {node}
    for _ in range(limit):
        frontier = {u for n in frontier for u in n.users}
        if frontier & targets:
            return True
        if not frontier:
            return False
    return False



_VIEWS = {"view": "reshape", "view_as": "reshape_as"}
_STRIDE_READERS = {"stride", "as_strided", "is_contiguous", "data_ptr", "storage_offset", "untyped_storage"}


def _fresh_layout(node: Node) -> bool:
    """An op whose result is laid out afresh, whatever its input's strides (the walk in `layout_free` stops)."""
    if node.op == "call_module":
        return True
    if node.op == "call_method":
        return node.target in ("contiguous", "matmul", "bmm", "__matmul__")
    return node.op == "call_function" and node.target in (torch.matmul, operator.matmul, torch.bmm,
                                                         torch.nn.functional.linear, torch._C._nn.linear)


def layout_free(out: Node, mutations: Mutations) -> bool:
    """Make what follows `out` independent of its strides, or say it cannot be: the rewritten attention stores
    its output [B, S, H, D] where eager's is contiguous [B, H, S, D], and strides flow through elementwise and
    view ops (up to a matmul, a linear or `contiguous`), so a later `.view(...)` that eager could apply may
    fail. Every `view` reached that way becomes `reshape` (the same view where one exists), which is exact
    unless that storage is also written in place (a copy would not carry the write). False when that cannot
    be done, when the code reads strides, or when such a tensor leaves the graph (the caller then makes `out`
    contiguous)."""
    views, seen, work = [], {out}, [out]
    while work:
        for user in work.pop().users:
            if user in seen or _fresh_layout(user):
                continue
            seen.add(user)
            work.append(user)
            if user.op == "output" or (user.op == "call_method" and user.target in _STRIDE_READERS):
                return False
            if user.op == "call_method" and user.target in _VIEWS and not isinstance(user.args[-1], torch.dtype):
                if mutations.writes.get(storage(user)):
                    return False
                views.append(user)
    for view in views:
        view.target = _VIEWS[view.target]
    return True
