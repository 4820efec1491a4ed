"""`fa4::nvfp4_linear`: a linear layer over an NVFP4 weight (e2m1 codes, an e4m3 scale per 16 inputs, a
float32 scale per tensor).

    out = torch.ops.fa4.nvfp4_linear(x, w_fp4, w_block_scale, w_global_scale, bias=None, quantize_activations=False,
                                     scale_layout="rowmajor")

x [..., K] float16, bfloat16 or float32; w_fp4 uint8 [N, K // 2], two e2m1 codes per byte: input 2i in the
LOW nibble, 2i + 1 in the high one (torchao's `pack_uint4`, compressed-tensors' `pack_fp4_to_uint8`, ModelOpt
and PyTorch's `float4_e2m1fn_x2` all pack this way); w_block_scale float8_e4m3fn [N, K // 16]; w_global_scale
float32, 0-d; bias None or [N] in x's dtype. K is a multiple of 16. out [..., N] in x's dtype, contiguous.

`scale_layout="blocked"`: w_block_scale holds the [N, K // 16] scales in cuBLAS's 128 x 4 blocked layout
(`nvfp4_blackwell.to_blocked`; torchao's swizzled `NVFP4Tensor.scale`, [32 * ceil(N / 128), 16 * ceil(K / 64)]):
any shape whose elements, read in row-major order, are that layout's bytes (padding included). The reference
and the fake un-block them per call; a CUDA call un-blocks each scale tensor once (`prepared_weights`, kind
`UNBLOCKED_KIND`), so that a compiled graph reads torchao's stored scales with no un-swizzle per step (lowering
emits it when the graph's un-swizzle of a graph input is exactly `from_blocked`). The results are the row-major
call's, bit for bit.

The arithmetic, in this order (torchao's `NVFP4Tensor.dequantize` and `fa4_inductor.nvfp4.NVFP4Linear`
compute exactly this, so rewriting them changes no bit):

    scale = w_global_scale * w_block_scale.float()            # [N, K // 16], rounded to float32
    w = (e2m1(w_fp4) * scale[n, k // 16]).to(x.dtype)         # rounded to float32, then to x's dtype
    out = F.linear(x, w, bias)

An e2m1 value times an e4m3 scale is exact in float32 (at most 6 significant bits); the order above rounds
the product of the two scales first. `(e2m1 * block) * global`, the other order, rounds once: the two
dequantized weights differ by at most one float32 ulp before the rounding to x's dtype (lowering declines it).

Kernels: CPU runs this reference. CUDA sends calls with at most `W4A16_MAX_M` rows of x to our W4A16 decode GEMM
(`w4a16_decode.nvfp4_matmul`: the weight decoded exactly in registers, bf16 products on the tensor cores,
float32 sums), those with at most `QUACK_MAX_M` rows to quack's W4A16 GEMM
(`quack_w4a16.nvfp4_matmul`, which decodes the 4-bit weight in registers; it multiplies exact bf16 products
and accumulates in float32, so it does not round the dequantized weight to x's dtype first), where that
adapter says it can take them, and everything else to the reference: the weight dequantized on the device,
then cuBLAS. The op has no autograd formula: lowering emits it in Inductor's compiled graphs, after AOTAutograd.
`quantize_activations=True` (emitted under `fa4_inductor.backend(nvfp4_activations=True)`) lets a CUDA call on
Blackwell (sm100 / sm120) quantize x to NVFP4 too and run the FP4 tensor cores (`nvfp4_blackwell.matmul`: W4A4,
other numerics, hence opt-in); everywhere else, and for shapes that path declines, the flag changes nothing.
`unsupported_reason` is the check lowering asks before emitting it (exported as
`kernels.nvfp4_linear_unsupported_reason`).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import crossover, layout, library, nvfp4_blackwell, prepared_weights, quack_w4a16, switches, w4a16_decode

X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DEVICES = ("cpu", "cuda")
SCALE_LAYOUTS = ("rowmajor", "blocked")
UNBLOCKED_KIND = "nvfp4_unblocked_scales"
BLOCK = layout.NVFP4_BLOCK  # inputs per e4m3 block scale

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The value of each 4-bit e2m1 code: bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa."""

