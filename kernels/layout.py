"""What the kernels share about tensors: the layout every fa4 attention output and gradient has ([B, H, S, D]
tensors stored as [B, S, H, D]), the 16-byte alignment our kernels and FA4 address, the half-precision
dtypes the CUDA kernels take, and the per-call-signature caches."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

ALIGN_BYTES = 16  # what our kernels and FA4 assume of a tensor's start and of its outer strides
HALF_DTYPES = (torch.float16, torch.bfloat16)  # what our CUDA kernels, FA4 and cuDNN SDPA take
FP4_DTYPES = tuple(d for d in (torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d is not None)
NVFP4_BLOCK = 16  # inputs per e4m3 block scale


def dtype_name(dtype: torch.dtype) -> str:
    """"bfloat16" for torch.bfloat16: how our messages name a dtype."""
    return str(dtype).removeprefix("torch.")


def nvfp4_operands(w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor) -> tuple[int, int]:
    """(N, K) of an NVFP4 weight given to one of our matmul adapters, after checking its operands (ValueError):
    w_fp4 [N, K/2] uint8 (or float4_e2m1fn_x2), w_block_scale float8_e4m3fn [N, K/16], one float32 global scale."""
    if w_fp4.dim() != 2 or w_fp4.dtype not in FP4_DTYPES:
        raise ValueError(f"nvfp4 weights are uint8 [N, K/2], got {w_fp4.dim()}-D {w_fp4.dtype}")
    n, k = w_fp4.shape[0], 2 * w_fp4.shape[1]
    groups = k // NVFP4_BLOCK
    if w_block_scale.dtype != torch.float8_e4m3fn or tuple(w_block_scale.shape) != (n, groups):
        raise ValueError(f"nvfp4 block scales are float8_e4m3fn [{n}, {groups}], got {w_block_scale.dtype} "
                         f"{list(w_block_scale.shape)}")
    if w_global_scale.numel() != 1 or w_global_scale.dtype != torch.float32:
        raise ValueError(f"the nvfp4 global scale is a float32 0-d tensor, got {w_global_scale.dtype} "
                         f"{list(w_global_scale.shape)}")
    return n, k


def contiguous_strides(t: Tensor) -> Tensor:
    """t viewed with a contiguous tensor's strides when it is contiguous, else t. `is_contiguous` ignores the stride
    of a size-1 dim, which Inductor often makes 0 (a one-row activation, one cache position): kernels that read
    strides see it, and a copy to mend it is a launch per call."""
    if not t.is_contiguous():
        return t
    want, step = [], 1
    for size in reversed(t.shape):
        want.append(step)
        step *= max(size, 1)
    want = tuple(reversed(want))
    return t if t.stride() == want else t.as_strided(t.shape, want)


def unit_last_stride(t: Tensor) -> Tensor:
    """t with stride 1 on its last dim: itself, a view (`contiguous_strides`) or a contiguous copy (an expanded
    tensor: one length for the whole batch)."""
    if t.stride(-1) == 1:
        return t
    t = contiguous_strides(t)
    return t if t.stride(-1) == 1 else t.clone(memory_format=torch.contiguous_format)


def empty_bhsd(b, h, s, d, *, dtype: torch.dtype, device, zero: bool = False) -> Tensor:
    """An uninitialized (or zero) [b, h, s, d] tensor with [b, s, h, d] storage, strides (s*h*d, d, h*d, 1).

    Allocated with those strides rather than as a transposed view, so that a compiled graph that
    returns it needs no view regeneration (AOTAutograd replays views of intermediates on every call).
    Kernels that want [B, S, H, D] take `.transpose(1, 2)` of it."""
    out = torch.empty_strided((b, h, s, d), (s * h * d, d, h * d, 1), dtype=dtype, device=device)
    return out.zero_() if zero else out


def bhsd_copy(t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """t's values (cast to `dtype`) in a new `empty_bhsd` tensor: a kernel's result in the op's layout."""
    out = empty_bhsd(*t.shape, dtype=dtype or t.dtype, device=t.device)
    return out.copy_(t)


def lengths_int32(lengths: Tensor | None, device) -> Tensor | None:
    """Per-sequence lengths (`seqused_k`) as a unit-stride int32 [B] tensor on `device`.

    A graph often hands an expanded one (stride 0: one cache position for the whole batch), or one length with
    stride 0, which `.contiguous()` keeps and kernels that index lengths[b] with a unit stride (FA4 asserts it)
    cannot take."""
    if lengths is None:
        return None
    return unit_last_stride(lengths.to(device=device, dtype=torch.int32))


def alignment_reason(name: str, t: Tensor, address: Optional[int] = None) -> str | None:
    """Why a kernel that loads `t` in 16-byte vectors cannot address it, or None: it needs a unit stride
    on the last dim, the other strides multiples of 16 bytes (0, a broadcast, is fine) and a 16-byte
    aligned start (`address`, default t.data_ptr())."""
    strides = t.stride()
    if strides[-1] != 1:
        return f"{name} has stride {strides[-1]} on the head dim (needs 1)"
    step = ALIGN_BYTES // t.element_size()
    if any(s % step for s in strides[:-1]):
        return f"{name} strides {strides} are not multiples of {ALIGN_BYTES} bytes"
    if (t.data_ptr() if address is None else address) % ALIGN_BYTES:
        return f"{name} does not start on a {ALIGN_BYTES}-byte boundary"
    return None


def describe(*tensors: Tensor | None) -> tuple:
    """What a kernel's choice and compilation can depend on, per tensor: shape, strides, dtype, device
    and the start's 16-byte alignment (None stays None). Keys of the per-call-signature caches."""
    return tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % ALIGN_BYTES)
                  for t in tensors])  # a list, not a generator: this is on every call's host path


class SignatureCache(dict):
    """A dict keyed by call signature (`describe`) that forgets its oldest entries past `limit`: models
    call with a handful of signatures, so the bound only matters for shape sweeps."""

    def __init__(self, limit: int = 1024):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        while len(self) > self.limit:
            del self[next(iter(self))]
