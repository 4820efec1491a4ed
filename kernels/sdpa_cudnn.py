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
softcap or window; causal only with one query token (bottom-right with Sq = 1 hides nothing, and
SDPA's causal mask is top-left aligned, so Sq > 1 has no spelling here).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import layout, switches
from .flags import Flags

DTYPES = layout.HALF_DTYPES
MAX_HEAD_DIM = 128


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                       key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """Why cuDNN SDPA should not take this decode-shaped call, or None if it should (module docstring)."""
    f = Flags(**flags)
    reason = switches.gate("cuDNN SDPA", switches.DECODE_EVERYWHERE, q, DTYPES)
    if reason is not None:
        return reason
    if switches.capability(q.device.index)[0] != 9 or not torch.backends.cudnn.is_available():
        return "cuDNN SDPA is taken on sm90 with cuDNN only (where it was measured)"
    if seqused_k is not None or key_mask is not None:
        return "per-sequence cache lengths or a key mask: cuDNN SDPA would need a bias over the whole cache"
    if f.softcap > 0 or f.window_left >= 0 or f.window_right >= 0:
        return "softcap or a local window: no cuDNN SDPA spelling"
    if f.causal and q.shape[2] > 1:
        return "causal with several query tokens: SDPA's causal mask is top-left aligned"
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
    scale = Flags(**flags).scale
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False,
                                                                   scale=scale)[:2]
    b, hq, sq, d = q.shape
    strides = (sq * hq * d, d, hq * d, 1)
    if out.stride() != strides:
        # One query token: a contiguous [B, Hq, 1, D] result already is the op's layout, but for a
        # size-1 stride; relabel it rather than pay a copy kernel (1-1.5 us a call on the H200).
        out = out.as_strided(out.shape, strides) if sq == 1 and out.is_contiguous() else layout.bhsd_copy(out)
    return out, lse.reshape(b, hq, sq).float()
