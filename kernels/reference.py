"""Reference attention (forward and backward) in float32, or float64 for float64 inputs.

These are the CPU bodies of the `fa4::` attention ops and the oracle the tests compare against.
GQA is computed by grouping query heads (`h // group` uses K/V head `h`), never by repeating K/V.

Masking convention (FlashAttention's): with `offset = seqlen_k - seqlen_q` (per batch when
`seqused_k` gives the used cache lengths), query row i of sequence b may see key j when
    j < seqlen_k,
    key_mask[b, j]                       if a [B, Sk] key mask is given (a padding mask),
    key_mask[b, i, j]                    if a [B, Sq, Sk] one is (a boolean mask per query row),
    j <= i + offset                      if causal,
    j >= i + offset - window_left        if window_left >= 0,
    j <= i + offset + window_right       if window_right >= 0.
A row that sees no key returns zeros and a log-sum-exp of -inf.
A floating-point key mask is additive instead (`is_additive`): key_mask[b, (i,) j] is added to the scaled,
soft-capped score (eager code's `scores + mask`, any values: a row whose every score is finfo.min is uniform).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import layout


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def allowed_keys(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool,
    window_left: int,
    window_right: int,
    seqused_k: torch.Tensor | None,
    device: torch.device,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Boolean [B or 1, 1, 1, Sq, Sk] mask of visible keys, or None when every key is visible. `key_mask`:
    [B, Sk] or [B, Sq, Sk]."""
    if not causal and window_left < 0 and window_right < 0 and seqused_k is None and key_mask is None:
        return None
    i = torch.arange(seqlen_q, device=device).view(1, 1, 1, -1, 1)
    j = torch.arange(seqlen_k, device=device).view(1, 1, 1, 1, -1)
    if seqused_k is None:
        used = torch.full((1, 1, 1, 1, 1), seqlen_k, device=device, dtype=torch.long)
    else:
        used = seqused_k.to(device=device, dtype=torch.long).view(-1, 1, 1, 1, 1)
    diagonal = i + used - seqlen_q
    keep = j < used
    if causal:
        keep = keep & (j <= diagonal)
    if window_left >= 0:
        keep = keep & (j >= diagonal - window_left)
    if window_right >= 0:
        keep = keep & (j <= diagonal + window_right)
    if key_mask is not None:
        keep = keep & key_mask_rows(key_mask).to(device=device, dtype=torch.bool)
    return keep


def key_mask_rows(key_mask: Tensor) -> Tensor:
    """A [B, Sk] or [B, Sq, Sk] key mask as a [B, 1, 1, 1 or Sq, Sk] view, broadcasting over [B, Hkv, G, Sq, Sk]."""
    return key_mask[:, None, None] if key_mask.dim() == 3 else key_mask[:, None, None, None]


def is_additive(key_mask: Optional[Tensor]) -> bool:
    """A floating-point key mask: added to the scores rather than hiding keys."""
    return key_mask is not None and key_mask.dtype.is_floating_point


def visible_keys(key_mask: Optional[Tensor]) -> Optional[Tensor]:
    """The key mask as `allowed_keys` takes it: a boolean one, or None for an additive one (it hides nothing)."""
    return None if is_additive(key_mask) else key_mask


def _bias(key_mask: Optional[Tensor], acc: torch.dtype) -> Optional[Tensor]:
    """An additive key mask broadcast over [B, Hkv, G, Sq, Sk] scores, in the compute dtype; None otherwise."""
    return key_mask_rows(key_mask).to(acc) if is_additive(key_mask) else None


