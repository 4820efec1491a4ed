"""Host side of the native NVFP4 path on Blackwell (sm_100 / sm_120): W4A4. x is quantized to NVFP4 on the device
(`cute/nvfp4_quantize_activation.py`), then `torch._scaled_mm` multiplies the two fp4 operands on the block-scaled
FP4 tensor cores:

    unsupported_reason(x2d, n, k) -> str | None
    matmul(x2d, w_fp4, w_block_scale, w_global_scale) -> Tensor [M, N] in x's dtype
    quantize(x2d) -> (codes, blocked scales, row scales)          the kernel alone
    emulate(x2d, w_fp4, w_block_scale, w_global_scale) -> float64  the same path in plain PyTorch (CPU tests)

Not bit-for-bit `fa4::nvfp4_linear`'s reference: the activations are rounded to NVFP4 too, so the path runs only
where the user asked for it (`fa4_inductor.backend(nvfp4_activations=True)`, the op's `quantize_activations`).

The arithmetic, with the weight in the op's format (e2m1 codes w [N, K / 2], e4m3 block scales sw [N, K / 16],
a float32 global gw: W = e2m1(w) * sw * gw) and x quantized per row m as the kernel's docstring says (codes q,
e4m3 block scales sx, a per-row float32 gx[m] = amax_k |x[m, k]| / 2688 computed on the device):

    acc[m, n] = sum_k e2m1(q)[m, k] * sx[m, k // 16] * e2m1(w)[n, k] * sw[n, k // 16]   (_scaled_mm, fp32 out)
    out[m, n] = (acc[m, n] * (gx[m] * gw)).to(x.dtype)

The tensor cores multiply exactly and accumulate in float32; `_scaled_mm` takes no per-row alpha, hence the
float32 result and one epilogue multiply (torchao's NVFP4 GEMM, `_addmm_nvfp4_dispatch`, also scales after it).

Error: per element, |x - dequant(q)| <= d * h(|x| / d) with d = sx * gx the block's decode scale and h the half
gap of the e2m1 grid around |x| / d (0.25 below 2, 0.5 below 4, 1 up to 6; past 6, the excess: a block scale
rounded down saturates its largest element). Since the e4m3 block scale is within 2^-4 of bmax / 6,
|x - dequant(q)| <= bmax / 5.6 at worst and ~ bmax / 24 typically; the relative RMS error of a matmul over random
Gaussian activations is ~ 9% (`ACTIVATION_RMS_BOUND` bounds it for the tests).

Weight scales are swizzled into the blocked layout once per scale tensor (`prepared_weights`, kind
"nvfp4_blackwell"); under CUDA-graph capture a scale tensor never met before (torchao computes its un-swizzled
scales in the graph, a new tensor each call) is swizzled in the graph instead (a gather of N * K / 16 bytes,
recorded, so replays follow the values). The codes are used as they are (`float4_e2m1fn_x2` view, transposed:
no copy).

Limits (`unsupported_reason`): CUDA capability 10.x or 12.x, x float16 / bfloat16 with at least one row,
K a multiple of 32 and N a multiple of 16 (`_scaled_mm`'s fp4 operands), a torch with float4_e2m1fn_x2 and
cutlass-dsl importable. Compilation: one variant per (x dtype, scale mode, arch); call `warmup` before capture.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from . import layout, prepared_weights, switches
from .cute import compile_utils

DTYPES = layout.HALF_DTYPES
ARCHS = {10: "sm_100a", 12: "sm_120a"}  # capability major -> what the quantize kernel is compiled for
K_MULTIPLE = 32  # _scaled_mm: the packed fp4 K (K / 2) a multiple of 16
N_MULTIPLE = 16
BLOCK = layout.NVFP4_BLOCK  # inputs per e4m3 block scale
E2M1_MAX, E4M3_MAX = 6.0, 448.0
MODES = ("row", "given")
KIND = "nvfp4_blackwell"
FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)
ACTIVATION_RMS_BOUND = 0.12
"""Relative RMS error of an NVFP4-activation matmul over N(0, 1) activations (measured ~0.09 on CPU emulation)."""

_name = layout.dtype_name


def unsupported_reason(x2d: Tensor, n: int, k: int) -> str | None:
    """Why the W4A4 path cannot multiply x2d [M, k] by an NVFP4 weight of n rows, or None if it can."""
    if x2d.device.type != "cuda":
        return f"the NVFP4 W4A4 path runs on CUDA, not {x2d.device.type}"
    major, minor = switches.capability(x2d.device.index)
    return limits_reason((major, minor), x2d.dtype, x2d.dim(), x2d.shape[0] if x2d.dim() == 2 else 0, n, k)


def limits_reason(capability: tuple[int, int], dtype: torch.dtype, dim: int, m: int, n: int, k: int) -> str | None:
    """`unsupported_reason` on the call's description (a pure function but for the imports checked last)."""
    major, minor = capability
    if major not in ARCHS:
        return f"the NVFP4 W4A4 path needs Blackwell FP4 tensor cores (sm100 / sm120); this GPU is sm{major}{minor}"
    if dtype not in DTYPES:
        return f"the NVFP4 W4A4 path takes float16 / bfloat16 x, not {_name(dtype)}"
    if dim != 2 or m < 1:
        return "x has no rows" if dim == 2 else f"x must be 2-D [M, K], got {dim}-D"
    if k % K_MULTIPLE:
        return f"torch._scaled_mm's fp4 operands need K a multiple of {K_MULTIPLE}; K is {k}"
    if n % N_MULTIPLE:
        return f"torch._scaled_mm's fp4 operands need N a multiple of {N_MULTIPLE}; N is {n}"
    if FP4X2 is None:
        return "this torch has no float4_e2m1fn_x2 dtype"
    return _cutlass_reason()


