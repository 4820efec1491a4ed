"""`fa4::fp8_linear`: a linear layer over a float8_e4m3fn weight with a per-output-channel or per-tensor scale.

    out = torch.ops.fa4.fp8_linear(x, w, w_scale, x_scale=None, bias=None, *, use_fast_accum=False)

x [..., K] float16, bfloat16 or float32; w [N, K] float8_e4m3fn; w_scale float32 [N] (per output channel) or [1]
(per tensor); x_scale None, or float32 [M] (per row of x, M = x.numel() // K) or [1]; bias None or [N] in x's dtype.
out [..., N] in x's dtype, contiguous.

Two arithmetic orders, each exactly what the model code it replaces computes (lowering/fp8_linear.py):

- x_scale given (torchao's `Float8DynamicActivationFloat8WeightConfig`, `torch._scaled_mm`): x holds the
  activation's fp8 codes, cast exactly to x's dtype, and x_scale their scale:
      out = ((x.float() @ w.float().T) * x_scale[:, None] * w_scale[None, :] (+ bias.float())).to(x.dtype)
  one rounding, of the float32 result: `torch._scaled_mm`'s arithmetic on the CPU, up to the order of the float32
  sums (tests/test_fp8_linear.py); `use_fast_accum` only reaches cuBLAS.
- x_scale None (torchao's `Float8WeightOnlyConfig`, `F.linear(x, (w.float() * scale[:, None]).to(x.dtype))`):
      out = F.linear(x, (w.float() * w_scale[:, None]).to(x.dtype), bias)
  the weight rounded once to x's dtype, then eager's matmul: eager's output bit for bit.

Kernels: the CPU runs this reference. CUDA calls go to the first route of `CUDA_ROUTES` that takes them
(`choose`; `kernel_for` says which and why):
- `w4a16_fp8`: our weight-only decode GEMM (kernels/w4a16_decode.py, `fp8_matmul`) for at most `W4A16_MAX_ROWS`
  rows of a bf16 / fp16 x, with an x_scale only over the weights where cuBLAS's fp8 GEMM is slow (`cublas_fp8_reason`:
  at most SCALED_MM_NARROW_N rows, or K at least SCALED_MM_SLOW_K x N): the 1-byte weight read
  in place, faster than bf16 cuBLAS on every shape measured and than cuBLAS's fp8 GEMM there. Both orders become
  one: exact products summed in float32, times w_scale (and x_scale), plus the bias, rounded once. For x_scale
  given that is the reference's arithmetic up to the order of the sums; for the weight-only order it skips the
  rounding of the dequantized weight to x's dtype, so it is within a rounding of x's dtype of the reference,
  not bit for bit.
- `scaled_mm`: calls with an x_scale: `torch._scaled_mm`, the call the graph made (x cast back to fp8, exact).
- `dense`: the reference on the device.

The op has no autograd formula: lowering emits it in Inductor's compiled graphs, after AOTAutograd has
written any backward out. `unsupported_reason` is the check lowering asks before emitting it, `scaled_mm_kept_reason`
where `torch._scaled_mm` is better left as written (exported as `kernels.fp8_linear_unsupported_reason`,
`kernels.fp8_linear_scaled_mm_kept_reason`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import layout, library, routes, switches, w4a16_decode
from .int8_linear import Route, choose, rows

X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WEIGHT_DTYPE = torch.float8_e4m3fn
DEVICES = ("cpu", "cuda")
W4A16_MAX_ROWS = 16
SCALED_MM_SLOW_K = 2
SCALED_MM_NARROW_N = 2048
"""`torch._scaled_mm` calls go to our decode GEMM only over weights of at most SCALED_MM_NARROW_N rows (N) or whose K
is at least SCALED_MM_SLOW_K times N.
H100, CUDA-graph medians, x quantized per row, us, ours / `_scaled_mm` at 1, 4 and 16 rows (docs/benchmarks.md,
session 45 runs 1 and 4): 2048 x 8192 10.2 / 22.7, 10.6 / 22.7, 12.7 / 22.8 and 4096 x 14336 25.6 / 41.7, 26.4 / 41.1,
28.8 / 39.8 (cuBLAS reads long-K fp8 weights at 0.7-1.5 TB/s), 512 x 2048 3.0 / 8.5 at one row; but 8192 x 8192
30.9 / 30.0, 32.1 / 30.4, 34.4 / 30.5, 8192 x 2048 10.9 / 10.5, 11.5 / 10.4, 13.6 / 10.4 and 14336 x 4096 26.0 / 27.6,
27.4 / 27.3, 39.2 / 27.7; 2048 x 2048 4.2 / 8.9 at one row (cuBLAS's 128-row tiles leave most SMs idle over 2048-row
weights). Weight-only calls have no fp8 GEMM to lose to: ours is faster than bf16 cuBLAS on a bf16 weight on every row
above (1.10-1.91x)."""
SCALED_MM_MULTIPLE = 16  # torch._scaled_mm on CUDA: both dims of each operand
SCALED_MM_MIN_CAPABILITY = (8, 9)


_name = layout.dtype_name


def unsupported_reason(device_type: str, dtype: torch.dtype, weight_dtype: torch.dtype = WEIGHT_DTYPE) -> str | None:
    """Why `fa4::fp8_linear` cannot take an x of `dtype` over a weight of `weight_dtype` on this device, or None."""
    if device_type not in DEVICES:
        return f"device {device_type} has no fa4 fp8_linear kernel"
    if dtype not in X_DTYPES:
        return f"x dtype {_name(dtype)} is not supported (takes {', '.join(map(_name, X_DTYPES))})"
    if weight_dtype != WEIGHT_DTYPE:
        return f"weight dtype {_name(weight_dtype)} is not supported (takes {_name(WEIGHT_DTYPE)})"
    return None


def scaled_mm_kept_reason(device_type: str, dtype: torch.dtype, m: Optional[int], n: int, k: int) -> str | None:
    """Why lowering keeps a `torch._scaled_mm` call of m rows (None: decided per call, by the op's routes) over an
    [n, k] weight with a `dtype` output as written: on CUDA the op takes it from `torch._scaled_mm` only for our decode
    GEMM (`gemm_reason`); any other call would run `torch._scaled_mm` again."""
    if device_type != "cuda":
        return None
    reason = gemm_reason(m, dtype, n, k, scaled=True)
    return None if reason is None else f"{reason}: the op would only call torch._scaled_mm again"


def gemm_reason(m: Optional[int], dtype: torch.dtype, n: int, k: int, scaled: bool) -> str | None:
    """Why our fp8 decode GEMM does not take a call of m rows (None: not known yet) of a `dtype` x over an [n, k]
    weight, with x's scale (`scaled`) or weight-only: at most `W4A16_MAX_ROWS` rows of a bf16 / fp16 x, and with x's
    scale only over weights where it is measured faster than cuBLAS's fp8 GEMM (`cublas_fp8_reason`). None if it
    does (the device aside: `w4a16_decode.unsupported_reason`)."""
    if m is not None and m > W4A16_MAX_ROWS:
        return f"{m} rows > {W4A16_MAX_ROWS}, outside our fp8 decode GEMM (W4A16_MAX_ROWS)"
    if dtype not in layout.HALF_DTYPES:
        return f"our fp8 decode GEMM takes bf16 / fp16 x, not {_name(dtype)}"
    return cublas_fp8_reason(n, k) if scaled else None


def cublas_fp8_reason(n: int, k: int) -> str | None:
    """Why `torch._scaled_mm` over an [n, k] fp8 weight stays with cuBLAS (SCALED_MM_NARROW_N, SCALED_MM_SLOW_K), or
    None."""
    if n > SCALED_MM_NARROW_N and k < SCALED_MM_SLOW_K * n:
        return (f"N {n} > {SCALED_MM_NARROW_N} and K {k} < {SCALED_MM_SLOW_K} x N: torch._scaled_mm is measured as "
                "fast as our fp8 decode GEMM or faster over such weights (SCALED_MM_NARROW_N, SCALED_MM_SLOW_K)")
    return None


def _check_inputs(x: Tensor, w: Tensor, w_scale: Tensor, x_scale: Optional[Tensor], bias: Optional[Tensor]) -> None:
    if w.dim() != 2:
        raise ValueError(f"fa4::fp8_linear wants a 2-D weight, got {w.dim()}-D")
    if x.dim() < 1:
        raise ValueError("fa4::fp8_linear wants an x with at least one dim")
    reason = unsupported_reason(x.device.type, x.dtype, w.dtype)
    if reason is not None:
        raise ValueError(f"fa4::fp8_linear: {reason}")
    n, k = w.shape
    torch._check(x.shape[-1] == k, lambda: f"fa4::fp8_linear: x has {x.shape[-1]} features, the weight {k}")
    m = rows(x)
    for name, t, shapes in (("w_scale", w_scale, ((n,), (1,))), ("x_scale", x_scale, ((m,), (1,)))):
        if t is None:
            continue
        if t.dtype != torch.float32:
            raise ValueError(f"fa4::fp8_linear wants a float32 {name}, got {_name(t.dtype)}")
        torch._check(tuple(t.shape) in shapes, lambda: f"fa4::fp8_linear: {name} has shape {list(t.shape)}, wants "
                                                       f"{' or '.join(str(list(s)) for s in shapes)}")
    if bias is not None:
        if bias.dtype != x.dtype:
            raise ValueError(f"fa4::fp8_linear wants a bias of x's dtype {_name(x.dtype)}, got {_name(bias.dtype)}")
        torch._check(tuple(bias.shape) == (n,), lambda: f"fa4::fp8_linear: bias has shape {list(bias.shape)}, "
                                                        f"wants [{n}]")


def dequantize(w: Tensor, w_scale: Tensor, dtype: torch.dtype) -> Tensor:
    """w [N, K] times its scale, in float32, rounded to `dtype`."""
    return (w.float() * w_scale.reshape(-1, 1)).to(dtype)


def fp8_linear(x: Tensor, w: Tensor, w_scale: Tensor, x_scale: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, *, use_fast_accum: bool = False) -> Tensor:
    """The reference, on any device: see the module docstring for the two arithmetic orders."""
    _check_inputs(x, w, w_scale, x_scale, bias)
    return _reference(x, w, w_scale, x_scale, bias)


def _reference(x: Tensor, w: Tensor, w_scale: Tensor, x_scale: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    if x_scale is None:
        return F.linear(x, dequantize(w, w_scale, x.dtype), bias).contiguous()
    n, k = w.shape
    out = (x.reshape(-1, k).float() @ w.float().T) * x_scale.reshape(-1, 1) * w_scale.reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).view(*x.shape[:-1], n)


def _fp8_linear_fake(x, w, w_scale, x_scale=None, bias=None, *, use_fast_accum=False):
    _check_inputs(x, w, w_scale, x_scale, bias)
    return x.new_empty((*x.shape[:-1], w.shape[0]))


# ---------------------------------------------------------------------------------------------- CUDA routes


def _w4a16_reason(x, w, w_scale, x_scale=None, bias=None, *, use_fast_accum=False) -> str | None:
    m, (n, k) = rows(x), w.shape
    return (gemm_reason(m, x.dtype, n, k, scaled=x_scale is not None)
            or w4a16_decode.unsupported_reason(x.reshape(m, k), "fp8", n, k))


def _w4a16_run(x, w, w_scale, x_scale=None, bias=None, *, use_fast_accum=False) -> Tensor:
    """Both arithmetic orders become one: the scales (and bias) applied to the fp32 sum."""
    out = w4a16_decode.fp8_matmul(x.reshape(-1, x.shape[-1]), w, w_scale, x_scale, bias)
    return out.view(*x.shape[:-1], w.shape[0])


def _scaled_mm_reason(x, w, w_scale, x_scale=None, bias=None, *, use_fast_accum=False) -> str | None:
    if x_scale is None:
        return "a weight-only call: torch._scaled_mm wants the activation's scale"
    major, minor = switches.capability(x.device.index)
    if (major, minor) < SCALED_MM_MIN_CAPABILITY:
        return f"torch._scaled_mm runs on sm89 and newer; this GPU is sm{major}{minor}"
    n, k = w.shape
    if n % SCALED_MM_MULTIPLE or k % SCALED_MM_MULTIPLE:
        return f"torch._scaled_mm needs N and K multiples of {SCALED_MM_MULTIPLE}; the weight is [{n}, {k}]"
    if _row_wise(x_scale, w_scale) and x.dtype != torch.bfloat16:
        return f"torch._scaled_mm's row-wise scaling outputs bfloat16 only, x is {_name(x.dtype)}"
    if bias is not None and x.dtype == torch.float32:
        return "torch._scaled_mm takes no bias with a float32 output"
    return None


def _row_wise(x_scale: Tensor, w_scale: Tensor) -> bool:
    return x_scale.numel() != 1 or w_scale.numel() != 1


def _scaled_mm_run(x, w, w_scale, x_scale=None, bias=None, *, use_fast_accum=False) -> Tensor:
    """One scale per tensor stays so; otherwise both scales are passed per row / column (a [1] scale expanded),
    the only mix `torch._scaled_mm` takes."""
    n, k = w.shape
    x2d = x.reshape(-1, k)
    scale_a, scale_b = x_scale, w_scale
    if _row_wise(x_scale, w_scale):
        scale_a = x_scale.reshape(-1, 1).expand(x2d.shape[0], 1).contiguous()
        scale_b = w_scale.reshape(1, -1).expand(1, n).contiguous()
    out = torch._scaled_mm(x2d.to(WEIGHT_DTYPE), w.t(), scale_a, scale_b, bias, out_dtype=x.dtype,
                           use_fast_accum=use_fast_accum)
    return out.view(*x.shape[:-1], n)


def _dense_reason(x, *args, **kwargs) -> str | None:
    return None


def _dense_run(x, w, w_scale, x_scale=None, bias=None, *, use_fast_accum=False) -> Tensor:
    return _reference(x, w, w_scale, x_scale, bias)


W4A16 = Route("w4a16_fp8", _w4a16_reason, _w4a16_run,
              f"at most {W4A16_MAX_ROWS} rows: our decode GEMM reads the fp8 weight in place")
SCALED_MM = Route("scaled_mm", _scaled_mm_reason, _scaled_mm_run,
                  "an fp8 activation with its scale: torch._scaled_mm, the call the model made")
DENSE = Route("dense", _dense_reason, _dense_run, None)
CUDA_ROUTES = (W4A16, SCALED_MM, DENSE)


def kernel_for(x, w, w_scale, x_scale=None, bias=None, *, use_fast_accum=False) -> tuple[str, str]:
    """(route name, why) for a CUDA call of the op: what it would run."""
    route, declined = choose(CUDA_ROUTES, x, w, w_scale, x_scale, bias, use_fast_accum=use_fast_accum)
    return route.name, routes.why(route, declined)


def fp8_linear_cuda(x: Tensor, w: Tensor, w_scale: Tensor, x_scale: Optional[Tensor] = None,
                    bias: Optional[Tensor] = None, *, use_fast_accum: bool = False) -> Tensor:
    _check_inputs(x, w, w_scale, x_scale, bias)
    route, _ = choose(CUDA_ROUTES, x, w, w_scale, x_scale, bias, use_fast_accum=use_fast_accum)
    return route.run(x, w, w_scale, x_scale, bias, use_fast_accum=use_fast_accum)


library.define_op("fp8_linear(Tensor x, Tensor w, Tensor w_scale, Tensor? x_scale=None, Tensor? bias=None, *, "
                  "bool use_fast_accum=False) -> Tensor", fp8_linear, fp8_linear_cuda, _fp8_linear_fake)
