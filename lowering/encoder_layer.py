"""nn.TransformerEncoderLayer's fused inference call, opened into the layer it computes, before the families run.

In eval mode without gradients (PyTorch's fast path), Dynamo's graph holds the whole layer as one call,
`torch._transformer_encoder_layer_fwd(src, E, H, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps, norm1_w,
norm1_b, norm2_w, norm2_b, ffn1_w, ffn1_b, ffn2_w, ffn2_b, mask, mask_type)`, src [N, L, E] (batch first). It computes

    attend(y) = F.linear(SDPA(q, k, v, attn_mask=M).transpose(1, 2).flatten(2), proj_w, proj_b)
                with q, k, v = F.linear(y, qkv_w, qkv_b).unflatten(-1, (3, H, D)).permute(2, 0, 3, 1, 4)
    feed(y)   = F.linear(act(F.linear(y, ffn1_w, ffn1_b)), ffn2_w, ffn2_b)         act: gelu if use_gelu else relu
    norm_first:  x = src + attend(norm1(src));  out = x + feed(norm2(x))
    otherwise:   x = norm1(src + attend(src));  out = norm2(x + feed(x))

`open_encoder_layers` writes each such call so, where the SDPA family then finds its attention (the grad-enabled
and training calls of the same layer reach the graph as nn.MultiheadAttention's call instead: multihead_attention.py).
The mask: mask_type 1 is a key padding mask [N, S]; mask_type 2 the layer's masks merged to [N, H, L, S],
`expand(view(attn_mask, 1, 1, L, S)) + expand(view(key_padding_mask, N, 1, 1, S))` (either alone too). Made from
boolean masks, they go to SDPA as the keys they keep (`multihead_attention.keys_kept`); any other mask as the op
adds it. A nested-tensor src (TransformerEncoder's padded fast path) stays one node, kept with its record
(`opaque_attention`).
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from .graph_edit import NodeMaker, open_calls
from .multihead_attention import keys_kept, placed
from .spellings import ADD, EXPAND, RESHAPE, same_size, shape, value

ARGUMENTS = ("src", "embed", "heads", "qkv_w", "qkv_b", "proj_w", "proj_b", "use_gelu", "norm_first", "eps",
             "norm1_w", "norm1_b", "norm2_w", "norm2_b", "ffn1_w", "ffn1_b", "ffn2_w", "ffn2_b", "mask", "mask_type")


def open_encoder_layers(gm: GraphModule, fake_mode) -> int:
    """Rewrite each `torch._transformer_encoder_layer_fwd` node of the graph (above); returns how many."""
    return open_calls(gm, fake_mode, torch._transformer_encoder_layer_fwd, _openable, _layer)


def _openable(node: Node) -> dict | None:
    """The call's arguments by name (mask and mask_type None where not given), or None for a call not opened."""
    if node.kwargs or not len(ARGUMENTS) - 2 <= len(node.args) <= len(ARGUMENTS):
        return None
    call = dict(zip(ARGUMENTS, node.args + (None,) * (len(ARGUMENTS) - len(node.args))))
    src, embed, heads = call["src"], call["embed"], call["heads"]
    plain = (isinstance(src, Node) and isinstance(value(src), torch.Tensor) and not value(src).is_nested
             and value(src).dim() == 3 and isinstance(embed, int) and isinstance(heads, int) and embed % heads == 0
             and same_size(shape(src)[-1], embed) and isinstance(call["use_gelu"], bool)
             and isinstance(call["norm_first"], bool) and isinstance(call["eps"], float)
             and call["mask_type"] in (None, 0, 1, 2))
    return call if plain else None


def _layer(make: NodeMaker, call: dict) -> Node:
    embed, eps = call["embed"], call["eps"]
    mask = _sdpa_mask(make, call["mask"], call["mask_type"], call["heads"])

    def norm(y, which):
        return make(F.layer_norm, y, (embed,), call[f"norm{which}_w"], call[f"norm{which}_b"], eps)

    x = call["src"]
    if call["norm_first"]:
        x = make(operator.add, x, _attend(make, call, norm(x, 1), mask))
        return make(operator.add, x, _feed(make, call, norm(x, 2)))
    x = norm(make(operator.add, x, _attend(make, call, x, mask)), 1)
    return norm(make(operator.add, x, _feed(make, call, x)), 2)


def _attend(make: NodeMaker, call: dict, y: Node, mask) -> Node:
    heads = call["heads"]
    qkv = make(F.linear, y, call["qkv_w"], call["qkv_b"])
    qkv = make("permute", make("unflatten", qkv, -1, (3, heads, call["embed"] // heads)), 2, 0, 3, 1, 4)
    q, k, v = (make(operator.getitem, qkv, i) for i in range(3))
    attention = make(F.scaled_dot_product_attention, q, k, v, attn_mask=mask)
    merged = make("flatten", make("transpose", attention, 1, 2), 2)
    return make(F.linear, merged, call["proj_w"], call["proj_b"])


def _feed(make: NodeMaker, call: dict, y: Node) -> Node:
    hidden = make(F.gelu if call["use_gelu"] else F.relu, make(F.linear, y, call["ffn1_w"], call["ffn1_b"]))
    return make(F.linear, hidden, call["ffn2_w"], call["ffn2_b"])


def _sdpa_mask(make: NodeMaker, mask, mask_type, heads: int):
    """The SDPA attn_mask of the call's mask (above): the keys its boolean masks keep, else the mask as given."""
    if mask is None:
        return None
    if mask_type == 1:
        parts = [(mask, True)]
    elif mask_type == 0:
        parts = [(mask, False)]
    else:
        parts = _merged(mask)
    kept = keys_kept(make, parts, heads) if parts else None
    if kept is not None:
        return kept
    if value(mask).dtype == torch.bool:  # True: hidden, as nn's masks; SDPA's True attends
        mask = make(torch.logical_not, mask)
    return mask if mask_type == 2 else placed(make, mask, mask_type == 1, heads)


def _merged(mask: Node) -> list | None:
    """The (mask, is a key padding mask) terms of a mask_type 2 mask, `expand(view(m, 1, 1, L, S))` (an attn_mask)
    and `expand(view(m, N, 1, 1, S))` (a key padding mask), alone or added; None for any other."""
    terms = mask.args[:2] if ADD(mask) else (mask,)
    parts = []
    for term in terms:
        if not (isinstance(term, Node) and EXPAND(term) and isinstance(term.args[0], Node) and RESHAPE(term.args[0])):
            return None
        source, dims = term.args[0].args[0], shape(term.args[0])
        if not (isinstance(source, Node) and len(shape(source)) == 2 and len(dims) == 4 and same_size(dims[1], 1)):
            return None
        if same_size(dims[0], 1):
            parts.append((source, False))
        elif same_size(dims[2], 1):
            parts.append((source, True))
        else:
            return None
    return parts
