"""`fa4::int8_linear`: a linear layer over an int8 weight with per-output-channel or per-group scales.

    out = torch.ops.fa4.int8_linear(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False)

x [..., K] float16, bfloat16 or float32; w_int8 [N, K] int8; w_scale [N] (group_size -1: one scale per
output channel) or [N, K // group_size] (one per group of `group_size` consecutive inputs of a row);
bias None or [N] in x's dtype. out [..., N] in x's dtype, contiguous.

Two arithmetic orders, each exactly what the model code it replaces computes (lowering/int8_linear.py):

- `scale_after_matmul=False` (dequantize, then matmul; any group size):
      w = (w_int8.float() * w_scale.float()[n, k // group_size]).to(x.dtype)
      out = F.linear(x, w, bias)
  The product is rounded once to float32 and once to x's dtype. That is what `w.to(x.dtype) * scale`
  computes with a scale in x's dtype (an int8 times a half-precision scale is exact in float32), and
  what `(w.float() * scale).to(x.dtype)` computes with a float32 scale.
- `scale_after_matmul=True` (gpt-fast's `WeightOnlyInt8Linear`; per channel only, w_scale in x's dtype):
      out = F.linear(x, w_int8.to(x.dtype)) * w_scale (+ bias)
  The matmul's result is rounded to x's dtype before it is scaled, as in the model code.

Kernels: the CPU runs this reference. CUDA calls go to the first route of `CUDA_ROUTES` that takes them
(`choose`; `kernel_for` says which and why):
- `w4a16_int8`: our weight-only decode GEMM (kernels/w4a16_decode.py) for decode-sized calls where it is
  measured faster than quack (`w4a16_int8_shape_reason`), per-channel scales, bf16 / fp16 x, K a multiple of
  16: the int8 weight read in place, products summed in fp32, scale (and bias) applied to the sum before one
  rounding, as quack's route below.
- `quack_int8`: quack's SM90 mixed-input GEMM (kernels/quack_w4a16.py) for calls of at most `QUACK_MAX_ROWS` rows
  (x's rows, M; `QUACK_MAX_ROWS_WIDE` over wide weights): it reads the int8 weight itself, 1 byte per weight
  instead of 2, and multiplies by the per-channel scale (and adds the bias) on the fp32 accumulator before one
  rounding to bf16. So its arithmetic differs from both orders above by roundings (the products and sums are
  exact or fp32 either way): within a bf16 rounding of the output, not bit for bit. bf16 x, per-channel scales,
  N % 64 == K % 64 == 0 (quack_w4a16.unsupported_reason says the rest).
- `dense`: the reference on the device: it dequantizes the weight into a temporary per call (reads N*K int8
  bytes, writes 2*N*K for bf16), then cuBLAS multiplies (reads those 2*N*K back). Above the crossover the
  GEMM's own time dominates (8192 x 8192, M = 2048: ~400 us of cuBLAS against ~50 us of dequantize at
  ~4 TB/s); below it the dequantize alone costs more than quack's whole GEMM. Exactly the model code's
  arithmetic (a bf16 result bit for bit equal to eager's cuBLAS call).

The op has no autograd formula: lowering emits it in Inductor's compiled graphs, after AOTAutograd has
written any backward out. `unsupported_reason` is the check lowering asks before emitting it (exported as
`kernels.int8_linear_unsupported_reason`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import crossover, layout, library, quack_w4a16, w4a16_decode

X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCALE_DTYPES = X_DTYPES
DEVICES = ("cpu", "cuda")


_name = layout.dtype_name


def unsupported_reason(device_type: str, dtype: torch.dtype, scale_dtype: torch.dtype, in_features: int,
                       group_size: int = -1, scale_after_matmul: bool = False) -> str | None:
    """Why `fa4::int8_linear` cannot take an x of `dtype` with scales of `scale_dtype` over a weight of
    `in_features` columns on this device, or None if it can."""
    if device_type not in DEVICES:
        return f"device {device_type} has no fa4 int8_linear kernel"
    if dtype not in X_DTYPES:
        return f"x dtype {_name(dtype)} is not supported (takes {', '.join(map(_name, X_DTYPES))})"
    if scale_dtype not in SCALE_DTYPES:
        return f"scale dtype {_name(scale_dtype)} is not supported (takes {', '.join(map(_name, SCALE_DTYPES))})"
    if group_size != -1 and not (group_size > 0 and in_features % group_size == 0):
        return f"group_size {group_size} does not divide the {in_features} input features"
    if scale_after_matmul:
        if group_size != -1:
            return "scales per group cannot be applied after the matmul"
        if scale_dtype != dtype:
            return (f"a scale applied after the matmul must have x's dtype {_name(dtype)}, not {_name(scale_dtype)} "
                    "(it would promote the output)")
    return None


def _check_inputs(x: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor], group_size: int,
                  scale_after_matmul: bool) -> None:
    if w_int8.dtype != torch.int8 or w_int8.dim() != 2:
        raise ValueError(f"fa4::int8_linear wants a 2-D int8 weight, got {w_int8.dim()}-D {_name(w_int8.dtype)}")
    if x.dim() < 1:
        raise ValueError("fa4::int8_linear wants an x with at least one dim")
    n, k = w_int8.shape
    reason = unsupported_reason(x.device.type, x.dtype, w_scale.dtype, k, group_size, scale_after_matmul)
    if reason is not None:
        raise ValueError(f"fa4::int8_linear: {reason}")
    torch._check(x.shape[-1] == k, lambda: f"fa4::int8_linear: x has {x.shape[-1]} features, the weight {k}")
    scale_shape = (n,) if group_size == -1 else (n, k // group_size)
    torch._check(tuple(w_scale.shape) == scale_shape,
                 lambda: f"fa4::int8_linear: w_scale has shape {list(w_scale.shape)}, wants {list(scale_shape)}")
    if bias is not None:
        if bias.dtype != x.dtype:
            raise ValueError(f"fa4::int8_linear wants a bias of x's dtype {_name(x.dtype)}, got {_name(bias.dtype)}")
        torch._check(tuple(bias.shape) == (n,), lambda: f"fa4::int8_linear: bias has shape {list(bias.shape)}, "
                                                        f"wants [{n}]")


def dequantize(w_int8: Tensor, w_scale: Tensor, group_size: int, dtype: torch.dtype) -> Tensor:
    """w_int8 [N, K] times its scales, in float32, rounded to `dtype`."""
    n, k = w_int8.shape
    group = k if group_size == -1 else group_size
    w = w_int8.float().view(n, k // group, group) * w_scale.float().view(n, -1, 1)
    return w.view(n, k).to(dtype)


def int8_linear(x: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor] = None, *,
                group_size: int = -1, scale_after_matmul: bool = False) -> Tensor:
    """The reference, on any device: see the module docstring for the two arithmetic orders."""
    _check_inputs(x, w_int8, w_scale, bias, group_size, scale_after_matmul)
    return _reference(x, w_int8, w_scale, bias, group_size, scale_after_matmul)


def _reference(x: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor], group_size: int,
               scale_after_matmul: bool) -> Tensor:
    if scale_after_matmul:
        out = F.linear(x, w_int8.to(x.dtype)) * w_scale
        if bias is not None:
            out = out + bias
    else:
        out = F.linear(x, dequantize(w_int8, w_scale, group_size, x.dtype), bias)
    return out.contiguous()


def _int8_linear_fake(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False):
    _check_inputs(x, w_int8, w_scale, bias, group_size, scale_after_matmul)
    return x.new_empty((*x.shape[:-1], w_int8.shape[0]))


# ---------------------------------------------------------------------------------------------- CUDA routes

QUACK_MAX_ROWS = 256
QUACK_MAX_ROWS_WIDE = 4096
QUACK_WIDE_N = 4096
"""Calls sent to quack's int8 GEMM: at most QUACK_MAX_ROWS rows (M) over any weight, at most QUACK_MAX_ROWS_WIDE over
weights of at least QUACK_WIDE_N rows (N); the rest go to `dense`. Measured on the H200 (CUDA-graph medians, us):
- M = 256 (docs/benchmarks.md session 13 run 2, both routes forced through the op): quack 17.6 / 12.5 / 48.7 / 55.1
  against dense 63.7 / 20.9 / 206 / 205 on Llama-8B's 4096 x 4096 / 1024 x 4096 / 14336 x 4096 / 4096 x 14336: `dense`
  pays a dequantize per call that quack does not.