W4A16_MAX_M = 16
"""Rows of x up to which CUDA calls go to our W4A16 decode GEMM (`w4a16_decode.nvfp4_matmul`). H200, CUDA-graph
medians (docs/benchmarks.md, sessions 8 and 9): 1.14-1.52x bf16 cuBLAS at M = 1..8 on 8192 x 8192, 2048 x 8192,
8192 x 2048, 14336 x 4096 and 4096 x 14336, 3-5x quack; at M = 16 slower than bf16 (17.5-50 us) but 2.7-5x faster
than quack's GEMM and default compile of torchao's NVFP4 linear (46-201 us), the two other ways to run it."""

QUACK_ROUTE = True
"""quack's W4A16 GEMM takes NVFP4 calls above `W4A16_MAX_M` rows (up to `QUACK_MAX_M`)."""

QUACK_MAX_M = 256
"""Rows of x up to which CUDA calls go to quack's W4A16 GEMM; above it the dequantized weight and cuBLAS. H200,
docs/benchmarks.md sessions 8 and 14: at M = 256 quack takes 38-128 us on the Llama-1B and -8B shapes, the
dequantize route 62-746 us."""

QUACK_MIN_WEIGHTS = 1 << 24
"""Weights (N * K) from which quack's GEMM, at `W4A16_MAX_M` + 1 .. `QUACK_MAX_M` rows, beats default torch.compile
of torchao's NVFP4 linear, so that lowering rewrites such matmuls (`rows_reason`). H200, docs/benchmarks.md
sessions 8 and 14, quack / default compile, us: 4096 x 4096 M = 16 48.1 / 57.6, M = 256 59.3 / 62.9; 8192 x 2048
and 2048 x 8192 M = 16..256 1.07-1.18x; 14336 x 4096 and 4096 x 14336 1.7-2x. Below it default compile wins
(2048 x 2048 M = 16..256: 33-38 / 18-23; 512 x 2048: 29-36 / 9.2-9.5). Default compile's dequantization costs
about 3.3 us per million weights, quack about 1.1 plus 31 us: they cross near 12 million weights."""


_name = layout.dtype_name


def unsupported_reason(device_type: str, dtype: torch.dtype, in_features: int) -> str | None:
    """Why `fa4::nvfp4_linear` cannot take an x of `dtype` over a weight of `in_features` columns on this
    device, or None if it can."""
    if device_type not in DEVICES:
        return f"device {device_type} has no fa4 nvfp4_linear kernel"
    if dtype not in X_DTYPES:
        return f"x dtype {_name(dtype)} is not supported (takes {', '.join(map(_name, X_DTYPES))})"
    if in_features % BLOCK:
        return f"{in_features} input features are not a multiple of the {BLOCK}-input scale block"
    return None


