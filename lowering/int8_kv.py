"""An int8 KV cache's dequantization folded into the attention that reads it: `fa4::attention_int8kv`.

Matched on each of K and V once GQA repetition is folded (gqa.py; HF's repeat_kv and gpt-fast's
repeat_interleave come after the dequantization), x int8 [B, Hkv, S, D], s float32 [B, Hkv, S]:

    (x.float() * s[..., None]).to(dtype)           fa4_inductor.Int8StaticCache (float32 product, then cast)
    x.to(dtype) * s[..., None].to(dtype)           gpt-fast-style caches (product in the model's dtype)
    x.to(dtype) * s.to(dtype)[..., None]

(`s[..., None]`, `s[:, :, :, None]` or `s.unsqueeze(-1)`; the final cast absent when the product already has
q's dtype), optionally sliced along the keys, `[:, :, a:b]` (transformers 5.24's sdpa code keeps the prompt's
slots of an empty static cache in prefill): then x and s are sliced the same way. Replacement: the attention
reads x and s themselves,

    fa4::attention_int8kv(q, x_k, x_v, s_k, s_v, seqused_k, key_mask, **flags)

so the dequantized cache is never written to memory. The op takes the products in float32, unrounded
(kernels/attention_int8kv.py): where the model rounds K/V (or s) to bfloat16 or float16 first, the rewrite is
more accurate than eager by that rounding, as every attention rewrite differs from eager by the kernel's own.
The cache writes (`index_copy_` / indexed assignment into x and s) stay in place before the read, and give
the same seqused_k and causal proofs as a bfloat16 cache (kv_cache.py, attention._check_positions_bounded: the
int8 buffer is the keys the writes bound).

Not folded (the attention is then rewritten over the dequantized K/V, `fa4::attention`, the reason in its
record): only one of K and V dequantized, or from different kinds of scales; a scale that is not float32 or
not one per (batch, head, token); anything requiring a gradient (the op is
forward only); 3-D (bmm) attention; a padding mask whose all-hidden rows eager fills with the mean of V.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.fx import Node

from .spellings import CAST, GETITEM, MUL, UNSQUEEZE, arg, normalize_dim, same_size, shape, value

SCALE_DTYPE = torch.float32


@dataclass(frozen=True)
class Int8Source:
    """A dequantized K or V: the int8 tensor, its scale [B, H, S] and the nodes from them to the dequantized value."""

    data: Node
    scale: Node
    spelling: str  # "float32 product" or "product in <dtype>"
    nodes: list = field(default_factory=list)
    keys: slice | None = None  # the slice of the keys (dim 2) the attention reads, None for all of them

    def index(self, dims: int) -> tuple:
        """The getitem index that takes `keys` of a tensor of `dims` dims (the data: 4, the scale: 3)."""
        return (slice(None), slice(None), self.keys) + (slice(None),) * (dims - 3)


class NotInt8(Exception):
    """A K/V that is dequantized from int8 in a way the op cannot take; the message says why."""


def _dtype(node) -> torch.dtype | None:
    v = value(node)
    return v.dtype if isinstance(v, torch.Tensor) else None


def _int8_cast(node) -> Node | None:
    """x when node is the int8 tensor x cast to a floating dtype."""
    if CAST(node) and isinstance(node.args[0], Node) and _dtype(node.args[0]) == torch.int8 \
            and _dtype(node) is not None and _dtype(node).is_floating_point:
        return node.args[0]
    return None


def _unsqueezed_last(node) -> Node | None:
    """s when node is s with a new last axis (`s[..., None]`, `s[:, :, :, None]`, `s.unsqueeze(-1)`)."""
    if not isinstance(node, Node) or len(shape(node)) != 4:
        return None
    if UNSQUEEZE(node):
        dim = arg(node, 1, "dim")
        return node.args[0] if isinstance(dim, int) and normalize_dim(dim, 4) == 3 else None
    if GETITEM(node) and isinstance(node.args[1], tuple):
        index = node.args[1]
        if index in ((Ellipsis, None), (slice(None),) * 3 + (None,)):
            return node.args[0]
    return None


def _scale(node, nodes: list) -> Node:
    """The [B, H, S] scale behind a scale operand [B, H, S, 1] (through at most one cast)."""
    casts = 0
    while True:
        if CAST(node) and isinstance(node.args[0], Node):
            casts += 1
            nodes.append(node)
            node = node.args[0]
            continue
        inner = _unsqueezed_last(node)
        if inner is None:
            break
        nodes.append(node)
        node = inner
    if casts > 1 or not isinstance(node, Node) or len(shape(node)) != 3:
        raise NotInt8("its scale is not a [B, H, S] tensor with a new last axis (`s[..., None]`)")
    if _dtype(node) != SCALE_DTYPE:
        raise NotInt8(f"its scale is {_dtype(node)}, and the int8-KV op takes float32 scales")
    return node


def _keys_slice(node) -> slice | None:
    """`a:b` when node is x[:, :, a:b] (or x[:, :, a:b, :]) of a 4-D x, with no step."""
    if not GETITEM(node) or not isinstance(node.args[0], Node) or not isinstance(value(node.args[0]), torch.Tensor) \
            or len(shape(node.args[0])) != 4:
        return None  # not an index of a 4-D tensor (e.g. an item of a split's tuple)
    index = node.args[1]
    if not isinstance(index, tuple) or len(index) not in (3, 4) or any(i != slice(None) for i in index[:2] + index[3:]):
        return None
    keys = index[2]
    if not isinstance(keys, slice) or keys.step not in (None, 1) or keys == slice(None):
        return None
    return keys


def dequantized(node: Node) -> Int8Source | None:
    """The int8 source of a dequantized K/V (module docstring), None when `node` is not computed from int8 that
    way; raises NotInt8 when it is a product of an int8 tensor the op cannot take."""
    keys = _keys_slice(node)
    if keys is not None:
        source = dequantized(node.args[0])
        if source is None or source.keys is not None:
            return None
        return Int8Source(source.data, source.scale, source.spelling, [node] + source.nodes, keys)
    nodes, product = [], node
    if CAST(node) and MUL(node.args[0]):
        nodes.append(node)
        product = node.args[0]
    if not MUL(product) or len(product.args) != 2:
        return None
    a, b = product.args
    data = _int8_cast(a)
    if data is None:
        a, b = b, a
        data = _int8_cast(a)
    if data is None:
        return None
    nodes += [product, a]
    if len(shape(data)) != 4:
        raise NotInt8(f"the int8 tensor has {len(shape(data))} dims, not [B, H, S, D]")
    scale = _scale(b, nodes)
    if not all(same_size(x, y) for x, y in zip(shape(scale), shape(data)[:3])):
        raise NotInt8(f"its scale has shape {list(shape(scale))}, not the int8 tensor's [B, H, S] "
                      f"{list(shape(data)[:3])}")
    if not all(same_size(x, y) for x, y in zip(shape(node), shape(data))):
        raise NotInt8("the dequantization broadcasts the int8 tensor")
    in_dtype = _dtype(product)
    spelling = "float32 product" if in_dtype == torch.float32 else f"product in {str(in_dtype).removeprefix('torch.')}"
    return Int8Source(data, scale, spelling, nodes)


def fold(k: Node, v: Node) -> tuple[Int8Source, Int8Source] | None:
    """The int8 sources of K and V, or None when neither is dequantized from int8; raises NotInt8 with the reason
    when one is and the pair cannot be folded. A dequantized K/V also used elsewhere is still folded (the
    attention reads the int8 cache; the other use keeps its dequantization)."""
    sk, sv = dequantized(k), dequantized(v)
    if sk is None and sv is None:
        return None
    if sk is None or sv is None:
        raise NotInt8(f"only {'k' if sv is None else 'v'} is dequantized from int8")
    if sk.keys != sv.keys:
        raise NotInt8(f"k and v are sliced differently ({sk.keys}, {sv.keys})")
    return sk, sv
