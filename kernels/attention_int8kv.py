"""`fa4::attention_int8kv`: attention over an int8 KV cache with a float32 scale per (token, KV head). Forward only.

    out, lse = torch.ops.fa4.attention_int8kv(q, k, v, k_scale, v_scale, seqused_k=None, key_mask=None, *, scale,
                                              causal=False, window_left=-1, window_right=-1, softcap=0.0)

q [B, Hq, Sq, D] as for `fa4::attention`; k [B, Hkv, Sk, D] and v [B, Hkv, Sk, Dv] int8; k_scale, v_scale
[B, Hkv, Sk] float32, any strides. The result is `fa4::attention_forward(q, K, V, seqused_k, key_mask, **flags)`
(same flags, masks, GQA, outputs and layout: out in q's dtype stored as [B, Sq, Hq, Dv], lse [B, Hq, Sq]
float32, float64 for float64 q) over

    K = k.float() * k_scale[..., None],   V = v.float() * v_scale[..., None]

each product rounded once to float32 and not rounded to q's dtype. The reference (the CPU body) computes
exactly that: those float32 K/V, then `reference.attention_forward` (scores, softmax and P @ V in float32,
float64 for float64 q). It is the dequantized cache's attention: the quantization itself (what
`fa4_inductor.Int8StaticCache` stores) is the caller's. Values of k/v past `seqused_k` or hidden by the
masks never reach the output (their scales may be anything finite, or zero: an unwritten cache slot).

There is no autograd formula: this is an inference op (an int8 cache holds no gradient); lowering emits it
only where nothing requires a gradient.

CUDA: the first route of `routes.INT8KV` that takes the call: the int8-KV decode kernel (`decode_int8kv.py`,
K/V read as int8: half the bytes of a bf16 cache), else `int8kv_dequantize.py`, which dequantizes K/V to
q's dtype and runs `fa4::attention_forward`'s routes (prefill through an int8 cache); `kernel_for` says
which and why, `_route` remembers it per call signature.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import Tensor

from . import attention, layout, library, reference, routes, switches
from .flags import SCHEMA as FLAGS_SCHEMA

log = logging.getLogger("fa4_inductor.kernels")

SCALE_DTYPE = torch.float32


def unsupported_reason(device_type: str, dtype: torch.dtype, head_dim: int, head_dim_v: int) -> str | None:
    """Why `fa4::attention_int8kv` cannot take a q of this kind on this device (the check lowering asks), or None:
    what `fa4::attention` takes, since every call can take the dequantizing route."""
    return attention.unsupported_reason(device_type, dtype, head_dim, head_dim_v)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor, seqused_k: Optional[Tensor],
                  key_mask: Optional[Tensor], flags: Optional[dict]) -> None:
    attention._check_inputs(q, k, v, seqused_k, key_mask, flags, kv_dtype=torch.int8)
    for name, s, x in (("k_scale", k_scale, k), ("v_scale", v_scale, v)):
        if s.dtype != SCALE_DTYPE:
            raise ValueError(f"fa4::attention_int8kv wants a float32 {name}, got {s.dtype}")
        if s.dim() != 3:
            raise ValueError(f"fa4::attention_int8kv wants a 3-D {name} [B, Hkv, Sk], got {s.dim()} dims")
        torch._check(s.shape == x.shape[:3], lambda: f"{name} must have shape [B, Hkv, Sk]")


def dequantized(x: Tensor, scale: Tensor) -> Tensor:
    """x.float() * scale[..., None]: the K or V the op attends over."""
    return x.float() * scale[..., None]


library.define("attention_int8kv(Tensor q, Tensor k, Tensor v, Tensor k_scale, Tensor v_scale, "
               f"Tensor? seqused_k=None, Tensor? key_mask=None, *, {FLAGS_SCHEMA}) -> (Tensor, Tensor)")


def attention_int8kv(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor,
                     seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None, **flags
                     ) -> tuple[Tensor, Tensor]:
    """The reference: K/V dequantized in float32, then `reference.forward`."""
    _check_inputs(q, k, v, k_scale, v_scale, seqused_k, key_mask, flags)
    return reference.forward(q, dequantized(k, k_scale), dequantized(v, v_scale), seqused_k, key_mask,
                             **attention._complete(flags))


def kernel_for(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor, key_mask: Optional[Tensor] = None,
               *, seqused_k: Optional[Tensor] = None, **flags) -> tuple[str, str]:
    """(kernel name, why) for a call: "decode_int8kv", "dequantize" (then `attention.kernel_for` of the
    dequantized call says which kernel runs it) or "reference" (not CUDA)."""
    if q.device.type != "cuda":
        return routes.REFERENCE.name, f"{q.device.type} runs the reference"
    route, declined = routes.choose(routes.INT8KV, q, k, v, seqused_k, key_mask, flags, k_scale=k_scale,
                                    v_scale=v_scale)
    return route.name, routes.why(route, declined)


_ROUTES = layout.SignatureCache(1024)


def _route(q, k, v, k_scale, v_scale, seqused_k, key_mask, flags: dict) -> routes.Route:
    key = (layout.describe(q, k, v, k_scale, v_scale, seqused_k, key_mask), tuple(flags.values()),
           switches.current().routing)
    route = _ROUTES.get(key)
    if route is None:
        _check_inputs(q, k, v, k_scale, v_scale, seqused_k, key_mask, flags)
        route, declined = routes.choose(routes.INT8KV, q, k, v, seqused_k, key_mask, flags, k_scale=k_scale,
                                        v_scale=v_scale)
        log.debug("fa4::attention_int8kv q%s k%s %s: kernel %s (%s)", tuple(q.shape), tuple(k.shape), q.dtype,
                  route.name, routes.why(route, declined))
        _ROUTES[key] = route
    return route


def _attention_int8kv_cuda(q, k, v, k_scale, v_scale, seqused_k=None, key_mask=None, **flags):
    flags = attention.device_flags(flags, k.shape[2])
    route = _route(q, k, v, k_scale, v_scale, seqused_k, key_mask, flags)
    return route.adapter.forward(q, k, v, k_scale, v_scale, seqused_k, key_mask, **flags)


def _attention_int8kv_fake(q, k, v, k_scale, v_scale, seqused_k=None, key_mask=None, **flags):
    _check_inputs(q, k, v, k_scale, v_scale, seqused_k, key_mask, flags)
    return attention._forward_outputs(q, v)


library.impl("attention_int8kv", attention_int8kv, "CompositeExplicitAutograd")
library.impl("attention_int8kv", _attention_int8kv_cuda, "CUDA")
library.register_fake("attention_int8kv", _attention_int8kv_fake)
