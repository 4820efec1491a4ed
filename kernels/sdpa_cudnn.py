"""CUDA forward of `fa4::attention` for decode-shaped calls with one cache length for the whole batch:
PyTorch's cuDNN SDPA kernel, which reads grouped K/V heads natively.

Why it exists: on such calls (no seqused_k, no key mask) it is what `F.scaled_dot_product_attention(...,
enable_gqa=True)` runs on the H200 (torch 2.11, cuDNN 9), and it is 1-25% faster than our split-KV
decode kernel there (docs/benchmarks.md, session 4, run 3: 37.8 against 38.3 us at b1 x 32k keys,
6.7 against 8.9 at b1 x 1k); PyTorch's flash kernel is slower than both (46.8 us at b1 x 32k). Our kernel keeps
the calls that carry per-sequence lengths or a padding mask (every HF static-cache step), which
this kernel could take only with a bias over the whole cache. FA4_INDUCTOR_DECODE_EVERYWHERE=1
sends these calls to our decode kernel as well (A/B benchmarks).

What it takes (`unsupported_reason`): float16 / bfloat16 on sm90 with cuDNN, head_dim == head_dim_v,
a multiple of 8 up to 128 (where it was measured); unit stride on the head dim; no seqused_k, key mask,
softcap or window; causal only with one query token or as many queries as keys (bottom-right with Sq = 1
hides nothing, with Sq = Sk it is top-left, SDPA's alignment; other Sq have no spelling here).

Its second use (`small_reason`): small attentions of any shape it can spell (`crossover.small`, the measured
crossover against FA4), which lowering keeps as SDPA calls when it sees their sizes but which reach the op in
dynamic-shape graphs: there FA4's longer host path lost to default compile's SDPA (the size sweep's hidden-256
Llama at batch 8, 128-2048 tokens: 0.61-0.78x, docs/benchmarks.md session 15). FA4_INDUCTOR_SMALL_ON_FA4=1
keeps them on FA4.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import crossover, layout, switches
from .flags import Flags

DTYPES = layout.HALF_DTYPES
MAX_HEAD_DIM = 128
_CUDNN = torch.ops.aten._scaled_dot_product_cudnn_attention.default


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                       key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """Why cuDNN SDPA should not take this decode-shaped call, or None if it should (module docstring)."""
    return (switches.gate("cuDNN SDPA", switches.DECODE_EVERYWHERE, q, DTYPES)
            or _spelling_reason(q, k, v, seqused_k, key_mask, Flags(**flags)))


def small_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                 key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """Why cuDNN SDPA should not take this call as a small attention (`crossover.small`), or None if it should."""
    f = Flags(**flags)
    b, h, sq, d = q.shape
    if not crossover.small(b, h, sq, k.shape[2], d, f.causal):
        return "not a small attention (crossover.py): FA4's host path is worth it"
    return (switches.gate("cuDNN SDPA for small attentions", switches.SMALL_ON_FA4, q, DTYPES)
            or _spelling_reason(q, k, v, seqused_k, key_mask, f))


def _spelling_reason(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor], key_mask: Optional[Tensor],
                     f: Flags) -> str | None:
    """Why cuDNN SDPA cannot say what the op's call asks, or was not measured there; None if it can."""
    if switches.capability(q.device.index)[0] != 9 or not torch.backends.cudnn.is_available():
        return "cuDNN SDPA is taken on sm90 with cuDNN only (where it was measured)"
    if seqused_k is not None or key_mask is not None:
        return "per-sequence cache lengths or a key mask: cuDNN SDPA would need a bias over the whole cache"
    if f.softcap > 0 or f.window_left >= 0 or f.window_right >= 0:
        return "softcap or a local window: no cuDNN SDPA spelling"
    if f.causal and 1 < q.shape[2] != k.shape[2]:
        return "causal with several query tokens over more keys: SDPA's causal mask is top-left aligned"
    d = q.shape[-1]
    if v.shape[-1] != d or d % 8 or d > MAX_HEAD_DIM:
        return f"cuDNN SDPA is taken for equal head dims, multiples of 8 up to {MAX_HEAD_DIM}; got ({d}, {v.shape[-1]})"
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "cuDNN SDPA wants a unit stride on the head dim"
    return None


def forward(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
            **flags) -> tuple[Tensor, Tensor]:
    """(out [B, Hq, Sq, D] stored as [B, Sq, Hq, D], lse [B, Hq, Sq] float32, natural log). One cache length
    for the batch: no seqused_k, no key mask."""
    if seqused_k is not None or key_mask is not None:
        raise ValueError("cuDNN SDPA is taken with neither seqused_k nor a key mask")
    b, hq, sq, d = q.shape
    # Flags read without building `Flags`: this runs on the host path of every small attention.
    causal = flags.get("causal", False) and sq > 1  # one query token sees every key; several, as many as keys
    out, lse = _CUDNN(q, k, v, None, True, 0.0, causal, False, scale=flags["scale"])[:2]
    strides = (sq * hq * d, d, hq * d, 1)
    if out.stride() != strides:
        # One query token: a contiguous [B, Hq, 1, D] result already is the op's layout, but for a
        # size-1 stride; relabel it rather than pay a copy kernel (1-1.5 us a call on the H200).
        out = out.as_strided(out.shape, strides) if sq == 1 and out.is_contiguous() else layout.bhsd_copy(out)
    return out, lse.reshape(b, hq, sq).float()