def _grouped(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[B, Hq, S, D] -> [B, Hkv, G, S, D], query heads of one K/V head side by side."""
    return q.unflatten(1, (num_kv_heads, q.shape[1] // num_kv_heads))


def _scores(q, k, scale, softcap, keep, key_mask=None):
    """(scaled, soft-capped and masked scores [B, Hkv, G, Sq, Sk] in the compute dtype, the soft-capped scores
    before any mask)."""
    acc = compute_dtype(q.dtype)
    capped = _grouped(q.to(acc), k.shape[1]) @ k.to(acc).unsqueeze(2).transpose(-1, -2) * scale
    if softcap > 0:
        capped = softcap * torch.tanh(capped / softcap)
    bias = _bias(key_mask, acc)
    s = capped if bias is None else capped + bias
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return s, capped


def attention_forward(
    q, k, v, *, scale, causal, window_left, window_right, softcap, seqused_k, key_mask=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out [B, Hq, Sq, Dv], lse [B, Hq, Sq]), both in the compute dtype."""
    keep = allowed_keys(q.shape[2], k.shape[2], causal=causal, window_left=window_left, window_right=window_right,
                        seqused_k=seqused_k, device=q.device, key_mask=visible_keys(key_mask))
    s, _ = _scores(q, k, scale, softcap, keep, key_mask)
    p, lse = _softmax(s)
    out = p @ v.to(s.dtype).unsqueeze(2)
    return out.flatten(1, 2), lse.squeeze(-1).flatten(1, 2)


def _softmax(s: Tensor) -> tuple[Tensor, Tensor]:
    """(softmax of s over the keys, its log-sum-exp), zeros and -inf for a row that sees no key. Normalised by the
    sum, not by exp(-lse): next to a row max of finfo.min (an additive mask on every key) lse cannot hold log(sum)."""
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    return e / total.masked_fill(total == 0, 1.0), m + torch.log(total)


def attention_backward(
    grad_out, q, k, v, out, lse, grad_lse=None, *, scale, causal, window_left, window_right, softcap, seqused_k,
    key_mask=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) in the compute dtype.

    p is the softmax recomputed from the scores, normalised by its sum as eager's, not exp(s - lse): next to a row
    max of finfo.min (an additive mask on every key) lse cannot hold log(sum), and with a peaked softmax over large
    scores (float32 scores in the hundreds) lse's rounding moves the largest p by more than 1 - p, which the row
    term below then cancels against (dq 100 times eager's error). The row term of the softmax gradient,
    sum_j p_ij dp_ij (= rowsum(dout * out)), is computed from p in the compute dtype rather than from `out`, which
    is rounded to the inputs' dtype: with a peaked softmax (a large scale in bfloat16) the rounded `out` costs dq
    and dk several times eager's error. d lse / d s = p, so a gradient on lse adds `p * grad_lse` to the score
    gradient. `out` and `lse` are the op's saved outputs, unused here."""
    keep = allowed_keys(q.shape[2], k.shape[2], causal=causal, window_left=window_left, window_right=window_right,
                        seqused_k=seqused_k, device=q.device, key_mask=visible_keys(key_mask))
    num_kv_heads = k.shape[1]
    s, capped = _scores(q, k, scale, softcap, keep, key_mask)
    acc = s.dtype
    p = _softmax(s)[0]
    do = _grouped(grad_out.to(acc), num_kv_heads)
    v5 = v.to(acc).unsqueeze(2)
    k5 = k.to(acc).unsqueeze(2)
    dv = (p.transpose(-1, -2) @ do).sum(2)
    dp = do @ v5.transpose(-1, -2)
    row_term = (p * dp).sum(-1, keepdim=True)
    if grad_lse is not None:
        row_term = row_term - _grouped(grad_lse.to(acc), num_kv_heads).unsqueeze(-1)
    ds = p * (dp - row_term)
    if softcap > 0:
        ds = ds * (1 - (capped / softcap) ** 2)
    dq = (ds @ k5).flatten(1, 2) * scale
    dk = (ds.transpose(-1, -2) @ _grouped(q.to(acc), num_kv_heads)).sum(2) * scale
    return dq, dk, dv


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                       key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """The reference takes every call the op takes (on any device)."""
    return None


def forward(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
            **flags) -> tuple[Tensor, Tensor]:
    """`attention_forward` as the op returns it: out in q's dtype and the op's layout, lse contiguous."""
    out, lse = attention_forward(q, k, v, seqused_k=seqused_k, key_mask=key_mask, **flags)
    return layout.bhsd_copy(out, q.dtype), lse.contiguous()


def backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             grad_lse: Optional[Tensor] = None, seqused_k: Optional[Tensor] = None,
             key_mask: Optional[Tensor] = None, **flags) -> tuple[Tensor, Tensor, Tensor]:
    """`attention_backward` as the op returns it: each gradient in its input's dtype, in the op's layout."""
    grads = attention_backward(grad_out, q, k, v, out, lse, grad_lse, seqused_k=seqused_k, key_mask=key_mask,
                               **flags)
    return tuple(layout.bhsd_copy(g, t.dtype) for g, t in zip(grads, (q, k, v)))