def rows_reason(x: Tensor, n: int, k: int, quantize_activations: bool = False) -> str | None:
    """Why lowering keeps a weight-only NVFP4 matmul over this (fake) x and an [n, k] weight as written on CUDA, or
    None: the op beats default torch.compile's dequantize-then-matmul on sm90 through our W4A16 decode GEMM for at
    most `W4A16_MAX_M` rows, and through quack's GEMM up to `QUACK_MAX_M` rows of a weight of at least
    `QUACK_MIN_WEIGHTS` (measured slower elsewhere). A symbolic row count is answered for its hint, each comparison
    guarding the compiled graph (a later call on the other side recompiles). CPU calls (the reference) and the
    Blackwell W4A4 path are not limited."""
    if x.device.type != "cuda" or quantize_activations:
        return None
    rows = math.prod(x.shape[:-1])  # symbolic (lowering's dynamic graphs): each comparison below guards the graph
    major, minor = switches.capability(x.device.index)
    if major != 9:
        return f"our W4A16 GEMM is built for sm90; on sm{major}{minor} the op is not faster than default compile"
    if rows <= W4A16_MAX_M:
        return None
    if rows > QUACK_MAX_M:
        return (f"{rows} rows of x: on CUDA the op beats default compile only up to {QUACK_MAX_M} rows "
                "(measured slower above)")
    if n * k < QUACK_MIN_WEIGHTS:
        return (f"{rows} rows of x over a {n} x {k} weight: above {W4A16_MAX_M} rows the op (quack's GEMM) beats "
                f"default compile only from {QUACK_MIN_WEIGHTS} weights")
    if not QUACK_ROUTE:
        return f"{rows} rows of x: above {W4A16_MAX_M} rows the op beats default compile only through quack's GEMM, " \
            "turned off (QUACK_ROUTE)"
    return quack_w4a16.unsupported_reason(x, "nvfp4", n, k)


INDUCTOR_GEMV_FASTER: frozenset = frozenset()
"""[N, K] NVFP4 weights whose one-row linear Inductor's fused decode GEMV (coordinate descent tuning) ran faster than
the op on the H200 (docs/scripts/one_row_gemv.py, docs/benchmarks.md session 12 run 1): none; us per linear,
Inductor / ours: 2048 x 2048 13.1 / 2.78, 512 x 2048 4.95 / 2.25 (Inductor's decode of the codes costs more than
its bytes save: slower than bf16 cuBLAS, 6.0 us, on 2048 x 2048)."""


def gemv_reason(device_type: str, n: int, k: int) -> str | None:
    """Why lowering leaves a one-row linear over an [n, k] NVFP4 weight, which Inductor has decomposed for its GEMV
    (lowering/gemv.py), to that GEMV, or None."""
    return crossover.inductor_gemv_reason(device_type, n, k, INDUCTOR_GEMV_FASTER, "nvfp4_linear.INDUCTOR_GEMV_FASTER")