@functools.cache
def _cutlass_reason() -> str | None:
    try:
        import cutlass  # noqa: F401
    except Exception as e:  # not installed, or its libraries do not load
        return f"nvidia-cutlass-dsl cannot be imported: {type(e).__name__}: {e}"
    return None


# ---------------------------------------------------------------------------------------------
# The blocked scale layout (cuBLAS's 128 x 4 block-scaling-factor layout; plain PyTorch)
# ---------------------------------------------------------------------------------------------


def blocked_shape(rows: int, cols: int) -> tuple[int, int]:
    """(rows rounded up to 128, cols rounded up to 4): the padded scale matrix the layout holds."""
    return -(-rows // 128) * 128, -(-cols // 4) * 4


def to_blocked(scales: Tensor) -> Tensor:
    """scales [R, C] (one byte each) -> flat [Rp * Cp] in the blocked layout, zeros in the padding. Each 128 x 4
    tile is 512 contiguous bytes (tiles in row-major tile order); inside it, row r and column c sit at
    (r % 32) * 16 + (r // 32) * 4 + c."""
    rows, cols = scales.shape
    rp, cp = blocked_shape(rows, cols)
    padded = scales.new_zeros(rp, cp)
    padded[:rows, :cols] = scales
    tiles = padded.view(rp // 128, 4, 32, cp // 4, 4)  # (row tile, r // 32, r % 32, column tile, c)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1)


def from_blocked(flat: Tensor, rows: int, cols: int) -> Tensor:
    """`to_blocked`'s inverse: the [rows, cols] scales (padding dropped)."""
    rp, cp = blocked_shape(rows, cols)
    tiles = flat.view(rp // 128, cp // 4, 32, 4, 4)  # (row tile, column tile, r % 32, r // 32, c)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rp, cp)[:rows, :cols]


def blocked_offset(r: Tensor, c: Tensor, cols: int) -> Tensor:
    """The byte offset of scale (r, c) in the blocked layout: the formula the kernel computes."""
    return ((r // 128) * (-(-cols // 4)) + c // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4


def weight_scales(w_block_scale: Tensor) -> Tensor:
    """The weight's e4m3 block scales [N, K / 16] in the blocked layout (once per scale tensor; see the module
    docstring for capture)."""
    return prepared_weights.get_or_record(
        w_block_scale, KIND, lambda: to_blocked(w_block_scale.view(torch.uint8)).view(torch.float8_e4m3fn))


# ---------------------------------------------------------------------------------------------
# The quantization in plain PyTorch (the kernel's operations, in its order)
# ---------------------------------------------------------------------------------------------

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_UP = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
"""Midpoints of the e2m1 grid; a tie rounds to the code with an even mantissa: down at 0.25, 1.25, 2.5 and 5,
up at 0.75, 1.75 and 3.5."""
_TIES_UP = (False, True, False, True, False, True, False)


def e2m1_codes(v: Tensor) -> Tensor:
    """float32 v -> e2m1 codes (uint8 0..15, bit 3 the sign), round to nearest even, saturating at +-6 (what
    `cvt.rn.satfinite.e2m1x2.f32` does)."""
    a = v.abs()
    mag = torch.zeros_like(v, dtype=torch.uint8)
    for mid, up in zip(_E2M1_UP, _TIES_UP):
        mag += (a >= mid if up else a > mid).to(torch.uint8)
    return mag | (torch.signbit(v).to(torch.uint8) << 3)


def e4m3_rn(t: Tensor) -> Tensor:
    """float32 t >= 0 -> float8_e4m3fn, round to nearest even, saturating at 448 (torch's cast gives NaN above)."""
    return t.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


class Quantized(NamedTuple):
    codes: Tensor  # uint8 [M, K / 2], element 2i in the low nibble
    scales: Tensor  # float8_e4m3fn [M, K / 16] (not blocked)
    row_scale: Tensor  # float32 [M]: the second-level scale of each row


def quantize_emulated(x2d: Tensor, global_scale: Tensor | None = None) -> Quantized:
    """The kernel's quantization of x2d [M, K] (K a multiple of 16), on any device: `global_scale` None for the
    per-row amax scale ("row"), else the one given float32 scale ("given")."""
    x = x2d.float()
    m, k = x.shape
    blocks = x.view(m, k // BLOCK, BLOCK)
    bmax = blocks.abs().amax(-1)
    if global_scale is None:
        g = x.abs().amax(-1) / torch.tensor(E2M1_MAX * E4M3_MAX, dtype=torch.float32)
    else:
        g = global_scale.float().reshape(1).expand(m)
    g6 = g * E2M1_MAX
    t = torch.where(g6[:, None] > 0, bmax / g6[:, None], torch.zeros_like(bmax))
    s8 = e4m3_rn(t)
    d = s8.float() * g[:, None]
    r = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    codes = e2m1_codes(blocks * r[..., None]).view(m, k)
    return Quantized(codes[:, 0::2] | (codes[:, 1::2] << 4), s8, g.contiguous())


def dequantize_emulated(q: Quantized) -> Tensor:
    """float64 [M, K]: e2m1(codes) * scale * row scale (exact in float64)."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64, device=q.codes.device)
    values = torch.cat([grid, -grid])
    m, half = q.codes.shape
    pairs = torch.stack([values[(q.codes & 15).long()], values[(q.codes >> 4).long()]], dim=-1).view(m, 2 * half)
    scale = q.scales.double() * q.row_scale.double()[:, None]
    return (pairs.view(m, -1, BLOCK) * scale[..., None]).view(m, 2 * half)


def emulate(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor) -> Tensor:
    """`matmul`'s result before its rounding to x's dtype, in float64: x quantized as the kernel does, both operands
    dequantized exactly, a float64 matmul."""
    from .nvfp4_linear import decode

    w = decode(w_fp4).double().view(w_fp4.shape[0], -1, BLOCK) * w_block_scale.double()[..., None]
    w = w.view(w_fp4.shape[0], -1) * w_global_scale.double()
    return dequantize_emulated(quantize_emulated(x2d)) @ w.T


# ---------------------------------------------------------------------------------------------
# Compilation and launch
# ---------------------------------------------------------------------------------------------


class _Key(NamedTuple):
    dtype: torch.dtype
    mode: str
    arch: str


def _compile(key: _Key):
    """Compile one variant with fake tensors (no GPU needed)."""
    cute = compile_utils.cute_for(key.arch)
    from cutlass import Float32, Int32

    from .cute.nvfp4_quantize_activation import NVFP4QuantizeActivation

    sym, sym64 = cute.sym_int, cute.sym_int64
    dt = compile_utils.cutlass_dtype(key.dtype)
    x = cute.runtime.make_fake_tensor(dt, (sym(), sym()), (sym64(divisibility=K_MULTIPLE), 1), assumed_align=16)
    codes = cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(divisibility=4), 1), assumed_align=16)
    scales = cute.runtime.make_fake_compact_tensor(Int32, (sym(),))
    row_scale = cute.runtime.make_fake_compact_tensor(Float32, (sym(),))
    return compile_utils.compile_for_tvm_ffi(cute, NVFP4QuantizeActivation(dt, key.mode), x, codes, scales,
                                             row_scale, arch=key.arch)


compiled = compile_utils.CompiledVariants(_compile)
"""`compiled(key)`: the quantize variant `key` names, compiled on first use."""


def _arch(device: torch.device) -> str:
    major, _ = switches.capability(device.index)
    return switches.current().cute_dsl_arch or ARCHS[major]


def warmup(dtype: torch.dtype, device: torch.device | str = "cuda") -> None:
    """Compile the variant calls in `dtype` run, outside CUDA-graph capture."""
    compiled(_Key(dtype, "row", _arch(torch.device(device))))


def _rows(x2d: Tensor) -> Tensor:
    """x as the kernel reads it: row-major, rows back to back, 16-byte aligned."""
    x2d = layout.contiguous_strides(x2d)
    if x2d.stride() != (x2d.shape[1], 1) or x2d.data_ptr() % 16:
        x2d = x2d.new_empty(x2d.shape).copy_(x2d)
    return x2d


def quantize(x2d: Tensor, global_scale: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel on x2d [M, K]: (codes uint8 [M, K / 2], blocked e4m3 scales flat [Mp * Cp], row scales float32
    [M]) ("given" mode with `global_scale`, whose one element it reads on the device and returns as the row
    scales, expanded)."""
    x2d = _rows(x2d)
    m, k = x2d.shape
    rp, cp = blocked_shape(m, k // BLOCK)
    codes = torch.empty(m, k // 2, dtype=torch.uint8, device=x2d.device)
    scales = torch.empty(rp * cp, dtype=torch.uint8, device=x2d.device)
    mode = "row" if global_scale is None else "given"
    g = torch.empty(m, dtype=torch.float32, device=x2d.device) if global_scale is None else \
        global_scale.reshape(1).to(torch.float32)
    kernel = compiled(_Key(x2d.dtype, mode, _arch(x2d.device)))
    with torch.cuda.device(x2d.device):
        kernel(x2d, codes.view(torch.int32), scales.view(torch.int32), g)
    return codes, scales.view(torch.float8_e4m3fn), g.expand(m)


def _check(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor) -> tuple[int, int]:
    n, k = layout.nvfp4_operands(w_fp4, w_block_scale, w_global_scale)
    if x2d.dim() != 2 or x2d.shape[1] != k:
        raise ValueError(f"x must be [M, {k}], got {list(x2d.shape)}")
    reason = unsupported_reason(x2d, n, k)
    if reason is not None:
        raise ValueError(reason)
    return n, k


def matmul(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor) -> Tensor:
    """x2d [M, K] @ dequant(w)^T with x quantized to NVFP4 -> [M, N] in x's dtype (module docstring). Callers ask
    `unsupported_reason` first."""
    _check(x2d, w_fp4, w_block_scale, w_global_scale)
    codes, scales, row_scale = quantize(x2d)
    acc = torch._scaled_mm(codes.view(FP4X2), w_fp4.view(FP4X2).t(), scales, weight_scales(w_block_scale),
                           out_dtype=torch.float32)
    alpha = row_scale[:, None] * w_global_scale.reshape(1, 1)
    return acc.mul_(alpha).to(x2d.dtype)
