"""nn.MultiheadAttention's calls, opened into the SDPA call they compute, before the families run.

Dynamo keeps `F.multi_head_attention_forward` whole, one node (the projections, masks and attention inside it).
Sequence first (x [L, N, E], key / value [S, N, E]; heads H of D), a call computes

    q = F.linear(x, Wq, bq)                     one packed in-projection [Wq; Wk; Wv] (self-attention: one linear,
    k = F.linear(key, Wk, bk)                   cut into q / k / v; key is value: one linear for k / v), or
    v = F.linear(value, Wv, bv)                 separate q / k / v weights (kdim / vdim not E)
    q, k, v = (t.unflatten(-1, (H, D)).permute(1, 2, 0, 3) for t in (q, k, v))          [N, H, L or S, D]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    out = F.linear(o.permute(2, 0, 1, 3).flatten(2), out_proj_weight, out_proj_bias)       [L, N, E]

`open_multihead` writes each such call so, where the SDPA family then finds it. Masks: nn.MultiheadAttention turns a
boolean mask (True: hidden) into a float one (`zeros_like(m).masked_fill_(m, -inf)`) before the call; such a mask is
read back as its boolean m, and the masks go to SDPA as the keys they keep, `~attn_mask` ([L, S], or [N * H, L, S]
as [N, H, L, S]) and `~key_padding_mask[:, None, None, :]`, joined by `&`. With a float mask the caller made, the
masks are added as the call adds them (a boolean one as `where(keep, 0, -inf)`). `is_causal` is the call's hint: SDPA's causal flag where the call passes it
(no key padding mask, weights not asked for), else the mask. Attention weights asked for but not read are not
computed (the output is the same). Any other call (its weights read, bias_k / bias_v, zero attention, static K / V,
dropout in training, unbatched input) stays one node, kept with its record (`opaque_attention`).
"""

from __future__ import annotations

import inspect
import math
import operator

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from .graph_edit import NodeMaker, open_calls
from .spellings import is_zero, same_size, shape, value

SIGNATURE = inspect.signature(F.multi_head_attention_forward)
ABSENT = ("bias_k", "bias_v", "static_k", "static_v")
ALL_KEYS = (slice(None), None, None, slice(None))


def open_multihead(gm: GraphModule, fake_mode) -> int:
    """Rewrite each `F.multi_head_attention_forward` node of the graph that computes the above; returns how many."""
    return open_calls(gm, fake_mode, F.multi_head_attention_forward, _openable, _attention)


def _attention(make: NodeMaker, call: dict) -> Node:
    """The call's output [L, N, E], as the SDPA call it computes."""
    q, k, v = _projected_heads(make, call)
    mask, causal = _sdpa_mask(make, call)
    attention = make(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, is_causal=causal)
    merged = make("flatten", make("permute", attention, 2, 0, 1, 3), 2)
    return make(F.linear, merged, call["out_proj_weight"], call["out_proj_bias"])


def _projected_heads(make: NodeMaker, call: dict) -> tuple[Node, Node, Node]:
    """q, k, v as [N, H, L or S, D], projected as the call projects them."""
    heads, embed = call["num_heads"], call["embed_dim_to_check"]
    x, key, val = call["query"], call["key"], call["value"]
    head_dim = embed // heads

    def split(projected, parts):
        """[T, N, parts * E] -> `parts` tensors of [N, H, T, D]."""
        if parts == 1:
            return [make("permute", make("unflatten", projected, -1, (heads, head_dim)), 1, 2, 0, 3)]
        stacked = make("permute", make("unflatten", projected, -1, (parts, heads, head_dim)), 2, 1, 3, 0, 4)
        return [make(operator.getitem, stacked, i) for i in range(parts)]

    def rows(tensor, start, stop):
        return None if tensor is None else make(operator.getitem, tensor, slice(start, stop))

    weight, bias = call["in_proj_weight"], call["in_proj_bias"]
    if call["use_separate_proj_weight"]:
        weights = (call["q_proj_weight"], call["k_proj_weight"], call["v_proj_weight"])
        inputs = ((x, 0), (key, 1), (val, 2))
        return tuple(split(make(F.linear, t, w, rows(bias, i * embed, (i + 1) * embed)), 1)[0]
                     for (t, i), w in zip(inputs, weights))
    if key is x and val is x:
        return tuple(split(make(F.linear, x, weight, bias), 3))
    q = split(make(F.linear, x, rows(weight, 0, embed), rows(bias, 0, embed)), 1)[0]
    if key is val:
        k, v = split(make(F.linear, key, rows(weight, embed, None), rows(bias, embed, None)), 2)
        return q, k, v
    k, v = (split(make(F.linear, t, rows(weight, i * embed, (i + 1) * embed), rows(bias, i * embed, (i + 1) * embed)),
                  1)[0] for t, i in ((key, 1), (val, 2)))
    return q, k, v


