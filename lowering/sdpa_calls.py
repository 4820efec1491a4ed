"""SDPA calls -> `fa4::attention`:

    F.scaled_dot_product_attention(q, k, v, attn_mask=None | a band | a padding mask, dropout_p=0.0,
                                   is_causal=?, scale=?, enable_gqa=?)

with K/V repeated for GQA or not (gqa.py folds the repetition). What SDPA computes for a boolean or -inf
mask that hides a whole row (zeros) is what the op gives such a row.
"""

from __future__ import annotations

import math

import torch
from torch.fx import Node

from . import attention
from .family import TORCH_IR, Context, Family
from .records import Decline
from .spellings import SDPA, arg, is_zero, shape, value


def match_sdpa(node: Node, constants: dict, run_time_masks: bool = False, unproven: bool = False
               ) -> attention.AttentionCall:
    q, k, v = arg(node, 0, "query"), arg(node, 1, "key"), arg(node, 2, "value")
    attn_mask = arg(node, 3, "attn_mask", None)
    dropout_p = arg(node, 4, "dropout_p", 0.0)
    is_causal = arg(node, 5, "is_causal", False)
    scale = arg(node, 6, "scale", None)
    if not is_zero(dropout_p):
        raise Decline(f"dropout_p={dropout_p} (dropout is not supported)")
    if not isinstance(is_causal, bool):
        raise Decline(f"is_causal is not a constant ({is_causal})")
    autocast = attention.check_kernel_support(q, k, v, node)
    scores_shape = shape(q)[:-1] + (shape(k)[-2],)
    flags, seqused_k, keys, blind = {}, None, None, "zeros"
    if attn_mask is not None:
        kind = "bool" if value(attn_mask).dtype == torch.bool else "additive"
        band, hidden = attention.mask_flags(kind, attn_mask, constants, scores_shape, run_time_masks=run_time_masks,
                                            unproven=unproven)
        flags, seqused_k, keys = attention.flags_for(band, scores_shape)
        blind = "nan" if kind == "additive" and attention.keeps_scores(hidden) else \
            attention.blind_rows_of([hidden], sdpa=True)
    if is_causal:
        attention.require_square(scores_shape, "is_causal")
        flags["causal"] = True
    if scale is None:
        scale = 1.0 / math.sqrt(int(shape(q)[-1]))
    elif attention.constant(scale) is None:
        raise Decline(f"scale is not a constant ({scale})")
    return attention.AttentionCall(q, k, v, output=node, scale=attention.positive_scale(attention.constant(scale)), flags=flags, matched=[node],
                         seqused_k=seqused_k, padding=keys, blind_rows=blind, autocast=autocast,
                         masks=[(attn_mask, node)] if isinstance(attn_mask, Node) else [])


def _rewrite(node: Node, context: Context) -> str | None:
    return attention.rewrite_or_retry(
        lambda run_time_masks, unproven: match_sdpa(node, context.constants, run_time_masks, unproven), context)


FAMILY = Family("sdpa", TORCH_IR, SDPA, _rewrite)
