"""Adapter from `fa4::attention` / `fa4::attention_backward` to flash-attn-4 (`flash_attn.cute`, 4.0.0b36).

It calls FA4's internal entry points, `_flash_attn_fwd` and `_flash_attn_bwd` from
`flash_attn.cute.interface`, because only they take caller-allocated outputs (`out`, `lse`, `dq`,
`dk`, `dv`) and a gradient on lse (`dlse`); the public `flash_attn_func` takes neither.

Layouts. Our op sees SDPA layout: q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv]. FA4 reads
[B, S, H, D], so each input is passed as `t.transpose(1, 2)`, a view. FA4 addresses any strides with
a unit stride on D, a 16-byte aligned start and the other strides multiples of 16 bytes (stride 0,
a broadcast, is fine); the HF layout (a transposed view of a contiguous [B, S, H, D]) and a
contiguous [B, H, S, D] both qualify and are never copied. Other layouts are copied to a contiguous
[B, S, H, D] first (FA4 would copy them too), so they cost a copy but still run FA4.
Outputs are allocated here: `out` as a contiguous [B, Sq, Hq, Dv] returned transposed to
[B, Hq, Sq, Dv], lse as a contiguous float32 [B, Hq, Sq] (FA4's own lse layout, natural log, -inf
for a row that sees no key), and dq, dk, dv as contiguous [B, S, H, D] returned transposed.
GQA (Hq a multiple of Hkv) goes to FA4 as is: it packs the query heads of a KV head together.
Flags map one to one: `scale` -> softmax_scale, `causal` (bottom-right aligned in both),
`window_left` / `window_right` -> window_size_left / right with -1 (unbounded) sent as None (FA4
drops negative bounds only when both are negative), `softcap` (0 = off), `seqused_k` (int32).

What `unsupported_reason` rejects, so that a later route (`routes.py`) runs instead:
- a key mask (FA4 has none; `attention.key_mask_form` turns the masks it can into seqused_k or varlen);
- FA4 disabled with FA4_INDUCTOR_DISABLE_FA4=1 (A/B benchmarks), or not installed / not importable;
- a device other than CUDA sm90 / sm100 (FA4 also has sm80 / sm120 paths, which we do not test);
- dtypes other than float16 / bfloat16 (FA4's fp8 forward needs descales and has no backward);
- head dims FA4 asserts against: multiples of 8 in 8..256 on sm90; on sm100 both <= 128, or
  (192, 128), or (256, 256).
The backward takes every call the forward takes except two that FA4 asserts against, which
`backward` hands to the reference itself: GQA with head_dim != head_dim_v on sm90, and
head_dim 256 with softcap or a gradient on lse on sm100 (its dedicated kernel has neither).

Compilation. FA4 JIT-compiles one kernel per variant (dtype, head dims, GQA ratio, causal / window
flags, softcap value, whether seqused_k is given, arch), seconds each; call `warmup` for the
variants a model uses before capturing CUDA graphs. Its disk cache is turned on here before the
first import of `flash_attn.cute`: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 and
FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$XDG_CACHE_HOME/fa4_inductor/fa4-cute (~/.cache/... by
default), unless the user set them (FA4 reads them once, at import; we read them through
`switches.py`). FA4 keys that cache by a hash of its own sources, Python, cutlass and tvm_ffi
versions, so an upgrade never loads a stale kernel.

Launch replay (`fa4_replay.py`): after the first calls of a signature, `forward` launches FA4's
compiled kernel directly instead of going through `_flash_attn_fwd` (~150 us of host time a call).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from . import fa4_replay, layout, reference, switches
from .flags import Flags

log = logging.getLogger("fa4_inductor.kernels")

DISABLE_ENV = switches.DISABLE_FA4
NO_REPLAY_ENV = switches.NO_REPLAY
CACHE_ENABLED_ENV = switches.FA4_CACHE_ENABLED
CACHE_DIR_ENV = switches.FA4_CACHE_DIR
DTYPES = layout.HALF_DTYPES


def cache_dir() -> Path:
    return Path(switches.current().cache_home) / "fa4_inductor" / "fa4-cute"


def _enable_disk_cache() -> None:
    """Sets FA4's disk-cache variables, which FA4 reads once at import, unless the user set them."""
    env = switches.current()
    if env.fa4_cache_enabled_set:
        return
    directory = env.fa4_cache_dir or str(cache_dir())
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError as e:  # FA4 would fail to import on an unwritable cache dir
        log.warning("FA4 disk cache stays off: cannot create %s (%s)", directory, e)
        return
    os.environ[CACHE_ENABLED_ENV] = "1"
    os.environ[CACHE_DIR_ENV] = directory


