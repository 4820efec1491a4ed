"""CUDA forward of `fa4::attention` for calls FA4 cannot take: PyTorch's memory-efficient SDPA kernel.

It runs when FA4 is missing, disabled (`FA4_INDUCTOR_DISABLE_FA4=1`), the GPU is neither sm90 nor
sm100 (A100, consumer Blackwell), or the call has a key mask (a padding mask FA4 cannot take). `aten::_scaled_dot_product_efficient_attention` takes an additive
bias and returns the log-sum-exp our op must produce, so every flag except softcap maps onto it:
causal / window / seqused_k / key_mask become one bias built from `reference.allowed_keys` (bottom-right
alignment, exactly the op's contract) and an additive key mask's values, and GQA repeats K/V heads (a copy this path
accepts).
Rows that see no key come back as zeros with lse -inf, as the contract says. Softcap has no SDPA
spelling and stays with the reference.

The backward (`backward`, for calls FA4 cannot take: a key mask, FA4 missing) recomputes the forward
with `F.scaled_dot_product_attention` and the same bias under autograd (PyTorch's memory-efficient
backward on CUDA: no [Sq, Sk] matrix in memory, one extra forward of time), GQA grads summed over
the repeated heads by autograd; rows that see no key are zeros in the forward, so they pass no
gradient. A gradient on lse goes to the reference.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from . import layout, reference
from .flags import Flags

DTYPES = layout.HALF_DTYPES + (torch.float32,)  # the memory-efficient kernel also takes float32
BIAS_ALIGN = 16  # the efficient kernel wants the bias's last dim padded to this many elements
ADDITIVE_FLOOR = -torch.finfo(torch.float32).max / 2
"""The least additive key-mask value the bias carries. The efficient kernel scales scores by log2(e) in float32:
bfloat16's finfo.min (eager code's hidden keys) overflowed there to -inf, and a row whose every visible key had it
came back as zeros (the H200, session 23), where eager's softmax is uniform over those keys. At this floor such a
row is still uniform (any score is below the value's float32 ulp) and such keys still get no weight next to others."""


def floor_additive(mask: Tensor) -> Tensor:
    """An additive mask with its finite values floored at `ADDITIVE_FLOOR`. -inf stays -inf: eager's softmax gives
    such a key no weight, even in a row whose other keys are finfo.min, where a floored -inf would weigh as much."""
    return torch.where(mask == float("-inf"), mask, mask.clamp_min(ADDITIVE_FLOOR))


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                       key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """Why the SDPA fallback cannot take this call, or None if it can (see the module docstring)."""
    if q.device.type != "cuda":
        return f"the SDPA fallback runs on CUDA, not {q.device.type}"
    if q.dtype not in DTYPES:
        return f"the SDPA fallback takes float16 / bfloat16 / float32, not {str(q.dtype).removeprefix('torch.')}"
    if flags.get("softcap", 0.0) > 0:
        return "softcap has no SDPA spelling"
    return None


def _bias(keep: Optional[Tensor], b: int, h: int, sq: int, sk: int, dtype: torch.dtype,
          key_mask: Optional[Tensor] = None) -> Optional[Tensor]:
    """Additive [B, H, Sq, Sk] bias (a broadcast view of a padded buffer): an additive key mask's values (0 without
    one) where `keep` shows the key, -inf where it hides it; None when there is neither."""
    additive = key_mask if reference.is_additive(key_mask) else None
    if keep is None and additive is None:
        return None
    padded = math.ceil(sk / BIAS_ALIGN) * BIAS_ALIGN
    rows = additive.shape[0] if additive is not None else keep.shape[0]
    device = additive.device if additive is not None else keep.device
    bias = torch.zeros((rows, 1, sq, padded), dtype=dtype, device=device)[..., :sk]
    if additive is not None:
        bias.copy_(floor_additive(reference.key_mask_rows(additive)[:, 0]))
    if keep is not None:
        bias.masked_fill_(~keep[:, 0], float("-inf"))
    return bias.expand(b, h, sq, sk)


def forward(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
            **flags) -> tuple[Tensor, Tensor]:
    """(out [B, Hq, Sq, Dv] stored as [B, Sq, Hq, Dv], lse [B, Hq, Sq] float32)."""
    f = Flags(**flags)
    reason = unsupported_reason(q, k, v, **flags)
    if reason is not None:
        raise ValueError(reason)
    b, hq, sq, _ = q.shape
    sk, group = k.shape[2], hq // k.shape[1]
    keep = reference.allowed_keys(sq, sk, causal=f.causal, window_left=f.window_left, window_right=f.window_right,
                                  seqused_k=seqused_k, device=q.device, key_mask=reference.visible_keys(key_mask))
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    result, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, _bias(keep, b, hq, sq, sk, q.dtype, key_mask), True, scale=f.scale)
    lse = lse[..., :sq].float()
    if keep is not None:
        blind = ~keep[:, 0].any(-1)  # [B or 1, 1, Sq]: rows that see no key
        result = result.masked_fill(blind[..., None], 0.0)
        lse = lse.masked_fill(blind, float("-inf"))
    return layout.bhsd_copy(result), lse.contiguous()


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             grad_lse: Optional[Tensor] = None, seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
             **flags) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), each stored as [B, S, H, D] like the op's other gradients. A gradient on lse goes to
    the reference (the recomputed SDPA returns no lse to differentiate), and so does an additive key mask: the
    efficient backward recomputes the softmax from its lse, which for a row whose every key carries a floored
    finfo.min holds no digit of the scores (dq off by 1e4 x on the H200, session 23)."""
    reason = unsupported_reason(q, k, v, **flags)
    if reason is not None:
        raise ValueError(reason)
    if grad_lse is not None or reference.is_additive(key_mask):
        return reference.backward(grad_out, q, k, v, out, lse, grad_lse, seqused_k, key_mask, **flags)
    return backward_by_recomputation(grad_out, q, k, v, seqused_k, key_mask, **flags)


def backward_by_recomputation(grad_out, q, k, v, seqused_k=None, key_mask=None, **flags):
    """`backward`'s body on any device (the CPU tests run it against the float64 reference)."""
    f = Flags(**flags)
    b, hq, sq, _ = q.shape
    sk, group = k.shape[2], hq // k.shape[1]
    keep = reference.allowed_keys(sq, sk, causal=f.causal, window_left=f.window_left, window_right=f.window_right,
                                  seqused_k=seqused_k, device=q.device, key_mask=reference.visible_keys(key_mask))
    if keep is not None:
        blind = ~keep.any(-1, keepdim=True)  # rows that see no key: any finite bias, and no gradient
        keep = keep | blind
        grad_out = grad_out.masked_fill(blind[:, 0], 0.0)
    bias = _bias(keep, b, hq, sq, sk, q.dtype, key_mask)  # padded as the memory-efficient kernel wants it
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        qq, kk, vv = leaves
        if group > 1:
            kk, vv = kk.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=bias, scale=f.scale)
        grads = torch.autograd.grad(out, leaves, grad_out)
    return tuple(layout.bhsd_copy(g) for g in grads)