- M = 1024 and 4096 (session 15 run 2, quack called directly against the op's dense route): 4096 x 4096 49.6 / 99.8
  and 210 / 282; 14336 x 4096 194 / 347 and 732 / 1031; 4096 x 14336 175 / 316 and 727 / 874 (quack at bf16 cuBLAS's
  speed there); but 1024 x 4096 39.4 / 29.3 at M = 1024, so narrow weights keep `dense` above 256 rows. Above 4096
  rows nothing is measured: `dense`, whose GEMM time dominates as M grows."""


def rows(x: Tensor) -> int:
    """M: the rows of x [..., K]."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def rows_reason(m: int, n: int) -> str | None:
    """Why a call of m rows over an n-row weight does not go to quack's int8 GEMM on account of its size, or None."""
    limit = QUACK_MAX_ROWS_WIDE if n >= QUACK_WIDE_N else QUACK_MAX_ROWS
    if m > limit:
        return (f"{m} rows > {limit} over a weight of {n} rows: quack's int8 GEMM is measured faster than dequantize + "
                "cuBLAS up to there only (QUACK_MAX_ROWS, QUACK_MAX_ROWS_WIDE from QUACK_WIDE_N rows)")
    return None


W4A16_MAX_ROWS = 16
W4A16_MAX_ROWS_WIDE = 8
W4A16_WIDE_ROWS = 8192
W4A16_GEMV_WIDEST = 16384
W4A16_LONG_K = 8192
"""Our W4A16 GEMM takes int8 calls of at most `W4A16_MAX_ROWS` rows over weights of at most 2048 rows (N), of at
most `W4A16_MAX_ROWS_WIDE` rows over weights of at most `W4A16_WIDE_ROWS` rows, and single rows over wider weights
of at most `W4A16_GEMV_WIDEST` rows or whose K is at least `W4A16_LONG_K` (`w4a16_int8_shape_reason`); quack takes
the rest. H200, CUDA-graph medians, PDL, bf16 scales read as they are (docs/benchmarks.md, session 11 run 1), ours
against quack in us: 2048 x 2048 3.5 / 7.1 (M = 1), 4.2 / 7.2 (16); 2048 x 8192 7.8 / 14.1 (1), 11.1 / 14.4 (16);
4096 x 14336 18.3 / 22.2 (1), 19.4 / 22.2 (8), 26.1 / 22.2 (16); 8192 x 8192 21.0 / 23.8 (1), 23.6 / 22.4 (8); 8192 x
2048 8.4 / 8.4 (1), 9.5 / 8.5 (8); 14336 x 4096 21.7 / 19.5 (1). One row runs our CUDA-core GEMV since session 13
(`w4a16_decode.GEMV_AUTO_ROWS`), faster than quack's on every wide shape timed: 8192 x 8192 19.6, 14336 x 4096 18.9
(session 13 run 2), 8192 x 2048 6.3 us (`INDUCTOR_GEMV_FASTER`'s note); in one process (session 27, weights
L2-warm) two one-row calls of 8192 x 2048 took 9.3 us on the GEMV against 13.9 through quack, two of 14336 x 4096
34.6 against 36.1. The Llama-8B lm_head (128256 x 4096: quack 145.3 us, our tensor-core kernel 179.9, session 14
run 5) is wider than any shape the GEMV was timed on and stays with quack. Since session 37 `W4A16_WIDE_ROWS` is
8192 (4096 before): with the load paths of session 36 ours beat quack at 2..8 rows over 8192-row weights in two H100
runs (sessions 36 and 37, us, ours / quack: 8192 x 8192 27.9-28.5 / 29.3-32.4, 8192 x 2048 7.8-8.0 / 9.5-9.7), and
only tied over 14336 x 4096 (23.8-25.0 / 24.9-25.1), which stays with quack."""


INDUCTOR_GEMV_FASTER: frozenset = frozenset({(8192, 2048), (4096, 4096), (1024, 4096)})
"""[N, K] int8 weights whose one-row linear Inductor's fused dequantize GEMV (coordinate descent tuning) ran faster
than the op on the H200 (docs/scripts/one_row_gemv.py, docs/benchmarks.md session 12 run 1; us per linear, weights
from HBM, Inductor / ours): 8192 x 2048 5.46 / 8.11, 4096 x 4096 5.40 / 6.10, 1024 x 4096 2.80 / 6.61. The op was
faster on 2048 x 2048 (3.34 / 3.21), 512 x 2048 (2.60 / 2.21), 2048 x 8192 (9.68 / 7.44), 14336 x 4096 (19.3 /
18.0), 4096 x 14336 (22.7 / 16.3) and 8192 x 8192 (23.2 / 19.4); shapes not measured go to the op. Since session 13
one-row calls of the op run our CUDA-core GEMV (`w4a16_decode.GEMV_AUTO_ROWS`), which `tests/bench_w4a16.py` timed
at 6.3, 6.5 and 3.8 us on the three shapes above (weights from HBM): still slower than Inductor's there."""


def gemv_reason(device_type: str, n: int, k: int) -> str | None:
    """Why lowering leaves a one-row linear over an [n, k] int8 weight, which Inductor has decomposed for its GEMV
    (lowering/gemv.py), to that GEMV, or None."""
    return crossover.inductor_gemv_reason(device_type, n, k, INDUCTOR_GEMV_FASTER, "int8_linear.INDUCTOR_GEMV_FASTER")


def w4a16_int8_shape_reason(m: int, n: int, k: int) -> str | None:
    """Why a call of m rows over an [n, k] int8 weight does not go to our W4A16 GEMM on account of its size."""
    if m > W4A16_MAX_ROWS:
        return f"{m} rows > {W4A16_MAX_ROWS}, outside our W4A16 GEMM (W4A16_MAX_ROWS)"
    if n > W4A16_WIDE_ROWS and (m > 1 or (n > W4A16_GEMV_WIDEST and k < W4A16_LONG_K)):
        return (f"{m} rows over a weight of {n} > {W4A16_WIDE_ROWS} rows and K {k}: quack's GEMM is measured as "
                f"fast or faster (ours leads there only for one row, over at most {W4A16_GEMV_WIDEST} rows or a K >= "
                f"{W4A16_LONG_K})")
    if n > 2048 and m > W4A16_MAX_ROWS_WIDE:
        return f"{m} rows over a weight of {n} > 2048 rows: quack's GEMM is measured faster (W4A16_MAX_ROWS_WIDE)"
    return None


class Route(NamedTuple):
    """A CUDA kernel of the op: its name, whether it takes a call (the op's arguments -> a reason or None),
    the function that runs it (the op's signature), and why it runs a call it takes (None: a fallback)."""

    name: str
    unsupported_reason: Callable[..., Optional[str]]
    run: Callable[..., Tensor]
    takes: Optional[str]


def _quack_reason(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False) -> str | None:
    if group_size != -1:
        return f"quack's int8 GEMM takes per-channel scales, not groups of {group_size}"
    n, k = w_int8.shape
    return rows_reason(rows(x), n) or quack_w4a16.unsupported_reason(x, "int8", n, k)


def _quack_run(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False) -> Tensor:
    """Both arithmetic orders become one: the scale (and bias) applied to the fp32 accumulator."""
    out = quack_w4a16.int8_matmul(x.reshape(-1, x.shape[-1]), w_int8, w_scale, group_size, bias)
    return out.view(*x.shape[:-1], w_int8.shape[0])


def _w4a16_reason(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False) -> str | None:
    if group_size != -1:
        return f"our W4A16 GEMM takes per-channel int8 scales, not groups of {group_size}"
    n, k = w_int8.shape
    m = rows(x)
    return w4a16_int8_shape_reason(m, n, k) or w4a16_decode.unsupported_reason(x.reshape(m, k), "int8", n, k)


def _w4a16_run(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False) -> Tensor:
    """Both arithmetic orders become one, as for quack."""
    out = w4a16_decode.int8_matmul(x.reshape(-1, x.shape[-1]), w_int8, w_scale, bias)
    return out.view(*x.shape[:-1], w_int8.shape[0])


def _dense_reason(x, *args, **kwargs) -> str | None:
    return None


def _dense_run(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False) -> Tensor:
    return _reference(x, w_int8, w_scale, bias, group_size, scale_after_matmul)


QUACK = Route("quack_int8", _quack_reason, _quack_run,
              f"at most {QUACK_MAX_ROWS} rows ({QUACK_MAX_ROWS_WIDE} over weights of {QUACK_WIDE_N} rows or more): "
              "quack's mixed-input GEMM reads the int8 weight directly")
DENSE = Route("dense", _dense_reason, _dense_run, None)
W4A16 = Route("w4a16_int8", _w4a16_reason, _w4a16_run,
              f"at most {W4A16_MAX_ROWS} rows: our W4A16 decode GEMM reads the int8 weight in place")
CUDA_ROUTES = (W4A16, QUACK, DENSE)


def choose(table: tuple[Route, ...], *args, **kwargs) -> tuple[Route, list[str]]:
    """The first route of `table` that takes the call (the op's arguments), and the reasons of those before
    it that declined."""
    declined: list[str] = []
    for route in table:
        reason = route.unsupported_reason(*args, **kwargs)
        if reason is None:
            return route, declined
        declined.append(reason)
    raise AssertionError(f"no route takes the call: {'; '.join(declined)}")


def kernel_for(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False) -> tuple[str, str]:
    """(route name, why) for a CUDA call of the op: what it would run."""
    route, declined = choose(CUDA_ROUTES, x, w_int8, w_scale, bias, group_size=group_size,
                             scale_after_matmul=scale_after_matmul)
    if route.takes is None:
        return route.name, "; ".join(declined)
    return route.name, f"{route.takes} ({'; '.join(declined)})" if declined else route.takes


def int8_linear_cuda(x: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor] = None, *,
                     group_size: int = -1, scale_after_matmul: bool = False) -> Tensor:
    _check_inputs(x, w_int8, w_scale, bias, group_size, scale_after_matmul)
    route, _ = choose(CUDA_ROUTES, x, w_int8, w_scale, bias, group_size=group_size,
                      scale_after_matmul=scale_after_matmul)
    return route.run(x, w_int8, w_scale, bias, group_size=group_size, scale_after_matmul=scale_after_matmul)


library.define("int8_linear(Tensor x, Tensor w_int8, Tensor w_scale, Tensor? bias=None, *, int group_size=-1, "
               "bool scale_after_matmul=False) -> Tensor")
library.impl("int8_linear", int8_linear, "CompositeExplicitAutograd")
library.impl("int8_linear", int8_linear_cuda, "CUDA")
library.register_fake("int8_linear", _int8_linear_fake)
