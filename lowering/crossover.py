"""Small attentions in host-bound graphs stay on PyTorch's SDPA, where default torch.compile runs them.

What is small, and why SDPA wins there, is the kernels' fact (`kernels/crossover.py`, measured): a
graph whose GPU work per layer is small is host-bound, and would run slower than under default
torch.compile with the op's host path in every layer.

Where the GPU work per attention is large (a graph's matmul and attention GFLOP per attention candidate
at or over LAYER_GFLOP_HOST_BOUND), host time hides behind it and the op stays (FA4's GPU time is the
lower, or within ~10%, on every measured row). Only static shapes on CUDA, self-attention (Sq == Sk,
what was measured), and no KV cache (the op reads it un-repeated, where SDPA code repeats K/V at every
step; HF's generate passes a decode step's cache as keys under a padding mask, Sq < Sk). An SDPA call is kept as written,
whatever its mask (the sweep's padded small-model prefill ran 0.55x on the op: the padding mask's form
is read on the host, a sync); a hand-written one without a mask other than a causal square band, or a
softcap, becomes the SDPA call that computes it (`is_causal`, the matched scale, K/V as the model
repeated them), which default compile would not find on its own.
"""

from __future__ import annotations

import math

import torch
from torch.fx import Node

from ..kernels import crossover as kernel_crossover
from .spellings import LINEAR, MATMUL, SDPA, SOFTMAX, shape, value

DEVICES = ("cuda",)  # where the op's host path is the cost (tests add "cpu")
# Below this much GPU work per attention a graph's host time is not hidden: HF models carry ~1 ms of host
# time per forward at two layers (the size sweep's hidden-256 Llama was host-bound at 84 GFLOP per attention).
LAYER_GFLOP_HOST_BOUND = 100.0


attention_gflop, gflop_limit = kernel_crossover.attention_gflop, kernel_crossover.gflop_limit


def small_attention(call, graph, shared: dict) -> str | None:
    """Why `call` (an attention.AttentionCall) runs faster on SDPA, or None. The graph's GPU work per
    attention (`gflop_per_attention`) is computed once per graph, in `shared`, and only when asked."""
    q = value(call.q)
    if q.device.type not in DEVICES or len(shape(call.q)) != 4:
        return None
    sizes = shape(call.q) + shape(call.k)[-2:]
    if not all(isinstance(s, int) for s in sizes):
        return None  # symbolic: the sizes a later call brings are unknown
    if call.seqused_k is not None:
        return None  # a KV cache: the op reads it un-repeated, where SDPA code repeats K/V every step
    b, h, sq, d, sk, _ = sizes
    if sq != sk:
        return None  # measured on self-attention; a decode step over a cache (a key mask, not seqused_k) is not
    causal = bool(call.flags.get("causal"))
    if not is_sdpa_call(call) and (set(call.flags) - {"causal"} or call.padding is not None or (causal and sq != sk)):
        return None  # the SDPA call a hand-written attention becomes has no mask, at most is_causal
    gflop, limit = attention_gflop(b, h, sq, sk, d, causal), gflop_limit(d)
    if gflop >= limit:
        return None
    if "gflop_per_attention" not in shared:
        shared["gflop_per_attention"] = gflop_per_attention(graph)
    layer_gflop = shared["gflop_per_attention"]
    if layer_gflop is None or layer_gflop >= LAYER_GFLOP_HOST_BOUND:
        return None
    return (f"a small attention ({gflop:.2g} GFLOP, under {limit:g} at head dim {d}) in a host-bound graph "
            f"({layer_gflop:.2g} GFLOP per attention): SDPA's C++ path has less host overhead than the fa4 op")


def gflop_per_attention(graph) -> float | None:
    """The matmul and attention GFLOP of a graph per attention candidate (SDPA call or softmax); None when a
    size is symbolic or the graph has no candidate. Hand-written attention counts through its matmuls."""
    total, attentions = 0.0, 0
    for node in graph.nodes:
        try:
            if SDPA(node):
                attentions += 1
                q, k = shape(node.args[0]), shape(node.args[1])
                total += attention_gflop(math.prod(q[:-2]), 1, q[-2], k[-2], q[-1])
            elif SOFTMAX(node):
                attentions += 1
            elif MATMUL(node) or LINEAR(node):
                out, a = shape(node), shape(node.args[0])
                total += 2 * math.prod(out) * a[-1] / 1e9
        except (TypeError, AttributeError, IndexError):
            continue  # an operand without an example value
    if not attentions or not isinstance(total, float):
        return None
    return total / attentions


def sdpa_for(make, call) -> Node:
    """The SDPA call computing `call` (plain, see `small_attention`), on K/V as the model feeds them."""
    return make(torch.nn.functional.scaled_dot_product_attention, call.q, call.k, call.v,
                is_causal=bool(call.flags.get("causal")), scale=call.scale, name="sdpa_small")


def is_sdpa_call(call) -> bool:
    return SDPA(call.output)