def _sdpa_mask(make: NodeMaker, call: dict) -> tuple[Node | None, bool]:
    """The SDPA call's attn_mask and is_causal (above)."""
    attn_mask, padding = call["attn_mask"], call["key_padding_mask"]
    if call["is_causal"] and padding is None and not call["need_weights"]:
        return None, True
    heads = call["num_heads"]
    masks = [(m, padded) for m, padded in ((attn_mask, False), (padding, True)) if m is not None]
    if not masks:
        return None, False
    if (kept := keys_kept(make, masks, heads)) is not None:
        return kept, False
    dtype = value(call["query"]).dtype
    added = []
    for m, padded in masks:
        h = hidden_where(m)
        added.append(placed(make, m, padded, heads) if h is None else make(
            "to", make(torch.where, placed(make, make(torch.logical_not, h), padded, heads), 0.0, -math.inf), dtype))
    return (added[0] if len(added) == 1 else make(operator.add, *added)), False


def keys_kept(make: NodeMaker, masks: list, heads: int) -> Node | None:
    """The boolean SDPA mask (True: attend) of `masks`, (mask, is a key padding mask) pairs whose masks are boolean
    (True: hidden) or nn's float masks made from one (`hidden_where`), joined by `&`; None where one is a float mask
    of other values."""
    hidden = [hidden_where(m) for m, _ in masks]
    if any(h is None for h in hidden):
        return None
    kept = [placed(make, make(torch.logical_not, h), padded, heads) for h, (_, padded) in zip(hidden, masks)]
    return kept[0] if len(kept) == 1 else make(operator.and_, *kept)


def placed(make: NodeMaker, mask: Node, padding: bool, heads: int) -> Node:
    """A mask as SDPA broadcasts it over [N, H, L, S]: a key_padding_mask [N, S] as [N, 1, 1, S]; an attn_mask [L, S]
    as it is, [N * H, L, S] as [N, H, L, S]."""
    if padding:
        return make(operator.getitem, mask, ALL_KEYS)
    return make("unflatten", mask, 0, (-1, heads)) if len(shape(mask)) == 3 else mask


def hidden_where(mask: Node) -> Node | None:
    """The boolean m (True: hidden) of a boolean mask, or of nn.MultiheadAttention's float mask made from one:
    `torch.zeros_like(m, dtype=...).masked_fill_(m, -inf)`; None for a float mask of other values."""
    if value(mask).dtype == torch.bool:
        return mask
    if not (mask.op == "call_method" and mask.target in ("masked_fill_", "masked_fill") and len(mask.args) == 3):
        return None
    zeros, condition, fill = mask.args
    made_from = (isinstance(zeros, Node) and zeros.op == "call_function" and zeros.target is torch.zeros_like
                 and zeros.args[0] is condition and len(zeros.users) == 1)
    is_bool = isinstance(condition, Node) and value(condition).dtype == torch.bool
    return condition if made_from and is_bool and fill == -math.inf else None


def _openable(node: Node) -> dict | None:
    """The bound arguments of a call `open_multihead` rewrites, or None."""
    try:
        bound = SIGNATURE.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    call = bound.arguments
    x, key, val = call["query"], call["key"], call["value"]
    heads = call["num_heads"]
    tensors = (x, key, val)
    if not (all(isinstance(t, Node) and value(t).dim() == 3 for t in tensors) and isinstance(heads, int)):
        return None
    (length, batch, _), source = shape(x), shape(key)[0]
    embed = call["embed_dim_to_check"]
    users = list(node.users)
    plain = (isinstance(embed, int) and embed % heads == 0 and same_size(shape(x)[-1], embed)
             and same_size(shape(val)[0], source)
             and all(same_size(shape(t)[1], batch) for t in (key, val))
             and all(call[name] is None for name in ABSENT) and call["add_zero_attn"] is False
             and (is_zero(call["dropout_p"]) or call["training"] is False)
             and len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0
             and _weights_fit(call, embed)
             and _mask_fits(call["attn_mask"], ((length, source), (batch * heads, length, source)))
             and _mask_fits(call["key_padding_mask"], ((batch, source),))
             and not (call["is_causal"] and call["attn_mask"] is None))
    return call if plain else None


def _weights_fit(call: dict, embed: int) -> bool:
    """Projection weights of the shapes the call reads: a packed [3E, E] (and bias [3E]) or separate [E, *] ones."""
    weight, bias = call["in_proj_weight"], call["in_proj_bias"]
    if bias is not None and not (isinstance(bias, Node) and shape(bias) == (3 * embed,)):
        return False
    if call["use_separate_proj_weight"]:
        return all(isinstance(call[f"{p}_proj_weight"], Node) and shape(call[f"{p}_proj_weight"])[0] == embed
                   and same_size(shape(call[f"{p}_proj_weight"])[1], shape(call[name])[-1])
                   for p, name in (("q", "query"), ("k", "key"), ("v", "value")))
    return (isinstance(weight, Node) and shape(weight) == (3 * embed, embed)
            and all(same_size(shape(call[name])[-1], embed) for name in ("key", "value")))


def _mask_fits(mask, shapes) -> bool:
    if mask is None:
        return True
    if not isinstance(mask, Node) or not isinstance(value(mask), torch.Tensor):
        return False
    dims = shape(mask)
    return any(len(dims) == len(s) and all(same_size(a, b) for a, b in zip(dims, s)) for s in shapes)