@functools.cache
def _interface():
    """(`flash_attn.cute.interface`, None), or (None, why it cannot be imported)."""
    _enable_disk_cache()
    try:
        from flash_attn.cute import interface
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "flash_attn":
            return None, "flash-attn-4 is not installed"
        return None, f"flash-attn-4 cannot be imported: {e}"
    except Exception as e:  # cutlass / CUDA driver problems surface here
        log.warning("importing flash_attn.cute failed", exc_info=True)
        return None, f"flash-attn-4 cannot be imported: {type(e).__name__}: {e}"
    return interface, None


def _require():
    interface, reason = _interface()
    if interface is None:
        raise NotImplementedError(f"the FA4 adapter cannot run: {reason}")
    return interface


def _head_dim_reason(major: int, d: int, dv: int) -> str | None:
    if d % 8 or dv % 8 or min(d, dv) < 8:
        return f"FA4 needs head dims that are multiples of 8 (>= 8); got ({d}, {dv})"
    if major == 9 and max(d, dv) > 256:
        return f"FA4 on sm90 takes head dims up to 256; got ({d}, {dv})"
    if major == 10 and not (max(d, dv) <= 128 or (d, dv) in ((192, 128), (256, 256))):
        return f"FA4 on sm100 takes head dims <= 128, (192, 128) or (256, 256); got ({d}, {dv})"
    return None


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                       key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """Why FA4 cannot take this call on this device, or None if it can (see the module docstring)."""
    if key_mask is not None:
        return "a key mask: FA4 takes none"
    reason = switches.gate("FA4", DISABLE_ENV, q, DTYPES)
    if reason is not None:
        return reason
    major, minor = switches.capability(q.device.index)
    if major not in (9, 10):
        return f"FA4 is wired for sm90 / sm100; this GPU is sm{major}{minor}"
    reason = _head_dim_reason(major, q.shape[-1], v.shape[-1])
    if reason is not None:
        return reason
    if q.shape[1] % k.shape[1]:
        return f"{q.shape[1]} query heads is not a multiple of {k.shape[1]} kv heads"
    return _interface()[1]


def _backward_unsupported_reason(major: int, q: Tensor, v: Tensor, softcap: float, grad_lse: Optional[Tensor]) -> str | None:
    """What FA4's backward asserts against among calls its forward takes."""
    d, dv = q.shape[-1], v.shape[-1]
    if major == 9 and q.shape[1] != v.shape[1] and d != dv:
        return f"FA4's sm90 backward needs head_dim == head_dim_v for GQA; got ({d}, {dv})"
    if major == 10 and d == dv == 256 and (softcap > 0 or grad_lse is not None):
        return "FA4's sm100 head_dim 256 backward takes neither softcap nor a gradient on lse"
    return None


def _window(bound: int) -> Optional[int]:
    return bound if bound >= 0 else None


def _address(t: Tensor) -> int:
    # Fake tensors (FA4 compiles without launching under FakeTensorMode) have no data pointer.
    return t.storage_offset() * t.element_size() if isinstance(t, FakeTensor) else t.data_ptr()


