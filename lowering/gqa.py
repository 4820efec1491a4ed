"""K/V head repetition folded into grouped-query attention.

Matched (x is [B, Hkv, S, D]; every form yields [B, Hkv * R, S, D] with head h reading x's head h // R):

    HF repeat_kv:        x[:, :, None, :, :].expand(B, Hkv, R, S, D).reshape(B, Hkv * R, S, D)
    expand + view:       x.unsqueeze(2).expand(...).view(...)    (or .reshape / .flatten(1, 2))
    repeat_interleave:   x.repeat_interleave(R, dim=1)           (or torch.repeat_interleave(x, R, dim=1))

Replacement: attention reads x itself; `fa4::attention` takes Hq % Hkv == 0 as GQA, so the repeat
disappears (it is dead once attention no longer reads it). Sizes are checked from the recorded
shapes, so a literal or symbolic R both work. Not matched: `x.repeat(1, R, 1, 1)` (tiling: head h
reads h % Hkv, not GQA) and repetition along another dim.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Node

from .spellings import (EXPAND, FLATTEN, GETITEM, REPEAT_INTERLEAVE, RESHAPE, UNSQUEEZE, arg, normalize_dim,
                        same_size, shape)


@dataclass(frozen=True)
class Unrepeated:
    source: Node
    group: object  # R: int or SymInt
    spelling: str  # "repeat_kv", "expand+reshape", "repeat_interleave", or "" when nothing was folded


def _shapes_equal(a, b) -> bool:
    return len(a) == len(b) and all(same_size(x, y) for x, y in zip(a, b))


def _unsqueezed_at_2(node) -> Node | None:
    """x when node is x with a new axis at dim 2 (`x.unsqueeze(2)` or `x[:, :, None]`)."""
    if UNSQUEEZE(node) and normalize_dim(arg(node, 1, "dim"), len(shape(node))) == 2:
        source = node.args[0]
    elif GETITEM(node) and isinstance(node.args[1], tuple):
        index = node.args[1]
        plain = all(i is None or i is Ellipsis or i == slice(None) for i in index)
        if not plain or sum(i is None for i in index) != 1 or index.index(None) != 2:
            return None
        source = node.args[0]
    else:
        return None
    if not isinstance(source, Node) or len(shape(source)) != 4:
        return None
    expected = shape(source)[:2] + (1,) + shape(source)[2:]
    return source if _shapes_equal(shape(node), expected) else None


def _merged_heads(node) -> Node | None:
    """y when node merges dims 1 and 2 of a 5-D y (reshape / view / flatten(1, 2))."""
    if FLATTEN(node):
        start, end = arg(node, 1, "start_dim", 0), arg(node, 2, "end_dim", -1)
        y = node.args[0]
        if not isinstance(y, Node) or len(shape(y)) != 5:
            return None
        if (normalize_dim(start, 5), normalize_dim(end, 5)) != (1, 2):
            return None
    elif RESHAPE(node):
        y = node.args[0]
    else:
        return None
    if not isinstance(y, Node) or len(shape(y)) != 5:
        return None
    b, h, r, s, d = shape(y)
    return y if _shapes_equal(shape(node), (b, h * r, s, d)) else None


def unrepeat(node) -> Unrepeated:
    """The un-repeated K/V behind `node`, or `node` itself (group 1) when it is not a repetition."""
    if REPEAT_INTERLEAVE(node):
        source = node.args[0]
        repeats = arg(node, 1, "repeats")
        dim = arg(node, 2, "dim", None)
        if isinstance(source, Node) and len(shape(source)) == 4 and dim is not None and normalize_dim(dim, 4) == 1:
            b, h, s, d = shape(source)
            if not isinstance(repeats, Node) and _shapes_equal(shape(node), (b, h * repeats, s, d)):
                return Unrepeated(source, repeats, "repeat_interleave")
        return Unrepeated(node, 1, "")
    expanded = _merged_heads(node)
    if expanded is not None and EXPAND(expanded):
        inner = expanded.args[0]
        source = _unsqueezed_at_2(inner)
        if source is not None:
            b, h, r, s, d = shape(expanded)
            if _shapes_equal((b, h, s, d), shape(source)):
                return Unrepeated(source, r, "repeat_kv" if GETITEM(inner) else "expand+reshape")
    return Unrepeated(node, 1, "")
