"""Mask subgraphs proven to be causal / sliding-window bands, by abstract interpretation.

Attention masks arrive as small subgraphs of constants and sizes: `torch.tril(torch.ones(T, T))`,
a `tril` buffer sliced `[:, :, :T, :T]` and compared `== 0`, `torch.full((T, T), -inf).triu(1)`, ...
`evaluate` runs such a subgraph on an abstract value, `TwoValued(band, inside, outside)`: a
[..., R, C] tensor equal to `inside` where `lo <= j - i <= hi` and to `outside` elsewhere. Every op
it understands maps two-valued bands to two-valued bands; anything else (a mask that is a graph
input, an index it cannot follow, ...) raises `MaskNotUnderstood` with the reason, and the attention
stays as written. Nothing is guessed from sample values, with one exception: a mask read from a
module buffer is read by value at compile time (nanoGPT's `bias`), which assumes the buffer is not
modified afterwards.

Positions (`Position`) are `arange(n) + offset` or `arange(start, end)` laid along the query or key
axis, also read back through a table of positions (`table[b, q_idx]`, HF without a cache). Tensors
that hold one value everywhere are followed through comparisons, `diff`, `cumsum` and indexing: HF's
packed-sequence ids `cumsum(diff(position_ids) != 1)` of in-graph positions are all 0. Positions or
ids computed from a graph input (explicit `position_ids`) are data, and the mask stays as written.

Two kinds of run-time data are followed exactly, and become `fa4::attention` inputs:

    positions  `arange(Sq) + start` (start: a 0-d tensor or SymInt, HF's cache position) compared with
               key positions, or a band buffer's rows picked by `input_pos` (gpt-fast): a band that
               moves by start at run time (`Band.shift`, `Shift`; kv_cache.py): seqused_k
    key masks  `m[arange(B)[:, None, None, None], kv_positions]` or `m[:, None, None, :]` of a [B, L]
               tensor m (an `attention_mask`), or a boolean [B, 1, 1, Sk] graph input (HF `generate`
               hands decode steps one): visible keys per sequence (`Band.keys`, `KeyMask`; padding.py):
               the op's key_mask; a boolean [B, 1, Sq, Sk] graph input (HF's static-cache prefill mask):
               visible keys per query row, the op's [B, Sq, Sk] key_mask

The use site turns the value into the set of visible keys (`keep_band`):

    scores.masked_fill(M, fill)      keep where M is False       (fill: -inf or finfo.min)
    torch.where(C, scores, fill)     keep where C is True
    scores + A                       keep where A == 0, A elsewhere -inf or finfo.min
    SDPA attn_mask=M                 bool: keep where True; float: as `scores + M`

and `band_args` into `fa4::attention` flags (the band must contain the diagonal; on square scores
top-left and bottom-right alignment agree, otherwise attention.py adds seqused_k to align them).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import guard_or_false

from .records import Decline
from .spellings import (ADD, AND, ARANGE, CAST, EQ, EXPAND, FULL, GE, GETITEM, GT, HIDING_FILL, IN_PLACE_ADD,
                        IN_PLACE_MUL, IN_PLACE_SUB, LE, LOGICAL_NOT, LT, MASKED_FILL, MUL, NE, ONES, RESHAPE,
                        SAME_VALUES, SUB, TENSOR, TRIL, TRIU, UNSQUEEZE, WHERE, ZEROS, Spelling, arg, describe_node,
                        equal_size, hides_keys, is_large_negative, normalize_dim, number, same_size, scalar, shape,
                        sole_update, value)

INF = math.inf
DIFF = Spelling((torch.diff,), ("diff",))
CUMSUM = Spelling((torch.cumsum,), ("cumsum",))
FLOOR_DIVIDE = Spelling((operator.floordiv, torch.floor_divide), ("floor_divide", "__floordiv__"))
ABS = Spelling((torch.abs, operator.abs), ("abs", "__abs__"))


class MaskNotUnderstood(Exception):
    """A mask whose structure cannot be proven from the graph; the message is the reason."""


class ValuesUnknown(MaskNotUnderstood):
    """The mask is a floating-point graph input (`node`): nothing about its values is known when compiling (HF's
    eager-code mask built outside the forward: static-cache generate, Gemma-2's hybrid cache)."""

    def __init__(self, message: str, node: Node):
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class Outside:
    """A region body's input computed in the enclosing graph (a `torch.utils.checkpoint` region's operand: HF's
    mask, built before the checkpointed layer): `node` there, with that graph's module buffers, in-place updates
    (a `mutations.Mutations`) and the region's node, which reads it."""

    node: Node
    constants: dict
    mutations: object
    region: Node


class BodyConstants(dict):
    """`constants` of a region body: its module buffers, and in `outside` its inputs computed in the enclosing graph
    (placeholder -> `Outside`), which `evaluate` follows there when they are pure structure."""

    def __init__(self, buffers: dict, outside: dict):
        super().__init__(buffers)
        self.outside = outside


@dataclass(frozen=True)
class Shift:
    """Positions known only at run time: query row i sits at `node + i`, key slot j at `minus + j`.

    `node` is a 0-d integer tensor or SymInt (`arange(Sq) + start`, HF's cache position), or, with
    `vector`, a 1-D tensor of positions (gpt-fast's `input_pos`) that is `input_pos[0] + arange(Sq)` only
    if a run-time check says so (kv_cache.py emits it); None is position 0. `minus`: the position of key
    slot 0 (HF's sliding-window cache), None for 0. `top`: the band's upper bound, set by attention.py
    (query i sees slots up to node - minus + i + top)."""

    node: Node | None
    vector: bool = False
    minus: Node | None = None
    top: int = 0


@dataclass(frozen=True)
class KeyMask:
    """A [B, L] run-time tensor of visible key positions (an `attention_mask`): key slot j is visible in
    sequence b when node[b, start + j] != 0; `start` is a key offset (HF's sliding-window cache: an int, or a
    SymInt under dynamic shapes) or None.
    `plane`: node is a boolean [B, 1, 1, L] graph input, read as node[:, 0, 0, :]; with `per_query`, a boolean
    [B, 1, Sq, Sk] one (HF's prefill mask built outside the forward), read as node[:, 0]: key j visible to query
    row i of sequence b when node[b, 0, i, j]. `additive`: node is a float mask as the scores add it (4-D, one for
    every head), its values added to the op's scores; with `rebased`, each row less its largest value first
    (`kernels.key_mask.rebased_additive_mask`: not under an attention sink, whose logit the op's lse meets)."""

    node: Node
    start: Node | int | None = None
    plane: bool = False
    per_query: bool = False
    additive: bool = False
    rebased: bool = False


@dataclass(frozen=True)
class Band:
    """The (b, i, j) with lo + s <= j - i <= hi + s and, with `keys`, key j visible in sequence b.

    s is 0, or the run-time start of the query positions with `shift` (decode with a KV cache);
    `keys` is a tensor of visible keys known only at run time (a padding mask)."""

    lo: float = -INF
    hi: float = INF
    shift: Shift | None = None
    keys: KeyMask | None = None

    def __post_init__(self):
        if not self.bounded:
            object.__setattr__(self, "shift", None)

    @property
    def bounded(self) -> bool:
        return self.lo != -INF or self.hi != INF

    def __and__(self, other: "Band") -> "Band":
        if self.bounded and other.bounded and self.shift != other.shift:
            raise MaskNotUnderstood("a band at run-time query positions combined with one at fixed positions")
        if self.keys is not None and other.keys is not None and self.keys != other.keys:
            raise MaskNotUnderstood("two different key-padding masks combined")
        return Band(max(self.lo, other.lo), min(self.hi, other.hi), self.shift or other.shift,
                    self.keys if self.keys is not None else other.keys)

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def complement(self) -> "Band":
        if self.keys is not None:
            raise MaskNotUnderstood(f"the complement of the key-padding mask {self.keys.node.name}")
        if self.empty:
            return Band()
        if not self.bounded:
            return Band(1, 0)
        if self.lo == -INF:
            return Band(self.hi + 1, INF, self.shift)
        if self.hi == INF:
            return Band(-INF, self.lo - 1, self.shift)
        raise MaskNotUnderstood(f"the complement of the band {self.lo} <= j - i <= {self.hi} is two bands")


ALL = Band()


@dataclass(frozen=True)
class TwoValued:
    band: Band
    inside: object
    outside: object

    def map(self, fn) -> "TwoValued":
        return TwoValued(self.band, fn(self.inside), fn(self.outside))

    def where(self, predicate) -> Band:
        """The band of positions whose value satisfies predicate."""
        pin, pout = bool(predicate(self.inside)), bool(predicate(self.outside))
        if pin and pout:
            return ALL
        if pin:
            return self.band
        if pout:
            return self.band.complement()
        return Band(1, 0)

    @property
    def uniform(self) -> bool:
        return self.band == ALL or self.inside == self.outside

    @property
    def boolean(self) -> bool:
        return isinstance(self.inside, bool) and isinstance(self.outside, bool)


@dataclass(frozen=True)
class Position:
    """`arange(n) + offset (+ start)` laid along the query axis (-2: value i + offset) or the key axis
    (-1: j + offset); axis None while it is still 1-D. `start`: a 0-d integer tensor added at run time."""

    offset: int
    axis: int | None = None
    start: Node | None = None


def _compare(node: Node, a: Position, b: Position, op: str | None = None) -> TwoValued:
    """a OP b for positions on different axes, as a band in j - i (OP: the node's comparison unless given). A 1-D
    position against one on the query axis broadcasts along the key axis (`arange(Sk) > cache_position[:, None]`)."""
    if a.axis is None and b.axis == -2:
        a = Position(a.offset, -1, a.start)
    if b.axis is None and a.axis == -2:
        b = Position(b.offset, -1, b.start)
    if a.axis is None or b.axis is None or a.axis == b.axis:
        raise MaskNotUnderstood(f"{describe_node(node)} compares positions not laid along the query and key axes")
    op = op or _comparison(node)
    if a.axis == -2:  # make it key OP query
        a, b, op = b, a, _FLIPPED[op]
    if _position_vector(a.start):
        raise MaskNotUnderstood(f"{describe_node(node)} compares key positions read from {a.start.name}")
    d = b.offset - a.offset  # j + a.offset (+ a.start) OP i + b.offset (+ b.start)  <=>  j - i OP d (+ shift)
    shift = Shift(b.start, vector=_position_vector(b.start), minus=a.start) \
        if b.start is not None or a.start is not None else None
    return TwoValued(Band(*_bounds(op, d), shift), True, False)


_FLIPPED = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt", "eq": "eq"}


def _bounds(op: str, d: int) -> tuple[float, float]:
    """(lo, hi) of the integers x with x OP d."""
    return {"le": (-INF, d), "lt": (-INF, d - 1), "ge": (d, INF), "gt": (d + 1, INF), "eq": (d, d)}[op]


@dataclass(frozen=True)
class Distance:
    """`a - b` of positions on the query and key axes (either way round), or its absolute value (`absolute`): HF's
    bidirectional sliding window `abs(q_idx - kv_idx) <= w` (ModernBERT)."""

    a: Position
    b: Position
    absolute: bool = False


def _distance(node, constants) -> Distance | None:
    """The distance a node computes, None if it is not one (run-time starts are not followed)."""
    if not isinstance(node, Node):
        return None
    if ABS(node):
        inner = _distance(node.args[0], constants)
        return None if inner is None or inner.absolute else Distance(inner.a, inner.b, True)
    if not SUB(node) or not all(isinstance(x, Node) for x in node.args[:2]):
        return None
    a, b = (_position(x, constants) for x in node.args[:2])
    if a is None or b is None or a.start is not None or b.start is not None or None in (a.axis, b.axis) or \
            a.axis == b.axis:
        return None
    return Distance(a, b)


def _compare_distance(node: Node, dist: Distance, c: float, distance_first: bool) -> TwoValued:
    """`a - b OP c` (c an integer) as `a OP b + c` (`_compare`); `|a - b| <= c` (or < c) as the band where both
    `a <= b + c` and `a >= b - c` hold."""
    op = _comparison(node) if distance_first else _FLIPPED[_comparison(node)]
    if c != int(c):
        raise MaskNotUnderstood(f"{describe_node(node)} compares a position distance with {c}, not an integer")
    c = int(c)

    def b_plus(k: int) -> Position:
        return Position(dist.b.offset + k, dist.b.axis)

    if not dist.absolute:
        return _compare(node, dist.a, b_plus(c), op)
    if op not in ("le", "lt"):
        raise MaskNotUnderstood(f"{describe_node(node)} keeps positions outside a band ({op} on a distance)")
    reach = c if op == "le" else c - 1
    within = _compare(node, dist.a, b_plus(reach), "le").band & _compare(node, dist.a, b_plus(-reach), "ge").band
    return TwoValued(within, True, False)


def _comparison(node: Node) -> str:
    return next(name for name, spelled in (("le", LE), ("lt", LT), ("ge", GE), ("gt", GT), ("eq", EQ)) if spelled(node))


def _compare_to_constant(node: Node, p: Position, c: float, position_first: bool) -> TwoValued:
    """`position OP c` that holds at every position (HF's `q_idx >= 0`): a uniform True."""
    op = _comparison(node) if position_first else _FLIPPED[_comparison(node)]
    if p.start is None and op in ("ge", "gt") and (p.offset > c if op == "gt" else p.offset >= c):
        return _uniform(True)
    raise MaskNotUnderstood(f"{describe_node(node)} compares positions with the constant {c}")


def _adds(node: Node) -> bool:
    """`a + b`, or `a += b` where nothing else reads a (transformers 4's `kv_arange += kv_offset`)."""
    return ADD(node) or IN_PLACE_ADD(node) and sole_update(node)


def _subtracts(node: Node) -> bool:
    return SUB(node) or IN_PLACE_SUB(node) and sole_update(node)


def _position(node, constants) -> Position | None:
    """The position vector a node computes, None if it is not one."""
    if not isinstance(node, Node):
        return None
    if ARANGE(node):
        return _arange(node)
    if _position_vector(node):
        return Position(0, None, node)
    if (_adds(node) or _subtracts(node)) and scalar(node.args[1]) is not None:
        inner = _position(node.args[0], constants)
        c = scalar(node.args[1])
        if inner is None or c != int(c):
            return None
        return Position(inner.offset + int(c) * (1 if _adds(node) else -1), inner.axis, inner.start)
    if _adds(node) and all(isinstance(a, Node) for a in node.args[:2]):
        for a, b in (node.args[:2], node.args[1::-1]):
            if IN_PLACE_ADD(node) and a is not node.args[0]:
                continue  # `b += positions` keeps b's dtype and shape: not read as positions
            inner = _position(a, constants)
            if inner is not None and inner.axis is None and inner.start is None and _integer_scalar(b):
                return Position(inner.offset, None, b)
    if (_adds(node) or _subtracts(node)) and all(isinstance(a, Node) for a in node.args[:2]):
        return _shifted_by_constant(node, constants)
    if GETITEM(node) and (gathered := _gathered_position(node, constants)) is not None:
        return gathered
    if RESHAPE(node) and isinstance(node.args[0], Node):  # `cache_position.reshape(-1, 1)` (transformers 4)
        inner = _position(node.args[0], constants)
        out = shape(node)
        sized = [d for d, n in enumerate(out) if not same_size(n, 1)]
        if not sized:  # one position (a decode step): the dim the reshape sizes by -1
            sized = [d for d, n in enumerate(node.args[1] if isinstance(node.args[1], (tuple, list))
                                             else node.args[1:]) if n == -1]
        if inner is None or inner.axis is not None or len(sized) != 1 or sized[0] - len(out) not in (-1, -2):
            return None
        return Position(inner.offset, sized[0] - len(out), inner.start)
    if GETITEM(node) or UNSQUEEZE(node) or EXPAND(node):
        inner = _position(node.args[0], constants)
        if inner is None:
            return None
        if inner.axis is None:
            return None if EXPAND(node) else _placed(node, inner)
        if EXPAND(node):
            return inner if _keeps_axis(node, node.args[0], inner.axis) else None
        leading_only = not GETITEM(node) or _top_left_slice(node.args[1])
        return inner if leading_only and _keeps_last_two_dims(node, node.args[0]) else None
    return None


def _shifted_by_constant(node: Node, constants) -> Position | None:
    """Positions plus or minus a tensor proven to hold one integer everywhere (HF's chunked masks subtract
    `torch.zeros(B)[batch_indices]` left-padding counts when there is no attention_mask)."""
    a, b = node.args[:2]
    candidates = [(a, b, 1), (b, a, 1)] if ADD(node) else [(a, b, 1)] if IN_PLACE_ADD(node) else [(a, b, -1)]
    for positions, shift, sign in candidates:
        inner = _position(positions, constants)
        if inner is None or inner.axis is None or not _keeps_axis(node, positions, inner.axis):
            continue
        const = _constant(shift, constants)
        if const is not None and not isinstance(const.inside, bool) and const.inside == int(const.inside):
            return Position(inner.offset + sign * int(const.inside), inner.axis, inner.start)
    return None


def _arange(node: Node) -> Position | None:
    """`arange(end)` or `arange(start, end)` with step 1: positions from start (an int, or a SymInt: a cache
    length under dynamic shapes)."""
    args = list(node.args[:2]) + [node.kwargs[k] for k in ("start", "end") if k in node.kwargs]
    step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
    if step != 1 or len(args) not in (1, 2):
        return None
    if len(args) == 1:
        return Position(0)
    start = args[0]
    if isinstance(start, int):
        return Position(start)
    return Position(0, None, start) if isinstance(value(start), torch.SymInt) else None


def _gathered_position(node: Node, constants) -> Position | None:
    """Positions read from a table of positions at positions (HF's `remap_positions_for_packed_sequence`):

        table = (arange(L) + c)[None, :].expand(B, -1)        # table[b, l] = l + c in every row
        table[batch_indices, idx]                             # idx: arange(n) + d laid along an axis, d >= 0

    is idx + c on idx's axis, whatever batch_indices picks (every row is the same). idx counts up from a
    non-negative constant, so no index wraps around."""
    index = node.args[1]
    if not (isinstance(index, tuple) and len(index) == 2 and all(isinstance(i, Node) for i in index)):
        return None
    table = _position(node.args[0], constants)
    batch, idx = index
    picked = _position(idx, constants)
    if (table is None or table.axis != -1 or len(shape(node.args[0])) != 2 or picked is None
            or picked.axis is None or picked.start is not None or picked.offset < 0
            or value(batch).dtype.is_floating_point or value(batch).dtype == torch.bool):
        return None
    if len(shape(node)) < -picked.axis or not same_size(shape(node)[picked.axis], shape(idx)[picked.axis]):
        return None
    return Position(table.offset + picked.offset, picked.axis, table.start)


def _position_vector(node) -> bool:
    """A graph input of query positions: transformers 4's `cache_position` [Sq] (integers), which generate passes
    as `arange(past, past + Sq)`. Read as `cache_position[0] + arange(Sq)` under a run-time check that it counts
    up by one (`Shift.vector`; kv_cache.snapshot)."""
    if not (isinstance(node, Node) and node.op == "placeholder" and node.name.endswith("cache_position_")):
        return False
    v = value(node)
    return isinstance(v, torch.Tensor) and v.dim() == 1 and not v.dtype.is_floating_point and v.dtype != torch.bool


def _placed(node: Node, inner: Position) -> Position | None:
    """A 1-D position given its axis by `x[None, :]`, `x[:, None]`, `x.unsqueeze(d)`."""
    out_ndim = len(shape(node))
    if UNSQUEEZE(node):
        dim = normalize_dim(arg(node, 1, "dim"), out_ndim)
        p = 1 if dim == 0 else 0
    else:
        index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if Ellipsis in index:
            at = index.index(Ellipsis)
            index = index[:at] + (slice(None),) * (1 - sum(i is not None and i is not Ellipsis for i in index)) + index[at + 1:]
        slices = [p for p, i in enumerate(index) if i is not None]
        if len(slices) != 1 or index[slices[0]] != slice(None):
            return None
        p = slices[0]
    axis = p - out_ndim
    return Position(inner.offset, axis, inner.start) if axis in (-1, -2) else None


def _integer_scalar(node) -> bool:
    """A 0-d integer tensor or a SymInt: a run-time position offset (HF's cache `cumulative_length`)."""
    v = value(node)
    if isinstance(v, torch.SymInt):
        return True
    return isinstance(v, torch.Tensor) and v.dim() == 0 and not v.dtype.is_floating_point and v.dtype != torch.bool


def _uniform(v) -> TwoValued:
    return TwoValued(ALL, v, v)


def _coerce(node: Node, tv: TwoValued) -> TwoValued:
    """Values converted to the dtype the node produces (bool, integer or floating)."""
    dtype = value(node).dtype
    if dtype.is_complex:
        raise MaskNotUnderstood(f"{describe_node(node)} is complex")
    if dtype == torch.bool:
        return tv.map(bool)
    if dtype.is_floating_point:
        return tv.map(float)
    return tv.map(int)


def _keeps_axis(node: Node, source, axis: int) -> bool:
    """node (an expand of source) has source's size along axis: a position laid along it keeps its values."""
    if not isinstance(source, Node) or min(len(shape(node)), len(shape(source))) < -axis:
        return False
    return same_size(shape(node)[axis], shape(source)[axis])


def _keeps_last_two_dims(node: Node, source) -> bool:
    if not isinstance(source, Node) or len(shape(node)) < 2 or len(shape(source)) < 2:
        return False
    return all(same_size(a, b) for a, b in zip(shape(node)[-2:], shape(source)[-2:]))


def broadcasts_last_two_dims(mshape, tshape) -> bool:
    """Each of a mask's last two dims (shape mshape) equals the target's (tshape) or is 1 (broadcast)."""
    if len(mshape) < 2:
        return False
    return all(same_size(a, b) or same_size(a, 1) for a, b in zip(mshape[-2:], tshape[-2:]))


def _top_left_slice(index) -> bool:
    """An index that only adds axes and takes leading blocks (`[:, :, :T, :T]`, `[None, None]`)."""
    index = index if isinstance(index, tuple) else (index,)
    for i in index:
        if i is None or i is Ellipsis:
            continue
        if not isinstance(i, slice) or i.start not in (None, 0) or i.step not in (None, 1):
            return False
    return True


def _band_of_values(t: torch.Tensor) -> TwoValued:
    """The two-valued band a concrete [..., R, C] tensor is, if it is one (every 2-D slice equal)."""
    if t.dim() < 2:
        raise MaskNotUnderstood("a mask buffer with fewer than 2 dims")
    flat = t.detach().cpu().reshape(-1, t.shape[-2], t.shape[-1])
    plane = flat[0]
    if not bool((flat == plane).all()):
        raise MaskNotUnderstood("a mask buffer whose 2-D slices differ")
    values = torch.unique(plane)
    if values.numel() == 1:
        return _uniform(values.item())
    if values.numel() != 2:
        raise MaskNotUnderstood(f"a mask buffer with {values.numel()} distinct values")
    rows, cols = plane.shape
    diag = torch.arange(cols).view(1, -1) - torch.arange(rows).view(-1, 1)
    for v, other in ((values[0], values[1]), (values[1], values[0])):
        on = plane == v
        lo, hi = int(diag[on].min()), int(diag[on].max())
        if bool((on == ((diag >= lo) & (diag <= hi))).all()):
            band = Band(-INF if lo <= -(rows - 1) else lo, INF if hi >= cols - 1 else hi)
            return TwoValued(band, v.item(), other.item())
    raise MaskNotUnderstood("a mask buffer that is not a band")


def evaluate(node, constants: dict) -> TwoValued:
    """The two-valued band a mask subgraph computes. `constants`: placeholder -> (source name, real tensor)
    for module buffers."""
    if not isinstance(node, Node):
        v = scalar(node)
        if v is None and not isinstance(node, bool):
            raise MaskNotUnderstood(f"a mask operand {node!r}")
        return _uniform(node)
    if node.op == "placeholder":
        if node in constants:
            return _band_of_values(constants[node][1])
        outside = getattr(constants, "outside", {}).get(node)
        if outside is not None and (proven := _proven_outside(outside)) is not None:
            return proven
        v = value(node)
        if isinstance(v, torch.Tensor) and v.dtype == torch.bool and v.dim() == 4 and same_size(v.shape[1], 1):
            keys = KeyMask(node, plane=True, per_query=not same_size(v.shape[2], 1))
            return TwoValued(Band(keys=keys), True, False)
        message = (f"the mask is the graph input {node.name}; its values are unknown when compiling "
                   "(only a boolean [B, 1, Sq or 1, Sk] input is read, as a key mask)")
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
            raise ValuesUnknown(message, node)
        raise MaskNotUnderstood(message)
    if ONES(node):
        return _coerce(node, _uniform(1))
    if ZEROS(node):
        return _coerce(node, _uniform(0))
    if FULL(node):
        fill = arg(node, 2 if node.op == "call_method" else 1, "fill_value")
        if scalar(fill) is None and not isinstance(fill, bool):
            raise MaskNotUnderstood(f"torch.full with a non-constant fill ({node.name})")
        return _coerce(node, _uniform(fill))
    if TENSOR(node):
        data = node.args[1] if node.op == "call_method" else node.args[0]
        if scalar(data) is None and not isinstance(data, bool):
            raise MaskNotUnderstood(f"{describe_node(node)} of {data!r}, not a number")
        return _coerce(node, _uniform(data))
    if TRIL(node) or TRIU(node):
        x = evaluate(node.args[0], constants)
        d = arg(node, 1, "diagonal", 0)
        if not isinstance(d, int):
            raise MaskNotUnderstood(f"{describe_node(node)} with a non-constant diagonal")
        kept = Band(-INF, d) if TRIL(node) else Band(d, INF)
        if x.uniform:
            return _coerce(node, TwoValued(kept, x.inside, 0))
        if x.outside == 0:
            return _coerce(node, TwoValued(x.band & kept, x.inside, 0))
        raise MaskNotUnderstood(f"{describe_node(node)} of a band with nonzero outside")
    if LE(node) or LT(node) or GE(node) or GT(node) or EQ(node):
        a, b = (_position(x, constants) for x in node.args[:2])
        if a is not None and b is not None:
            return _compare(node, a, b)
        if a is not None and scalar(node.args[1]) is not None:
            return _compare_to_constant(node, a, scalar(node.args[1]), True)
        if b is not None and scalar(node.args[0]) is not None:
            return _compare_to_constant(node, b, scalar(node.args[0]), False)
        for x, c, first in ((node.args[0], node.args[1], True), (node.args[1], node.args[0], False)):
            if scalar(c) is not None and (dist := _distance(x, constants)) is not None:
                return _compare_distance(node, dist, scalar(c), first)
        if not EQ(node):
            raise MaskNotUnderstood(f"{describe_node(node)} compares {_not_positions(node.args[:2], constants)}")
    if (EQ(node) or NE(node)) and all(isinstance(x, Node) for x in node.args[:2]):
        a, b = (_compared_constant(node, x, constants) for x in node.args[:2])
        same = a.inside == b.inside
        return _uniform(same if EQ(node) else not same)
    if DIFF(node):
        return _coerce(node, _uniform(_position_steps(node, constants)))
    if CUMSUM(node):
        x = evaluate(node.args[0], constants)
        if not (x.uniform and x.inside == 0):
            raise MaskNotUnderstood(f"{describe_node(node)} of a tensor that is not all zeros")
        return _coerce(node, _uniform(0))
    if FLOOR_DIVIDE(node):
        return _coerce(node, _uniform(_first_block(node, constants)))
    if AND(node):
        a, b = (evaluate(x, constants) for x in node.args[:2])
        if not (a.boolean and b.boolean):
            raise MaskNotUnderstood(f"{describe_node(node)} of masks that are not both boolean")
        return TwoValued(a.where(bool) & b.where(bool), True, False)
    if ADD(node) and all(isinstance(x, Node) for x in node.args[:2]):
        return _coerce(node, _summed(node, constants))
    if EQ(node) or NE(node):
        other = scalar(node.args[1])
        if other is None:
            raise MaskNotUnderstood(f"{describe_node(node)} against a non-constant")
        x = evaluate(node.args[0], constants)
        return x.map(lambda a: a == other) if EQ(node) else x.map(lambda a: a != other)
    if LOGICAL_NOT(node):
        return evaluate(node.args[0], constants).map(lambda a: not a)
    if SUB(node) and number(node.args[0]) is not None and isinstance(node.args[1], Node):
        c = number(node.args[0])
        return _coerce(node, evaluate(node.args[1], constants).map(lambda x: c - x))
    if MUL(node) or IN_PLACE_MUL(node) and sole_update(node):
        a, b = node.args[0], node.args[1]
        if isinstance(a, Node) and isinstance(b, Node):
            return _coerce(node, _selected(node, evaluate(a, constants), evaluate(b, constants)))
        tensor, factor = (a, scalar(b)) if isinstance(a, Node) else (b, scalar(a))
        if factor is None:
            raise MaskNotUnderstood(f"{describe_node(node)} by a non-constant")
        return _coerce(node, evaluate(tensor, constants).map(lambda x: x * factor))
    if WHERE(node) and len(node.args) == 3:
        cond = evaluate(node.args[0], constants)
        a, b = (evaluate(x, constants) for x in node.args[1:])
        if not a.uniform or not b.uniform:
            raise MaskNotUnderstood(f"{describe_node(node)} between non-uniform tensors")
        return _coerce(node, cond.map(lambda c: a.inside if c else b.inside))
    if MASKED_FILL(node):
        x = evaluate(node.args[0], constants)
        fill = number(arg(node, 2, "value"))
        if fill is not None and (padded := _filled_where_padded(node, x, fill, constants)) is not None:
            return _coerce(node, padded)
        cond = evaluate(node.args[1], constants) if fill is not None else None
        if fill is None or not (x.uniform or cond.uniform or cond.band == x.band):
            raise MaskNotUnderstood(f"{describe_node(node)} of a non-uniform tensor or with a non-constant fill")
        if x.uniform:
            return _coerce(node, cond.map(lambda c: fill if c else x.inside))
        # x filled where a mask of its own band holds (transformers 4's `m.masked_fill(m.to(torch.bool), min)`)
        filled = cond.map(bool) if not cond.uniform else TwoValued(x.band, bool(cond.inside), bool(cond.inside))
        return _coerce(node, TwoValued(x.band, fill if filled.inside else x.inside,
                                       fill if filled.outside else x.outside))
    if (RESHAPE(node) or UNSQUEEZE(node)) and (keys := _key_lookup(node, constants)) is not None:
        return _coerce(node, TwoValued(Band(keys=keys), 1, 0))
    if CAST(node) or SAME_VALUES(node) or RESHAPE(node) or UNSQUEEZE(node) or EXPAND(node):
        source = node.args[0]
        if not _keeps_last_two_dims(node, source):
            if EXPAND(node) and broadcasts_last_two_dims(shape(source), shape(node)):
                tv = evaluate(source, constants)
                if not tv.band.bounded:  # the same for every query: broadcasting over rows keeps it
                    return _coerce(node, tv)
            raise MaskNotUnderstood(f"{describe_node(node)} changes the last two mask dims")
        return _coerce(node, evaluate(source, constants))
    if GETITEM(node) and _tensor_entries(node.args[1]) and (picked := _constant(node.args[0], constants)) is not None:
        return _coerce(node, picked)  # any entries of a constant tensor
    if GETITEM(node) and (keys := _key_lookup(node, constants)) is not None:
        return _coerce(node, TwoValued(Band(keys=keys), 1, 0))
    if GETITEM(node) and (rows := _row_gather(node, constants)) is not None:
        return rows
    if GETITEM(node):
        source = node.args[0]
        if _top_left_slice(node.args[1]) and len(shape(node)) >= 2:
            return _coerce(node, evaluate(source, constants))
        if (sliced := _sliced_buffer(node, constants)) is not None:
            return sliced
        raise MaskNotUnderstood(f"{describe_node(node)} indexes the mask by something other than leading slices")
    raise MaskNotUnderstood(f"the mask is built by {describe_node(node)}, which is not understood")


def _proven_outside(outside: Outside) -> TwoValued | None:
    """The value of a region body's input as its enclosing graph proves it, if that is pure structure: built from
    no graph input (sizes aside), not updated in place before the region reads it, with no run-time positions or
    key mask (their tensors live in the other graph). None otherwise: the input is read as a graph input."""
    if _graph_inputs(outside.node):
        return None
    try:
        tv = evaluate(outside.node, outside.constants)
        outside.mutations.check_mask(outside.node, outside.region)
    except (MaskNotUnderstood, Decline):
        return None
    return tv if tv.band.shift is None and tv.band.keys is None else None


def _filled_where_padded(node: Node, x: TwoValued, fill: float, constants) -> TwoValued | None:
    """`x.masked_fill((x + keep) == 0, fill)` for x 0 where visible and `fill` elsewhere, keep an attention_mask of
    1 and 0 (transformers 4's `_update_causal_mask`): x + keep is 0 only where x is visible and the key is padding,
    so the result is visible where x is and the key is kept. None for any other masked_fill."""
    cond = node.args[1]
    if not (isinstance(cond, Node) and EQ(cond) and scalar(cond.args[1]) == 0 and isinstance(cond.args[0], Node)
            and ADD(cond.args[0]) and fill not in (0, -1) and not x.uniform and {x.inside, x.outside} == {0, fill}):
        return None
    a, b = cond.args[0].args[:2]
    if not (isinstance(a, Node) and isinstance(b, Node)):
        return None
    for scores, keep in ((a, b), (b, a)):
        try:
            same, keys = evaluate(scores, constants), evaluate(keep, constants)
        except MaskNotUnderstood:
            continue
        if same == x and keys.band.keys is not None and not keys.band.bounded and (keys.inside, keys.outside) == (1, 0):
            return TwoValued(x.where(lambda v: v == 0) & keys.band, 0, fill)
    return None


def _summed(node: Node, constants) -> TwoValued:
    """`a + b` of two additive masks of 0 and -inf (nn.MultiheadAttention's attn_mask + key_padding_mask): 0 where
    both are, -inf elsewhere."""
    a, b = (evaluate(x, constants) for x in node.args[:2])
    if not all({tv.inside, tv.outside} <= {0, -INF} and not tv.boolean for tv in (a, b)):
        raise MaskNotUnderstood(f"{describe_node(node)} of masks that are not 0 and -inf")
    return TwoValued(a.where(lambda v: v == 0) & b.where(lambda v: v == 0), 0, -INF)


def _selected(node: Node, a: TwoValued, b: TwoValued) -> TwoValued:
    """a * b where one of them is boolean: the other's values where it holds, 0 elsewhere (transformers 4's
    `causal_mask *= arange(Sk) > cache_position.reshape(-1, 1)` over a finfo.min triangle)."""
    for x, keep in ((a, b), (b, a)):
        if not keep.boolean:
            continue
        if x.uniform:
            return keep.map(lambda k: x.inside if k else 0.0)
        if x.outside == 0:
            return TwoValued(x.band & keep.where(bool), x.inside, 0.0)
    raise MaskNotUnderstood(f"{describe_node(node)} of two masks, neither a boolean selecting the other's values")


def _sliced_buffer(node: Node, constants) -> TwoValued | None:
    """A module buffer read by value through slices (transformers 4's GPT-2, GPT-Neo: `bias[:, :, Sk - Sq:Sk, :Sk]`,
    the rows of a cache's last queries): the band of the slice's values where the bounds are numbers; where a bound
    is a size (dynamic shapes), the buffer's band at query positions r0 + i for rows from r0: a fixed offset where r0
    is known (0 for Sk - Sq in a prefill, under a guard), else a run-time one (`Shift`: a decode step); None for any
    other index."""
    source, index = node.args[0], node.args[1]
    index = index if isinstance(index, tuple) else (index,)
    constant = isinstance(source, Node) and source.op == "placeholder" and source in constants
    if not constant or not all(isinstance(i, slice) for i in index):
        return None
    if all(b is None or type(b) is int for i in index for b in (i.start, i.stop, i.step)):
        return _coerce(node, _band_of_values(constants[source][1][index]))
    buffer = constants[source][1]
    if len(index) != buffer.dim() or any(i != slice(None) for i in index[:-2]):
        return None
    rows, cols = index[-2:]
    start = value(rows.start) if isinstance(rows.start, Node) else rows.start or 0
    if not isinstance(start, (int, torch.SymInt)) or rows.step not in (None, 1) or cols.start not in (None, 0) \
            or cols.step not in (None, 1):
        return None
    if isinstance(start, torch.SymInt) and equal_size(start, 0):  # Sk - Sq of a prefill: guarded, as equal sizes are
        start = 0
    whole = _band_of_values(buffer)  # every 2-D slice a band of the same diagonals: rows from r0 shift it by r0
    if not whole.band.bounded:
        band = whole.band
    elif isinstance(start, int):
        band = Band(whole.band.lo + start, whole.band.hi + start)
    else:
        band = Band(whole.band.lo, whole.band.hi, Shift(rows.start))
    return _coerce(node, TwoValued(band, whole.inside, whole.outside))


def _constant(node, constants) -> TwoValued | None:
    """The value of a tensor proven to hold one value everywhere, None if it is not one."""
    try:
        tv = evaluate(node, constants)
    except MaskNotUnderstood:
        return None
    return tv if tv.uniform else None


def _first_block(node: Node, constants) -> int:
    """0: the block `p // c` of positions p that all lie in [0, c) (HF's chunked attention over a sequence no
    longer than a chunk; symbolic lengths are guarded, a longer one recompiles). Blocks along the diagonal
    of a longer sequence are not a band."""
    p, chunk = _position(node.args[0], constants), node.args[1]
    if p is not None and p.axis is not None and p.start is None and p.offset >= 0 and isinstance(chunk, int) \
            and chunk > 0 and guard_or_false(shape(node.args[0])[p.axis] + p.offset <= chunk):
        return 0
    raise MaskNotUnderstood(f"{describe_node(node)} divides positions into blocks (chunked attention): blocks along "
                            "the diagonal of a sequence longer than a block are not a band")


def _compared_constant(node: Node, operand: Node, constants) -> TwoValued:
    """An operand of the comparison node that is neither a position nor a number, proven to be one value."""
    if any(n not in constants for n in _graph_inputs(operand)):
        raise MaskNotUnderstood(f"{describe_node(node)} compares {_not_positions([operand], constants)}")
    tv = evaluate(operand, constants)
    if not tv.uniform:
        raise MaskNotUnderstood(f"{describe_node(node)} compares a mask that is not one value everywhere")
    return tv


def _position_steps(node: Node, constants) -> int:
    """1: the steps between consecutive positions along their axis (HF's `find_packed_sequence_indices`):

        torch.diff(p, dim=-1)                                  p: positions along the last dim
        torch.diff(p, prepend=p[:, :1] - 1, dim=-1)            the first step counted from one before p's start
    """
    p = _position(node.args[0], constants)
    n, dim = arg(node, 1, "n", 1), arg(node, 2, "dim", -1)
    prepend, append = arg(node, 3, "prepend", None), arg(node, 4, "append", None)
    ndim = len(shape(node.args[0]))
    if p is None or p.axis is None or n != 1 or append is not None or normalize_dim(dim, ndim) != ndim + p.axis:
        raise MaskNotUnderstood(f"{describe_node(node)} of {_not_positions(node.args[:1], constants)}")
    if prepend is not None and not _one_before_first(prepend, p, constants):
        raise MaskNotUnderstood(f"{describe_node(node)} prepends something other than the position before the first")
    return 1


def _one_before_first(node, p: Position, constants) -> bool:
    """node is `q[..., :1] - 1` of positions q equal to p (laid along the last dim): the position before p's first."""
    if not (SUB(node) and scalar(node.args[1]) == 1 and GETITEM(node.args[0])):
        return False
    first, index = node.args[0].args
    index = index if isinstance(index, tuple) else (index,)
    return (p.axis == -1 and _position(first, constants) == p and len(index) == len(shape(first))
            and all(i == slice(None) for i in index[:-1]) and index[-1] in (slice(None, 1), slice(0, 1)))


def _not_positions(operands, constants) -> str:
    """Why operands are not positions: the graph inputs their values come from, if any."""
    inputs = sorted({n.name for x in operands if isinstance(x, Node) for n in _graph_inputs(x) if n not in constants})
    if inputs:
        return f"values read from the graph input {', '.join(inputs)}, not positions proven from the graph"
    return "values that are not positions proven from the graph"


def _graph_inputs(node: Node) -> set:
    """The tensor graph inputs node's value is computed from (sizes, SymInt inputs under dynamic shapes, are not data)."""
    seen, work, found = set(), [node], set()
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" and isinstance(value(n), torch.Tensor):
            found.add(n)
        work.extend(n.all_input_nodes)
    return found


def _tensor_entries(index) -> list:
    return [i for i in (index if isinstance(index, tuple) else (index,)) if isinstance(i, Node)]


def _key_lookup(node: Node, constants) -> KeyMask | None:
    """The key mask when node reads a run-time [B, Sk] mask m broadcast over queries: m[:, None, None, :]
    (BERT-style), m reshaped or unsqueezed to [B, 1, 1, Sk] in any number of steps (einops'
    `rearrange(m, "b j -> b 1 1 j")`, LayoutLM's `m.unsqueeze(1).unsqueeze(2)`: each keeps the row-major order) or
    m[arange(B)[:, None, None, None], kv_positions] (HF masking_utils, m boolean; key positions from 0, or from an
    offset in a sliding-window cache: an int, or a SymInt under dynamic shapes)."""
    m = node.args[0]
    if RESHAPE(node) or UNSQUEEZE(node):
        while isinstance(m, Node) and (RESHAPE(m) or UNSQUEEZE(m)) and len(shape(m)) > 2:
            m = m.args[0]
    if not isinstance(m, Node) or len(shape(m)) != 2 or len(shape(node)) != 4:
        return None
    if RESHAPE(node) or UNSQUEEZE(node):
        (b, sk), out = shape(m), shape(node)
        return KeyMask(m) if same_size(out[0], b) and same_size(out[1], 1) and same_size(out[2], 1) and \
            same_size(out[3], sk) else None
    index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    if index == (slice(None), None, None, slice(None)):
        return KeyMask(m)
    if len(index) != 2 or not all(isinstance(i, Node) for i in index) or value(m).dtype != torch.bool:
        return None
    batch, keys = index
    kv = _position(keys, constants)
    if kv is None or kv.axis != -1 or kv.offset < 0 or isinstance(value(kv.start), torch.Tensor):
        return None
    if kv.start is not None and kv.offset != 0:
        return None
    start = kv.start if kv.start is not None else (kv.offset or None)
    # The key count may be symbolic while the mask's length is not (automatic dynamic shapes marked the cache
    # dynamic first), and the batch may have one symbol in the ids and another in a mask first seen after the ids
    # went dynamic: the lookup reads the whole mask only when they are equal, so the graph is guarded on them.
    if not (GETITEM(batch) and batch.args[1] == (slice(None), None, None, None) and ARANGE(batch.args[0])
            and equal_size(shape(batch)[0], shape(m)[0])
            and (start is not None or equal_size(shape(keys)[-1], shape(m)[1]))):
        return None
    return KeyMask(m, start)


def _row_gather(node: Node, constants) -> TwoValued | None:
    """A band mask whose query rows are picked by a position tensor: `causal_mask[None, None, input_pos]`
    (gpt-fast). Row i is the source row input_pos[i], so the band moves by input_pos[0] (with a run-time
    check that input_pos counts up by one)."""
    tensors = _tensor_entries(node.args[1])
    if len(tensors) != 1:
        return None
    index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    pos = tensors[0]
    source = node.args[0]
    picked = [i for i in index if i is not None and i is not Ellipsis]
    source_ndim = len(shape(source))
    at = picked.index(pos)
    if (Ellipsis in index or len(picked) > source_ndim or at != source_ndim - 2
            or any(i != slice(None) for i in picked if i is not pos)
            or len(shape(pos)) != 1 or value(pos).dtype.is_floating_point):
        return None
    tv = evaluate(source, constants)
    if tv.band.shift is not None or tv.band.keys is not None:
        raise MaskNotUnderstood(f"{describe_node(node)} picks rows of a mask that already moves at run time")
    band = tv.band
    moved = Band(band.lo, band.hi, Shift(pos, vector=True) if band.bounded else None)
    return _coerce(node, TwoValued(moved, tv.inside, tv.outside))


def keep_band(kind: str, mask, constants: dict, fill=None) -> tuple[Band, float | None]:
    """Visible keys of a mask used as `kind` ("masked_fill", "where", "additive" or "bool"), and the score
    that hidden keys get (-inf or finfo.min, or a fill of at most `HIDING_FILL` that overwrites or is added to them;
    None for a boolean SDPA mask or when nothing is hidden)."""
    if isinstance(fill, Node) and (held := number(fill)) is not None:
        fill = held
    if kind in ("masked_fill", "where") and not hides_keys(fill):
        raise MaskNotUnderstood(f"the mask fill value {fill!r} is above {HIDING_FILL:g}: it does not hide keys")
    tv = evaluate(mask, constants)
    if kind == "masked_fill":
        return tv.where(lambda m: not m), scalar(fill)
    if kind == "where":
        return tv.where(bool), scalar(fill)
    if kind == "bool":
        return tv.where(bool), None
    hidden = None
    for v in {tv.inside, tv.outside} if not tv.uniform else {tv.inside}:
        if v != 0 and not is_large_negative(v) and not hides_keys(v):
            raise MaskNotUnderstood(f"the additive mask has the value {v!r}, not 0, -inf, finfo.min or at most "
                                    f"{HIDING_FILL:g}")
        if v != 0:
            hidden = float(v)
    return tv.where(lambda m: m == 0), hidden


def band_args(band: Band) -> dict:
    """`fa4::attention` flags (only those that differ from the defaults) for visible keys `band` on square scores."""
    if band.empty:
        raise MaskNotUnderstood("the mask hides every key")
    if not band.lo <= 0 <= band.hi:
        raise MaskNotUnderstood(f"the visible band {band.lo} <= j - i <= {band.hi} does not contain the diagonal")
    flags = {}
    if band.hi == 0:
        flags["causal"] = True
    elif band.hi != INF:
        flags["window_right"] = int(band.hi)
    if band.lo != -INF:
        flags["window_left"] = int(-band.lo)
    return flags
