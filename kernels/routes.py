"""The CUDA kernels behind `fa4::attention`, as ordered tables of routes: a call goes to the first
route whose `unsupported_reason` returns None.

A route is a name, whether it takes a call, and the adapter module that runs it:
    unsupported_reason(q, k, v, *, seqused_k=None, key_mask=None, **flags) -> str | None
    adapter.forward(q, k, v, seqused_k, key_mask, **flags) -> (out, lse)
    adapter.backward(grad_out, q, k, v, out, lse, grad_lse, seqused_k, key_mask, **flags) -> (dq, dk, dv)
(flags: `flags.Flags`'s fields; only the backward table's adapters have `backward`). The op looks
`forward` / `backward` up on the module when it calls them, as it would a module function.

Forward order (`FORWARD`): cuDNN SDPA for fixed-length decode calls, our split-KV decode kernel for the other
decode-shaped ones, cuDNN SDPA for small unmasked attentions (`crossover.small`), FA4, the SDPA fallback, the
reference; the backward has FA4, the SDPA fallback's
recomputing backward, the reference. The reference takes every call, so a walk always ends.
`INT8KV` (`fa4::attention_int8kv`): the int8-KV decode kernel, then the dequantizing
fallback, which takes every call.
`fa4::attention`'s host rewrites of a key mask (`attention.key_mask_form`) stay outside the tables.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable, NamedTuple, Optional

from torch import Tensor

from . import decode, decode_int8kv, fa4, int8kv_dequantize, reference, sdpa_cudnn, sdpa_fallback


class Route(NamedTuple):
    name: str
    unsupported_reason: Callable[..., Optional[str]]
    adapter: ModuleType
    takes: Optional[str]
    """Why the route runs a call it takes (the reasons of the routes before it that declined follow in
    parentheses); None for a fallback, whose why is those reasons alone."""


def _sdpa_cudnn_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                       key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """cuDNN SDPA takes decode-shaped calls our decode kernel would take, where it was measured faster."""
    return (decode.dispatch_reason(q, k, v, seqused_k=seqused_k, key_mask=key_mask, **flags)
            or sdpa_cudnn.unsupported_reason(q, k, v, seqused_k=seqused_k, key_mask=key_mask, **flags))


SDPA_CUDNN = Route("sdpa_cudnn", _sdpa_cudnn_reason, sdpa_cudnn,
                   "decode-shaped with one cache length: cuDNN SDPA (GQA-native) is faster here")
DECODE = Route("decode", decode.dispatch_reason, decode, "decode-shaped: the split-KV decode kernel takes this call")
SDPA_SMALL = Route("sdpa_small", sdpa_cudnn.small_reason, sdpa_cudnn,
                   "a small attention: cuDNN SDPA's shorter host path wins (crossover.py)")
FA4 = Route("fa4", fa4.unsupported_reason, fa4, "FA4 takes this call")
SDPA = Route("sdpa", sdpa_fallback.unsupported_reason, sdpa_fallback, None)
REFERENCE = Route("reference", reference.unsupported_reason, reference, None)

FORWARD = (SDPA_CUDNN, DECODE, SDPA_SMALL, FA4, SDPA, REFERENCE)
BACKWARD = (FA4, SDPA, REFERENCE)

# `fa4::attention_int8kv` (int8 k, v with float32 per-(token, KV head) scales; kernels/attention_int8kv.py): the
# adapters take the scales as keywords, `unsupported_reason(q, k, v, *, k_scale, v_scale, seqused_k=None,
# key_mask=None, **flags)` and `forward(q, k, v, k_scale, v_scale, seqused_k, key_mask, **flags)`. The int8 decode
# kernel reads the cache as it is; the fallback dequantizes K/V to q's dtype and takes `FORWARD`'s walk.
DECODE_INT8KV = Route("decode_int8kv", decode_int8kv.unsupported_reason, decode_int8kv,
                      "the int8-KV decode kernel takes this call (K/V read as int8)")
DEQUANTIZE_INT8KV = Route("dequantize", int8kv_dequantize.unsupported_reason, int8kv_dequantize, None)
INT8KV = (DECODE_INT8KV, DEQUANTIZE_INT8KV)


def choose(table: tuple[Route, ...], q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor],
           key_mask: Optional[Tensor], flags: dict, **tensors: Tensor) -> tuple[Route, list[str]]:
    """The first route of `table` that takes the call, and the reasons of those before it that declined
    (each once). `tensors`: a table's further keyword inputs (`INT8KV`'s k_scale and v_scale)."""
    declined: list[str] = []
    for route in table:
        reason = route.unsupported_reason(q, k, v, seqused_k=seqused_k, key_mask=key_mask, **tensors, **flags)
        if reason is None:
            return route, declined
        if reason not in declined:
            declined.append(reason)
    raise AssertionError(f"no route takes the call: {'; '.join(declined)}")


def why(route: Route, declined: list[str]) -> str:
    """`choose`'s answer in words."""
    if route.takes is None:
        return "; ".join(declined)
    return f"{route.takes} ({'; '.join(declined)})" if declined else route.takes
