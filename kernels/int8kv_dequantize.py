"""The fallback route of `fa4::attention_int8kv` (routes.INT8KV): K and V dequantized to q's dtype, then
`fa4::attention_forward`'s own walk (`routes.FORWARD`: cuDNN SDPA, our decode kernel, FA4, the SDPA fallback).

    K = (k.float() * k_scale[..., None]).to(q.dtype),   V = (v.float() * v_scale[..., None]).to(q.dtype)

It takes every call the op takes: prefill through an int8 cache, and decode where no int8 kernel is installed
or takes the call. It writes the dequantized cache to memory (2 bytes a value, against 1 read), so decode over
it moves three times the int8 kernel's bytes; K/V are rounded once more, to q's dtype, which the op's
contract (float32 products) does not do: the difference is within that dtype's rounding of K/V.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, *, k_scale: Tensor, v_scale: Tensor,
                       seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """The fallback takes every call."""
    return None


def dequantize(x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """int8 [B, H, S, D] times float32 [B, H, S] per (token, head), rounded once to float32, then to `dtype`."""
    return (x.float() * scale[..., None]).to(dtype)


def forward(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor, seqused_k: Optional[Tensor] = None,
            key_mask: Optional[Tensor] = None, **flags) -> tuple[Tensor, Tensor]:
    """(out, lse) of `fa4::attention_forward` over the dequantized K/V."""
    return torch.ops.fa4.attention_forward.default(q, dequantize(k, k_scale, q.dtype), dequantize(v, v_scale, q.dtype),
                                                   seqused_k, key_mask, **flags)
