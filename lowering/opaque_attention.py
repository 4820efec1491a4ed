"""Attention calls that reach the graph as one opaque node, seen and kept with a record:

    F.multi_head_attention_forward(query, key, value, ...)       nn.MultiheadAttention: Dynamo keeps the functional
                                                                 whole (torchvision's ViT, CLIP's towers, DETR)
    flex_attention(q, k, v, score_mod, block_mask, scale, ...)   torch's flex_attention higher-order op
                                                                 (transformers' attn_implementation="flex_attention")

Neither is opened here: the first holds its projections, masks and SDPA call inside one call (decomposed later, by
AOTAutograd, past the stage these families see; `multihead_attention.open_multihead` opens its plain self-attention
first, and the SDPA family takes that), the second its score and mask programs. Both stay as written; without a
record, `explain` would report a model made of them as having no attention at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx import Node

from .family import TORCH_IR, Context, Family
from .records import Decline

REASONS = {
    F.multi_head_attention_forward:
        "nn.MultiheadAttention's F.multi_head_attention_forward is one call in Dynamo's graph (projections, masks and "
        "attention inside it), which this backend opens only for plain self-attention (one input, no mask, "
        "need_weights=False, no bias_k / bias_v, no dropout in training): kept as written",
    torch.ops.higher_order.flex_attention:
        "flex_attention's score_mod / block_mask programs are not read by this backend: kept as written, on "
        "Inductor's flex kernel (attn_implementation='sdpa' or 'eager' code reaches fa4::attention)",
}


def is_candidate(node: Node) -> bool:
    return node.op == "call_function" and node.target in REASONS


def _keep(node: Node, context: Context) -> str | None:
    raise Decline(REASONS[node.target])


FAMILY = Family("opaque_attention", TORCH_IR, is_candidate, _keep)
