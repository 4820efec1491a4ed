"""Mask subgraphs proven to be causal / sliding-window bands, by abstract interpretation.

Attention masks arrive as small subgraphs of constants and sizes: `torch.tril(torch.ones(T, T))`,
a `tril` buffer sliced `[:, :, :T, :T]` and compared `== 0`, `torch.full((T, T), -inf).triu(1)`, ...
`evaluate` runs such a subgraph on an abstract value, `TwoValued(band, inside, outside)`: a
[..., R, C] tensor equal to `inside` where `lo <= j - i <= hi` and to `outside` elsewhere. Every op
it understands maps two-valued bands to two-valued bands; anything else (a mask computed from an
input tensor, an index by position tensor, ...) raises `MaskNotUnderstood` with the reason, and the
attention stays as written. Nothing is guessed from sample values, with one exception: a mask read
from a module buffer is read by value at compile time (nanoGPT's `bias`), which assumes the buffer
is not modified afterwards; the record says so.

The use site turns the value into the set of visible keys (`keep_band`):

    scores.masked_fill(M, fill)      keep where M is False       (fill: -inf or finfo.min)
    torch.where(C, scores, fill)     keep where C is True
    scores + A                       keep where A == 0, A elsewhere -inf or finfo.min
    SDPA attn_mask=M                 bool: keep where True; float: as `scores + M`

and `band_args` into `fa4::attention` flags (the band must contain the diagonal and, as masks are
applied to square scores here, top-left and bottom-right alignment agree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.fx import Node

from .spellings import (ADD, AND, ARANGE, CAST, CONTIGUOUS, EQ, EXPAND, FULL, GE, GETITEM, GT, LE, LOGICAL_NOT, LT,
                        MASKED_FILL, MUL, NE, ONES, RESHAPE, SUB, TRIL, TRIU, UNSQUEEZE, WHERE, ZEROS, arg,
                        is_large_negative, normalize_dim, same_size, scalar, shape, value)

INF = math.inf


class MaskNotUnderstood(Exception):
    """A mask whose structure cannot be proven from the graph; the message is the reason."""


@dataclass(frozen=True)
class Band:
    """The (i, j) with lo <= j - i <= hi."""

    lo: float = -INF
    hi: float = INF

    def __and__(self, other: "Band") -> "Band":
        return Band(max(self.lo, other.lo), min(self.hi, other.hi))

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def complement(self) -> "Band":
        if self.empty:
            return Band()
        if self.lo == -INF and self.hi == INF:
            return Band(1, 0)
        if self.lo == -INF:
            return Band(self.hi + 1, INF)
        if self.hi == INF:
            return Band(-INF, self.lo - 1)
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


@dataclass(frozen=True)
class Position:
    """`arange(n) + offset` laid along the query axis (-2: value i + offset) or the key axis (-1: j + offset);
    axis None while it is still 1-D."""

    offset: int
    axis: int | None = None


def _compare(node: Node, a: Position, b: Position) -> TwoValued:
    """a OP b for positions on different axes, as a band in j - i."""
    if a.axis is None or b.axis is None or a.axis == b.axis:
        raise MaskNotUnderstood(f"{_describe(node)} compares positions not laid along the query and key axes")
    flip = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt", "eq": "eq"}
    op = next(name for name, spelled in (("le", LE), ("lt", LT), ("ge", GE), ("gt", GT), ("eq", EQ)) if spelled(node))
    if a.axis == -2:  # make it key OP query
        a, b, op = b, a, flip[op]
    d = b.offset - a.offset  # j + a.offset OP i + b.offset  <=>  j - i OP d
    band = {"le": Band(-INF, d), "lt": Band(-INF, d - 1), "ge": Band(d, INF), "gt": Band(d + 1, INF),
            "eq": Band(d, d)}[op]
    return TwoValued(band, True, False)


def _position(node, constants) -> Position | None:
    """The position vector a node computes, None if it is not one."""
    if not isinstance(node, Node):
        return None
    if ARANGE(node):
        if len(node.args) != 1 or any(k in node.kwargs for k in ("start", "step")):
            return None
        return Position(0)
    if (ADD(node) or SUB(node)) and scalar(node.args[1]) is not None:
        inner = _position(node.args[0], constants)
        c = scalar(node.args[1])
        if inner is None or c != int(c):
            return None
        return Position(inner.offset + int(c) * (1 if ADD(node) else -1), inner.axis)
    if GETITEM(node) or UNSQUEEZE(node) or EXPAND(node):
        inner = _position(node.args[0], constants)
        if inner is None:
            return None
        if inner.axis is None:
            return None if EXPAND(node) else _placed(node, inner)
        leading_only = not GETITEM(node) or _top_left_slice(node.args[1])
        return inner if leading_only and _keeps_last_two_dims(node, node.args[0]) else None
    return None


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
    return Position(inner.offset, axis) if axis in (-1, -2) else None


def _uniform(v) -> TwoValued:
    return TwoValued(ALL, v, v)


def _coerce(node: Node, tv: TwoValued) -> TwoValued:
    """Values converted to the dtype the node produces (bool, integer or floating)."""
    dtype = value(node).dtype
    if dtype == torch.bool:
        return tv.map(bool)
    if dtype.is_floating_point:
        return tv.map(float)
    return tv.map(int)


def _describe(node) -> str:
    if not isinstance(node, Node):
        return repr(node)
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return f"{target} ({node.name})"


def _keeps_last_two_dims(node: Node, source) -> bool:
    if not isinstance(source, Node) or len(shape(node)) < 2 or len(shape(source)) < 2:
        return False
    return all(same_size(a, b) for a, b in zip(shape(node)[-2:], shape(source)[-2:]))


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
        raise MaskNotUnderstood(f"the mask is the graph input {node.name}; its values are unknown when compiling")
    if ONES(node):
        return _coerce(node, _uniform(1))
    if ZEROS(node):
        return _coerce(node, _uniform(0))
    if FULL(node):
        fill = arg(node, 2 if node.op == "call_method" else 1, "fill_value")
        if scalar(fill) is None and not isinstance(fill, bool):
            raise MaskNotUnderstood(f"torch.full with a non-constant fill ({node.name})")
        return _coerce(node, _uniform(fill))
    if TRIL(node) or TRIU(node):
        x = evaluate(node.args[0], constants)
        d = arg(node, 1, "diagonal", 0)
        if not isinstance(d, int):
            raise MaskNotUnderstood(f"{_describe(node)} with a non-constant diagonal")
        kept = Band(-INF, d) if TRIL(node) else Band(d, INF)
        if x.uniform:
            return _coerce(node, TwoValued(kept, x.inside, 0))
        if x.outside == 0:
            return _coerce(node, TwoValued(x.band & kept, x.inside, 0))
        raise MaskNotUnderstood(f"{_describe(node)} of a band with nonzero outside")
    if (LE(node) or LT(node) or GE(node) or GT(node) or EQ(node)) and all(
            (positions := [_position(a, constants) for a in node.args[:2]])):
        return _compare(node, *positions)
    if AND(node):
        a, b = (evaluate(x, constants) for x in node.args[:2])
        if not all(isinstance(v, bool) for v in (a.inside, a.outside, b.inside, b.outside)):
            raise MaskNotUnderstood(f"{_describe(node)} of masks that are not both boolean")
        return TwoValued(a.where(bool) & b.where(bool), True, False)
    if EQ(node) or NE(node):
        other = scalar(node.args[1])
        if other is None:
            raise MaskNotUnderstood(f"{_describe(node)} against a non-constant")
        x = evaluate(node.args[0], constants)
        return x.map(lambda a: a == other) if EQ(node) else x.map(lambda a: a != other)
    if LOGICAL_NOT(node):
        return evaluate(node.args[0], constants).map(lambda a: not a)
    if MUL(node):
        a, b = node.args[0], node.args[1]
        tensor, factor = (a, scalar(b)) if isinstance(a, Node) else (b, scalar(a))
        if factor is None:
            raise MaskNotUnderstood(f"{_describe(node)} by a non-constant")
        return _coerce(node, evaluate(tensor, constants).map(lambda x: x * factor))
    if WHERE(node) and len(node.args) == 3:
        cond = evaluate(node.args[0], constants)
        a, b = (evaluate(x, constants) for x in node.args[1:])
        if not a.uniform or not b.uniform:
            raise MaskNotUnderstood(f"{_describe(node)} between non-uniform tensors")
        return _coerce(node, cond.map(lambda c: a.inside if c else b.inside))
    if MASKED_FILL(node):
        x = evaluate(node.args[0], constants)
        fill = scalar(arg(node, 2, "value"))
        if not x.uniform or fill is None:
            raise MaskNotUnderstood(f"{_describe(node)} of a non-uniform tensor or with a non-constant fill")
        cond = evaluate(node.args[1], constants)
        return _coerce(node, cond.map(lambda c: fill if c else x.inside))
    if CAST(node) or CONTIGUOUS(node) or RESHAPE(node) or UNSQUEEZE(node) or EXPAND(node):
        source = node.args[0]
        if not _keeps_last_two_dims(node, source):
            raise MaskNotUnderstood(f"{_describe(node)} changes the last two mask dims")
        return _coerce(node, evaluate(source, constants))
    if GETITEM(node):
        source = node.args[0]
        if not _top_left_slice(node.args[1]) or len(shape(node)) < 2:
            raise MaskNotUnderstood(f"{_describe(node)} indexes the mask by something other than leading slices")
        return _coerce(node, evaluate(source, constants))
    raise MaskNotUnderstood(f"the mask is built by {_describe(node)}, which is not understood")


def keep_band(kind: str, mask, constants: dict, fill=None) -> Band:
    """Visible keys of a mask used as `kind`: "masked_fill", "where", "additive" or "bool"."""
    if kind in ("masked_fill", "where") and not is_large_negative(fill):
        raise MaskNotUnderstood(f"the mask fill value {fill!r} is not -inf or finfo.min")
    tv = evaluate(mask, constants)
    if kind == "masked_fill":
        return tv.where(lambda m: not m)
    if kind in ("where", "bool"):
        return tv.where(bool)
    for v in {tv.inside, tv.outside} if not tv.uniform else {tv.inside}:
        if v != 0 and not is_large_negative(v):
            raise MaskNotUnderstood(f"the additive mask has the value {v!r}, not 0, -inf or finfo.min")
    return tv.where(lambda m: m == 0)


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