def _device_guard(t: Tensor):
    return contextlib.nullcontext() if isinstance(t, FakeTensor) else torch.cuda.device(t.device)


def _bshd(t: Tensor) -> Tensor:
    """The [B, S, H, D] view of an SDPA-layout tensor, copied only when FA4 cannot address it."""
    t = t.transpose(1, 2)
    if layout.alignment_reason("", t, _address(t)) is None:
        return t
    log.debug("fa4: copying a %s tensor with strides %s to an aligned layout", tuple(t.shape), t.stride())
    return t.clone(memory_format=torch.contiguous_format)


def forward(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
            **flags) -> tuple[Tensor, Tensor]:
    """FA4 forward: (out [B, Hq, Sq, Dv] stored as [B, Sq, Hq, Dv], lse [B, Hq, Sq] float32). No key mask."""
    if key_mask is not None:
        raise ValueError("FA4 takes no key mask")
    flags = Flags(**flags)
    fa = _require()
    b, hq, sq, _ = q.shape
    out = layout.empty_bhsd(b, hq, sq, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    qb, kb, vb, ob, used = _bshd(q), _bshd(k), _bshd(v), out.transpose(1, 2), layout.lengths_int32(seqused_k, q.device)
    with _device_guard(q):
        fa4_replay.launch_forward(fa, (qb, kb, vb, ob, lse, used), tuple(flags),
                        lambda: fa._flash_attn_fwd(
                            qb, kb, vb,
                            seqused_k=used,
                            **_kernel_flags(flags),
                            return_lse=True,
                            out=ob,
                            lse=lse,
                        ))
    return out, lse


def left_padding_as_varlen(starts: Tensor, b: int, s: int, banded: bool) -> dict:
    """FA4's varlen arguments describing a left-padded batch in place, over its [B * S] flattened tokens.

    Sequence b's keys are slots starts[b]..S-1 of its row: segment offset b * S + starts[b], used length
    S - starts[b] (`cu_seqlens` give offsets, `seqused` lengths: the gaps between segments are the
    padding, never read). Its queries are the same slots under a band (causal, window), which starts at
    the first visible key, bottom-right aligned within the segment as in the padded rows; earlier queries
    see no key and are not computed. With no band, every query sees the segment: all S slots."""
    rows = torch.arange(b + 1, device=starts.device, dtype=torch.int32) * s
    cu_k = torch.cat([rows[:-1] + starts.to(torch.int32), rows[-1:]])
    used = (s - starts).to(torch.int32)
    return dict(cu_seqlens_q=cu_k if banded else rows, cu_seqlens_k=cu_k, seqused_q=used if banded else None,
                seqused_k=used, max_seqlen_q=s, max_seqlen_k=s)


def right_padding_as_varlen(lengths: Tensor, b: int, s: int) -> tuple[dict, dict]:
    """FA4's varlen arguments for a right-padded causal self-attention in place, over its [B * S] flattened
    tokens, as two calls: sequence b's tokens are slots 0..lengths[b]-1 of its row, whose queries see the keys
    up to their own (the first call: causal, one segment of lengths[b] queries and keys at offset b * S);
    the padding queries after them see every one of those keys (the padded rows' mask is causal and the key
    mask: key j < lengths[b] <= query i), the second call: not causal, queries from offset b * S + lengths[b],
    S - lengths[b] of them, over the same keys."""
    rows = torch.arange(b + 1, device=lengths.device, dtype=torch.int32) * s
    used = lengths.to(torch.int32)
    keys = dict(cu_seqlens_k=rows, seqused_k=used, max_seqlen_q=s, max_seqlen_k=s)
    return (dict(cu_seqlens_q=rows, seqused_q=used, **keys),
            dict(cu_seqlens_q=torch.cat([rows[:-1] + used, rows[-1:]]), seqused_q=s - used, **keys))


def _padded_calls(side: str, positions, b: int, s: int, flags: Flags) -> list[tuple[dict, dict]]:
    """(varlen arguments, kernel flags) of the FA4 calls that run a padded batch: `positions` are the first
    visible keys (side "left"), the lengths (side "right", causal only), or (side "packed": sequences packed
    back to back in each row, causal) the [segments + 1] int32 offsets of every sequence in the [B * S] flattened
    tokens, the longest one's length and the used lengths of the segments (None: each up to the next offset; a
    segment's unused tail is rows that see no key, not computed)."""
    if side == "left":
        return [(left_padding_as_varlen(positions, b, s, flags.banded), _kernel_flags(flags))]
    if side == "packed":
        offsets, longest, used = positions
        return [(dict(cu_seqlens_q=offsets, cu_seqlens_k=offsets, seqused_q=used, seqused_k=used,
                      max_seqlen_q=longest, max_seqlen_k=longest), _kernel_flags(flags))]
    valid, padding = right_padding_as_varlen(positions, b, s)
    return [(valid, _kernel_flags(flags)), (padding, _kernel_flags(flags._replace(causal=False)))]


def _flat(t: Tensor) -> Tensor:
    """An SDPA-layout [B, H, S, D] tensor as FA4's varlen [B * S, H, D] (a view for [B, S, H, D] storage)."""
    t = _bshd(t)
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def padded_blind_rows(side: str, positions, **flags) -> bool:
    """Whether `forward_padded`'s segments may leave query rows that see no key (zeros, lse -inf): left padding
    under a band, packed sequences with used lengths."""
    return side == "left" and Flags(**flags).banded or side == "packed" and positions[2] is not None


def forward_padded(q: Tensor, k: Tensor, v: Tensor, side: str, positions, **flags) -> tuple[Tensor, Tensor]:
    """FA4 forward of a self-attention (Sq == Sk) whose key mask is padding, run as varlen segments over the
    padded buffer (`_padded_calls`): no copy of Q/K/V, no mask. Left padding and packed sequences with used
    lengths: query rows that see no key get zeros and an lse of -inf, as the op's contract says; right padding
    (causal): every row sees a key."""
    flags = Flags(**flags)
    fa = _require()
    b, hq, s, _ = q.shape
    out = layout.empty_bhsd(b, hq, s, v.shape[-1], dtype=q.dtype, device=q.device,
                            zero=padded_blind_rows(side, positions, **flags._asdict()))
    lse = torch.full((hq, b * s), float("-inf"), dtype=torch.float32, device=q.device)
    flat = [_flat(t) for t in (q, k, v, out)]  # once: an unaligned input is copied once for both calls
    with _device_guard(q):
        for args, kernel_flags in _padded_calls(side, positions, b, s, flags):
            fa._flash_attn_fwd(*flat[:3], **args, **kernel_flags, return_lse=True, out=flat[3], lse=lse)
    return out, lse.view(hq, b, s).transpose(0, 1).contiguous()


def backward_padded(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    grad_lse: Optional[Tensor], side: str, positions, **flags) -> tuple[Tensor, Tensor, Tensor]:
    """FA4 backward of `forward_padded`; gradients of padded key slots are zero. With two calls (right padding)
    each writes its own zeroed gradients, summed: both reach the same keys."""
    flags = Flags(**flags)
    fa = _require()
    b, hq, s, _ = q.shape

    def varlen_lse(t):
        return None if t is None else t.float().transpose(0, 1).reshape(hq, b * s)

    total = None
    flat = [_flat(t) for t in (q, k, v, out, grad_out)]
    with _device_guard(q):
        for args, kernel_flags in _padded_calls(side, positions, b, s, flags):
            grads = [layout.empty_bhsd(*t.shape, dtype=t.dtype, device=t.device, zero=True) for t in (q, k, v)]
            fa._flash_attn_bwd(
                *flat, varlen_lse(lse),
                **args,
                **kernel_flags,
                dq=_flat(grads[0]),
                dk=_flat(grads[1]),
                dv=_flat(grads[2]),
                dlse=varlen_lse(grad_lse),
            )
            total = grads if total is None else [t.add_(g) for t, g in zip(total, grads)]
    return tuple(total)


def _kernel_flags(flags: Flags) -> dict:
    return dict(softmax_scale=flags.scale, causal=flags.causal, softcap=max(flags.softcap, 0.0),
                window_size_left=_window(flags.window_left), window_size_right=_window(flags.window_right))


def backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_lse: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    key_mask: Optional[Tensor] = None,
    **flags,
) -> tuple[Tensor, Tensor, Tensor]:
    """FA4 backward: (dq, dk, dv) shaped like q, k, v, each stored as [B, S, H, D]. No key mask."""
    if key_mask is not None:
        raise ValueError("FA4 takes no key mask")
    fa = _require()
    flags = Flags(**flags)
    # FA4 leaves dk / dv rows past seqused_k unwritten; the op's contract makes them zero.
    grads = [layout.empty_bhsd(*t.shape, dtype=t.dtype, device=t.device, zero=seqused_k is not None and t is not q)
             for t in (q, k, v)]
    reason = _backward_unsupported_reason(fa._get_device_arch() // 10, q, v, flags.softcap, grad_lse)
    if reason is not None:
        log.debug("fa4::attention_backward runs the reference: %s", reason)
        ref = reference.attention_backward(grad_out, q, k, v, out, lse, grad_lse, seqused_k=seqused_k, **flags._asdict())
        for g, r in zip(grads, ref):
            g.copy_(r)
        return tuple(grads)
    with _device_guard(q):
        fa._flash_attn_bwd(
            _bshd(q), _bshd(k), _bshd(v), _bshd(out), _bshd(grad_out), lse.float().contiguous(),
            **_kernel_flags(flags),
            seqused_k=layout.lengths_int32(seqused_k, q.device),
            dq=grads[0].transpose(1, 2),
            dk=grads[1].transpose(1, 2),
            dv=grads[2].transpose(1, 2),
            dlse=None if grad_lse is None else grad_lse.float().contiguous(),
        )
    return tuple(grads)


def warmup(
    dtype: torch.dtype,
    head_dim: int,
    head_dim_v: int,
    group: int = 1,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    device: torch.device | str = "cuda",
    *,
    seqused_k: bool = False,
    with_backward: bool = False,
    seqlen_q: int = 512,
    seqlen_k: int = 512,
) -> None:
    """Compile (or load from the disk cache) the FA4 kernels of one variant, outside CUDA-graph capture.

    `window` is (window_left, window_right), -1 = unbounded. The lengths matter only where FA4
    specializes on them (queries that fit one tile, a one-block backward, sm100's q tiles and 2-CTA
    kernels): the defaults compile the prefill variants; pass seqlen_q=1 for decode.
    """
    device = torch.device(device)
    q = torch.randn(1, seqlen_q, group, head_dim, dtype=dtype, device=device).transpose(1, 2)
    k = torch.randn(1, seqlen_k, 1, head_dim, dtype=dtype, device=device).transpose(1, 2)
    v = torch.randn(1, seqlen_k, 1, head_dim_v, dtype=dtype, device=device).transpose(1, 2)
    used = torch.full((1,), seqlen_k, dtype=torch.int32, device=device) if seqused_k else None
    flags = dict(scale=head_dim ** -0.5, causal=causal, window_left=window[0], window_right=window[1], softcap=softcap)
    reason = unsupported_reason(q, k, v, seqused_k=used, **flags)
    if reason is not None:
        raise ValueError(f"FA4 does not take this variant: {reason}")
    out, lse = forward(q, k, v, used, **flags)
    if with_backward:
        backward(torch.randn_like(out), q, k, v, out, lse, None, used, **flags)
