"""nn.MultiheadAttention's self-attention, opened into the SDPA call it computes, before the families run.

Dynamo keeps `F.multi_head_attention_forward` whole, one node (the projections, masks and attention inside it). Its
plainest call, torchvision ViT's encoder block (self-attention, packed in-projection, no mask, `need_weights=False`),
computes

    qkv = F.linear(x, in_proj_weight, in_proj_bias)               x [L, N, E] (sequence first)
    q, k, v = qkv.unflatten(-1, (3, H, D)).permute(2, 1, 3, 0, 4).unbind(0)      [N, H, L, D] each
    o = F.scaled_dot_product_attention(q, k, v)
    out = F.linear(o.permute(2, 0, 1, 3).flatten(2), out_proj_weight, out_proj_bias)          [L, N, E]

`open_multihead` writes each such call so, where the SDPA family then finds it. Any other call (attention weights
asked for, masks, separate K / V inputs or projections, bias_k / bias_v, zero attention, static K / V, dropout in
training, unbatched input) stays one node, kept with its record (`opaque_attention`).
"""

from __future__ import annotations

import inspect
import operator

import torch.nn.functional as F
from torch.fx import GraphModule, Node

from .graph_edit import NodeMaker
from .spellings import value

SIGNATURE = inspect.signature(F.multi_head_attention_forward)
ABSENT = ("bias_k", "bias_v", "key_padding_mask", "attn_mask", "q_proj_weight", "k_proj_weight", "v_proj_weight",
          "static_k", "static_v")


def open_multihead(gm: GraphModule, fake_mode) -> int:
    """Rewrite each plain self-attention `F.multi_head_attention_forward` node of the graph (above); returns how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.multi_head_attention_forward:
            continue
        call = _plain_self_attention(node)
        if call is None:
            continue
        (out_user,) = node.users
        with gm.graph.inserting_before(node):
            make = NodeMaker(gm.graph, node, fake_mode)
            x, heads = call["query"], call["num_heads"]
            head_dim = value(call["in_proj_weight"]).shape[1] // heads
            qkv = make(F.linear, x, call["in_proj_weight"], call["in_proj_bias"])
            qkv = make("permute", make("unflatten", qkv, -1, (3, heads, head_dim)), 2, 1, 3, 0, 4)
            q, k, v = (make(operator.getitem, qkv, i) for i in range(3))
            attention = make(F.scaled_dot_product_attention, q, k, v)
            merged = make("flatten", make("permute", attention, 2, 0, 1, 3), 2)
            out = make(F.linear, merged, call["out_proj_weight"], call["out_proj_bias"])
        out_user.replace_all_uses_with(out)
        gm.graph.erase_node(out_user)
        gm.graph.erase_node(node)
        done += 1
    return done


def _plain_self_attention(node: Node) -> dict | None:
    """The bound arguments of a call `open_multihead` rewrites, or None."""
    try:
        bound = SIGNATURE.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    call = bound.arguments
    x = call["query"]
    users = list(node.users)
    weight = call["in_proj_weight"]
    plain = (isinstance(x, Node) and call["key"] is x and call["value"] is x and value(x).dim() == 3
             and isinstance(weight, Node) and not call["use_separate_proj_weight"]
             and isinstance(call["num_heads"], int) and isinstance(value(weight).shape[1], int)
             and value(weight).shape[1] % call["num_heads"] == 0
             and all(call[name] is None for name in ABSENT) and call["add_zero_attn"] is False
             and call["need_weights"] is False and call["is_causal"] is False
             and (call["dropout_p"] == 0 or call["training"] is False)
             and len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0)
    return call if plain else None
