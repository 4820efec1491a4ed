"""Small attentions stay on PyTorch's SDPA, where default torch.compile would run them.

A `fa4::attention` call costs ~85 us of host time on the H200 (Python dispatch, routing, FA4's launch)
against ~20 us for SDPA's C++ path, while both kernels take microseconds on a small attention; a model
made of such calls is host-bound and would run slower than under default torch.compile. Measured
(docs/benchmarks.md, session 6, "crossover"): back to back, SDPA wins below ~17 GFLOP of causal
attention at head dim 32 and ~35-70 at head dims 64 and 128; above, FA4 wins by up to 1.5x. Routing to
SDPA is never slower than default compile (it is default compile's kernel), so the thresholds sit on
the generous side.

Only plain attentions move: static shapes on CUDA, no mask but a causal square band, no softcap, no
run-time key data. An SDPA call is kept as written; a hand-written one becomes the SDPA call that computes
it (`is_causal`, the matched scale, K/V as the model repeated them), which default compile would not
find on its own.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from .spellings import SDPA, shape, value

DEVICES = ("cuda",)  # where the op's host path is the cost (tests add "cpu")
GFLOP_BELOW = ((32, 20.0), (256, 60.0))  # (head dims up to, GFLOP of attention below which SDPA is kept)


def small_attention(call) -> str | None:
    """Why `call` (an attention.AttentionCall) runs faster on SDPA, or None."""
    q = value(call.q)
    if q.device.type not in DEVICES or len(shape(call.q)) != 4:
        return None
    sizes = shape(call.q) + shape(call.k)[-2:]
    if not all(isinstance(s, int) for s in sizes):
        return None  # symbolic: the sizes a later call brings are unknown
    if set(call.flags) - {"causal"} or call.seqused_k is not None or call.padding is not None:
        return None
    b, h, sq, d, sk, _ = sizes
    causal = bool(call.flags.get("causal"))
    if causal and sq != sk:
        return None
    gflop = 4 * b * h * sq * sk * d / (2 if causal else 1) / 1e9
    limit = next(g for dims, g in GFLOP_BELOW if d <= dims) if d <= GFLOP_BELOW[-1][0] else 0.0
    if gflop >= limit:
        return None
    return (f"a small attention ({gflop:.2g} GFLOP, under {limit:g} at head dim {d}): SDPA's C++ path has less "
            "host overhead than the fa4 op, and its kernel is as fast here")


def sdpa_for(make, call) -> Node:
    """The SDPA call computing `call` (plain, see `small_attention`), on K/V as the model feeds them."""
    return make(torch.nn.functional.scaled_dot_product_attention, call.q, call.k, call.v,
                is_causal=bool(call.flags.get("causal")), scale=call.scale, name="sdpa_small")


def is_sdpa_call(call) -> bool:
    return SDPA(call.output)
