"""Attention calls that reach the graph as one opaque node, seen and kept with a record:

    F.multi_head_attention_forward(query, key, value, ...)       nn.MultiheadAttention: Dynamo keeps the functional
                                                                 whole (torchvision's ViT, CLIP's towers, DETR)
    flex_attention(q, k, v, score_mod, block_mask, scale, ...)   torch's flex_attention higher-order op
                                                                 (transformers' attn_implementation="flex_attention")
    torch._transformer_encoder_layer_fwd(src, ...)               nn.TransformerEncoderLayer in eval mode without
                                                                 gradients (PyTorch's fused fast path), over a
                                                                 nested tensor (`encoder_layer` opens the others)
    torch._native_multi_head_attention(q, k, v, ...)             nn.MultiheadAttention's fast path, where Dynamo takes it

None is opened here. The functional holds its projections, masks and SDPA call inside one call (decomposed later, by
AOTAutograd, past the stage these families see; `multihead_attention.open_multihead` opens most of its calls first,
and the SDPA family takes those), flex_attention its score and mask programs, the fast paths fused kernels. All stay
as written; without a record, `explain` would report a model made of them as having no attention at all.
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
        "attention inside it), which this backend opens only where its attention weights are not read and it has no "
        "bias_k / bias_v, zero attention, static K / V, dropout in training or unbatched input: kept as written",
    torch._transformer_encoder_layer_fwd:
        "nn.TransformerEncoderLayer's fused inference kernel (eval mode without gradients: PyTorch's fast path) is one "
        "call holding the whole layer, which this backend opens (encoder_layer.py) except over a nested-tensor input: "
        "kept as written",
    torch._native_multi_head_attention:
        "nn.MultiheadAttention's fused inference kernel (PyTorch's fast path) is one call, which this backend does not "
        "open: kept as written",
    torch.ops.higher_order.flex_attention:
        "flex_attention's score_mod / block_mask programs are not read by this backend: kept as written, on "
        "Inductor's flex kernel (attn_implementation='sdpa' or 'eager' code reaches fa4::attention)",
}


def is_candidate(node: Node) -> bool:
    return node.op == "call_function" and node.target in REASONS


def _keep(node: Node, context: Context) -> str | None:
    raise Decline(REASONS[node.target])


FAMILY = Family("opaque_attention", TORCH_IR, is_candidate, _keep)