def _check_inputs(x: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor,
                  bias: Optional[Tensor], scale_layout: str = "rowmajor") -> None:
    if w_fp4.dtype != torch.uint8 or w_fp4.dim() != 2:
        raise ValueError(f"fa4::nvfp4_linear wants a 2-D uint8 weight (two e2m1 codes a byte), got "
                         f"{w_fp4.dim()}-D {_name(w_fp4.dtype)}")
    if w_block_scale.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fa4::nvfp4_linear wants float8_e4m3fn block scales, got {_name(w_block_scale.dtype)}")
    if w_global_scale.dtype != torch.float32 or w_global_scale.dim() != 0:
        raise ValueError(f"fa4::nvfp4_linear wants a 0-d float32 global scale, got a {w_global_scale.dim()}-d "
                         f"{_name(w_global_scale.dtype)} tensor")
    if x.dim() < 1:
        raise ValueError("fa4::nvfp4_linear wants an x with at least one dim")
    n, k = w_fp4.shape[0], 2 * w_fp4.shape[1]
    reason = unsupported_reason(x.device.type, x.dtype, k)
    if reason is not None:
        raise ValueError(f"fa4::nvfp4_linear: {reason}")
    torch._check(x.shape[-1] == k, lambda: f"fa4::nvfp4_linear: x has {x.shape[-1]} features, the weight {k}")
    if scale_layout == "blocked":
        torch._check(w_block_scale.numel() == blocked_numel(n, k // BLOCK),
                     lambda: f"fa4::nvfp4_linear: blocked w_block_scale has {w_block_scale.numel()} elements, wants "
                             f"{blocked_numel(n, k // BLOCK)} ([{n}, {k // BLOCK}] scales padded to "
                             f"{list(nvfp4_blackwell.blocked_shape(n, k // BLOCK))})")
    elif scale_layout == "rowmajor":
        torch._check(tuple(w_block_scale.shape) == (n, k // BLOCK),
                     lambda: f"fa4::nvfp4_linear: w_block_scale has shape {list(w_block_scale.shape)}, wants "
                             f"{[n, k // BLOCK]}")
    else:
        raise ValueError(f"fa4::nvfp4_linear: scale_layout {scale_layout!r} is not one of {SCALE_LAYOUTS}")
    if bias is not None:
        if bias.dtype != x.dtype:
            raise ValueError(f"fa4::nvfp4_linear wants a bias of x's dtype {_name(x.dtype)}, got {_name(bias.dtype)}")
        torch._check(tuple(bias.shape) == (n,), lambda: f"fa4::nvfp4_linear: bias has shape {list(bias.shape)}, "
                                                        f"wants [{n}]")


@functools.cache
def _pair_table(device: torch.device) -> Tensor:
    """[256, 2] float32: the values of a byte's low and high e2m1 codes."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    codes = torch.arange(256)
    return torch.stack((values[codes & 15], values[codes >> 4]), dim=-1).to(device)


def decode(w_fp4: Tensor) -> Tensor:
    """w_fp4 uint8 [N, K // 2] -> the e2m1 values, float32 [N, K] (exact)."""
    n, half = w_fp4.shape
    return _pair_table(w_fp4.device)[w_fp4.int()].view(n, 2 * half)


def dequantize(w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor, dtype: torch.dtype) -> Tensor:
    """The weight [N, K] in `dtype`, rounded as the module docstring says."""
    n, k = w_fp4.shape[0], 2 * w_fp4.shape[1]
    scale = w_global_scale * w_block_scale.float()
    return decode(w_fp4).view(n, k // BLOCK, BLOCK).mul_(scale.unsqueeze(-1)).view(n, k).to(dtype)


def blocked_index(n: int, groups: int) -> Tensor:
    """int64 [n, groups]: where scale (r, c) of [n, groups] scales sits in the blocked layout, in row-major order
    (what `scale_layout="blocked"` reads)."""
    return nvfp4_blackwell.blocked_offset(torch.arange(n)[:, None], torch.arange(groups)[None, :], groups)


def blocked_numel(n: int, groups: int) -> int:
    """The elements of [n, groups] scales in the blocked layout, padding included."""
    rows, cols = nvfp4_blackwell.blocked_shape(n, groups)
    return rows * cols


def unblocked(w_block_scale: Tensor, n: int, groups: int) -> Tensor:
    """Blocked scales (any shape, row-major order) -> the [n, groups] scales, a view where it can be."""
    flat = w_block_scale.reshape(-1).view(torch.uint8)
    return nvfp4_blackwell.from_blocked(flat, n, groups).view(torch.float8_e4m3fn)


def unblocked_once(w_block_scale: Tensor, n: int, groups: int) -> Tensor:
    """`unblocked`, contiguous, made once per blocked scale tensor (`prepared_weights.get_or_record`: under CUDA-graph
    capture a tensor not met before is un-blocked in the graph instead, a copy of N * K / 16 bytes)."""
    return prepared_weights.get_or_record(w_block_scale, UNBLOCKED_KIND,
                                          lambda: unblocked(w_block_scale, n, groups).contiguous())


def rowmajor_block_scale(w_fp4: Tensor, w_block_scale: Tensor, scale_layout: str) -> Tensor:
    """The block scales in the row-major layout the CUDA kernels read: as they are, or blocked ones un-blocked once
    (`unblocked_once`)."""
    if scale_layout != "blocked":
        return w_block_scale
    return unblocked_once(w_block_scale, w_fp4.shape[0], w_fp4.shape[1] * 2 // BLOCK)


def nvfp4_linear(x: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor,
                 bias: Optional[Tensor] = None, quantize_activations: bool = False,
                 scale_layout: str = "rowmajor") -> Tensor:
    """The reference, on any device: the weight dequantized (module docstring), then `F.linear`
    (`quantize_activations` only permits the Blackwell path; the reference keeps x as it is)."""
    _check_inputs(x, w_fp4, w_block_scale, w_global_scale, bias, scale_layout)
    if scale_layout == "blocked":
        w_block_scale = unblocked(w_block_scale, w_fp4.shape[0], w_fp4.shape[1] * 2 // BLOCK)
    return F.linear(x, dequantize(w_fp4, w_block_scale, w_global_scale, x.dtype), bias).contiguous()


def kernel_for(x2d: Tensor, w_fp4: Tensor, quantize_activations: bool = False) -> tuple[str, str]:
    """("nvfp4_blackwell", ""), ("w4a16", ""), ("quack", "") or ("dequantize", why not the others) for a CUDA
    call with a 2-D x."""
    blackwell = None
    if quantize_activations:
        blackwell = nvfp4_blackwell.unsupported_reason(x2d, w_fp4.shape[0], 2 * w_fp4.shape[1])
        if blackwell is None:
            return "nvfp4_blackwell", ""
    route, why = _weight_only_kernel_for(x2d, w_fp4)
    return (route, why) if blackwell is None or route != "dequantize" else (route, f"{blackwell}; {why}")


def _weight_only_kernel_for(x2d: Tensor, w_fp4: Tensor) -> tuple[str, str]:
    m, n, k = x2d.shape[0], w_fp4.shape[0], 2 * w_fp4.shape[1]
    ours = w4a16_decode.unsupported_reason(x2d, "nvfp4", n, k) if 0 < m <= W4A16_MAX_M else \
        f"{m} rows of x, outside our W4A16 GEMM's 1..{W4A16_MAX_M}"
    if ours is None:
        return "w4a16", ""
    if not QUACK_ROUTE:
        return "dequantize", ours
    if not 0 < m <= QUACK_MAX_M:
        return "dequantize", f"{m} rows of x, outside quack's 1..{QUACK_MAX_M}"
    reason = quack_w4a16.unsupported_reason(x2d, "nvfp4", n, k)
    return ("quack", "") if reason is None else ("dequantize", reason)


def _nvfp4_linear_cuda(x: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor,
                       bias: Optional[Tensor] = None, quantize_activations: bool = False,
                       scale_layout: str = "rowmajor") -> Tensor:
    _check_inputs(x, w_fp4, w_block_scale, w_global_scale, bias, scale_layout)
    w_block_scale = rowmajor_block_scale(w_fp4, w_block_scale, scale_layout)
    x2d = x.reshape(-1, x.shape[-1])
    route = kernel_for(x2d, w_fp4, quantize_activations)[0]
    if route == "dequantize":
        return nvfp4_linear(x, w_fp4, w_block_scale, w_global_scale, bias)
    matmul = {"nvfp4_blackwell": nvfp4_blackwell.matmul, "w4a16": w4a16_decode.nvfp4_matmul,
              "quack": quack_w4a16.nvfp4_matmul}[route]
    out = matmul(x2d, w_fp4, w_block_scale, w_global_scale)
    if bias is not None:
        out = out.add_(bias)
    return out.view(*x.shape[:-1], w_fp4.shape[0])


def _nvfp4_linear_fake(x, w_fp4, w_block_scale, w_global_scale, bias=None, quantize_activations=False,
                       scale_layout="rowmajor"):
    _check_inputs(x, w_fp4, w_block_scale, w_global_scale, bias, scale_layout)
    return x.new_empty((*x.shape[:-1], w_fp4.shape[0]))


library.define("nvfp4_linear(Tensor x, Tensor w_fp4, Tensor w_block_scale, Tensor w_global_scale, "
               "Tensor? bias=None, bool quantize_activations=False, str scale_layout=\"rowmajor\") -> Tensor")
library.impl("nvfp4_linear", nvfp4_linear, "CompositeExplicitAutograd")
library.impl("nvfp4_linear", _nvfp4_linear_cuda, "CUDA")
library.register_fake("nvfp4_linear", _nvfp4_linear_fake)
