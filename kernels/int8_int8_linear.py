"""`fa4::int8_int8_linear`: a linear layer over an int8 activation quantized per token and an int8 weight
quantized per output channel (torchao's `Int8DynamicActivationInt8WeightConfig`).

    out = torch.ops.fa4.int8_int8_linear(x_int8, x_scale, w_int8, w_scale, bias=None, *, out_dtype)

x_int8 [M, K] int8 (the activation, already quantized: the quantizing chain stays in the graph, for Inductor
to fuse); x_scale [M, 1] or [M], a float tensor (float32 from torchao); w_int8 [N, K] int8; w_scale [N], a
float tensor; bias None or [N], a float tensor; out_dtype float16, bfloat16 or float32. out [M, N] in
out_dtype, contiguous. The arithmetic is the one torchao's tensor subclass writes out (lowering/
int8_int8_linear.py shows the graph), in its order and with torch's type promotion at each step:

    acc = x_int8 @ w_int8^T                          int32, exact (torch._int_mm)
    y = (acc.to(float32) * x_scale).to(out_dtype)    x_scale per row
    y = y * w_scale [+ bias]                         float32 when the scale is float32 (torchao's)
    out = y.to(out_dtype)

Kernels: the CPU runs exactly that (equal to eager bit for bit). CUDA runs the same with `torch._int_mm`
(cuBLAS int8) from `INT_MM_MIN_ROWS` rows; cuBLAS also wants K and N multiples of 8: `unsupported_reason` says so,
and lowering then keeps the graph as written. The scaling after the GEMM runs as separate elementwise kernels,
where Inductor would fuse them. `_int_mm` refuses 16 rows or fewer (every decode step: default torch.compile fails
there). Such calls with a bfloat16 or float16 output go to `fa4::int8_linear`'s mixed-input kernels (our W4A16
decode GEMM, quack's; `weight_only_route`; where M is static, lowering writes that in the graph instead, so that
Inductor fuses the cast and the scaling with their neighbours): the int8 activation is exact in that dtype and the products sum in
float32, so only the order of the two roundings differs from the reference (out = bf16(bf16(acc * w_scale) *
x_scale [+ bias]), the last step one kernel; within a bf16 rounding of it). The others are padded with zero rows
to `PADDED_ROWS` for `_int_mm` and the padding is sliced off (the rows are independent, so the result is
unchanged).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import int8_linear, layout, library

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DEVICES = ("cpu", "cuda")
INT_MM_MIN_ROWS = 17  # torch._int_mm on CUDA: "self.size(0) needs to be greater than 16"
PADDED_ROWS = 32  # what fewer rows are padded to on CUDA (a multiple of 16 above the limit)
WEIGHT_ONLY_DTYPES = (torch.float16, torch.bfloat16)  # outputs whose dtype holds an int8 activation exactly


_name = layout.dtype_name


def unsupported_reason(device_type: str, out_dtype: torch.dtype, n: int, k: int) -> str | None:
    """Why `fa4::int8_int8_linear` cannot produce `out_dtype` from a [n, k] weight on this device, or None."""
    if device_type not in DEVICES:
        return f"device {device_type} has no fa4 int8_int8_linear kernel"
    if out_dtype not in OUT_DTYPES:
        return f"out_dtype {_name(out_dtype)} is not supported (takes {', '.join(map(_name, OUT_DTYPES))})"
    if device_type == "cuda" and (k % 8 or n % 8):
        return f"cuBLAS's int8 GEMM (torch._int_mm) needs K and N multiples of 8; the weight is [{n}, {k}]"
    return None


def _check_inputs(x_int8: Tensor, x_scale: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor],
                  out_dtype: torch.dtype) -> None:
    for name, t in (("x_int8", x_int8), ("w_int8", w_int8)):
        if t.dtype != torch.int8 or t.dim() != 2:
            raise ValueError(f"fa4::int8_int8_linear wants a 2-D int8 {name}, got {t.dim()}-D {_name(t.dtype)}")
    m, k = x_int8.shape
    n = w_int8.shape[0]
    reason = unsupported_reason(x_int8.device.type, out_dtype, n, k)
    if reason is not None:
        raise ValueError(f"fa4::int8_int8_linear: {reason}")
    torch._check(w_int8.shape[1] == k, lambda: f"fa4::int8_int8_linear: x has {k} features, the weight {w_int8.shape[1]}")
    for name, t, shapes in (("x_scale", x_scale, ((m, 1), (m,))), ("w_scale", w_scale, ((n,),)),
                            ("bias", bias, ((n,),))):
        if t is None:
            continue
        if not t.is_floating_point():
            raise ValueError(f"fa4::int8_int8_linear wants a floating-point {name}, got {_name(t.dtype)}")
        torch._check(tuple(t.shape) in shapes, lambda: f"fa4::int8_int8_linear: {name} has shape {list(t.shape)}, "
                                                       f"wants {' or '.join(str(list(s)) for s in shapes)}")


def _scale_and_bias(acc: Tensor, x_scale: Tensor, w_scale: Tensor, bias: Optional[Tensor],
                    out_dtype: torch.dtype) -> Tensor:
    y = (acc.to(torch.float32) * x_scale.reshape(-1, 1)).to(out_dtype)
    y = y * w_scale
    if bias is not None:
        y = y + bias
    return y.to(out_dtype).contiguous()


def int8_int8_linear(x_int8: Tensor, x_scale: Tensor, w_int8: Tensor, w_scale: Tensor,
                     bias: Optional[Tensor] = None, *, out_dtype: torch.dtype) -> Tensor:
    """The reference, on any device but CUDA (see the module docstring)."""
    _check_inputs(x_int8, x_scale, w_int8, w_scale, bias, out_dtype)
    return _scale_and_bias(torch._int_mm(x_int8, w_int8.t()), x_scale, w_scale, bias, out_dtype)


def casts_to_weight_only(m, out_dtype: torch.dtype) -> bool:
    """Whether a CUDA call of m rows with this output dtype is one for `weight_only_route`: too few rows for
    `_int_mm`, and an output dtype that holds the int8 activation exactly."""
    return m < INT_MM_MIN_ROWS and out_dtype in WEIGHT_ONLY_DTYPES


def weight_only_route(x: Tensor, w_int8: Tensor, w_scale: Tensor) -> Optional[int8_linear.Route]:
    """The mixed-input kernel of `fa4::int8_linear` that would take x [M, K] (the int8 activation in the output's
    dtype) over w_int8 with its per-channel scale, or None where only its dequantizing route would."""
    route, _ = int8_linear.choose(int8_linear.CUDA_ROUTES, x, w_int8, w_scale)
    return None if route is int8_linear.DENSE else route


def int8_int8_linear_cuda(x_int8: Tensor, x_scale: Tensor, w_int8: Tensor, w_scale: Tensor,
                          bias: Optional[Tensor] = None, *, out_dtype: torch.dtype) -> Tensor:
    """Fewer than `INT_MM_MIN_ROWS` rows on `weight_only_route`'s kernel, else the reference with them padded for
    cuBLAS."""
    _check_inputs(x_int8, x_scale, w_int8, w_scale, bias, out_dtype)
    m = x_int8.shape[0]
    if casts_to_weight_only(m, out_dtype):
        x = x_int8.to(out_dtype)
        route = weight_only_route(x, w_int8, w_scale)
        if route is not None:  # x's scale (and the bias) in float32, rounded once into the output: one kernel
            y, x_scale = route.run(x, w_int8, w_scale), x_scale.reshape(-1, 1)
            out = torch.empty(y.shape, dtype=out_dtype, device=y.device)
            return torch.mul(y, x_scale, out=out) if bias is None else torch.addcmul(bias, y, x_scale, out=out)
    if m < INT_MM_MIN_ROWS:
        acc = torch._int_mm(F.pad(x_int8, (0, 0, 0, PADDED_ROWS - m)), w_int8.t())[:m]
    else:
        acc = torch._int_mm(x_int8.contiguous(), w_int8.t())
    return _scale_and_bias(acc, x_scale, w_scale, bias, out_dtype)


def _int8_int8_linear_fake(x_int8, x_scale, w_int8, w_scale, bias=None, *, out_dtype):
    _check_inputs(x_int8, x_scale, w_int8, w_scale, bias, out_dtype)
    return x_int8.new_empty((x_int8.shape[0], w_int8.shape[0]), dtype=out_dtype)


library.define("int8_int8_linear(Tensor x_int8, Tensor x_scale, Tensor w_int8, Tensor w_scale, Tensor? bias=None, "
               "*, ScalarType out_dtype) -> Tensor")
library.impl("int8_int8_linear", int8_int8_linear, "CompositeExplicitAutograd")
library.impl("int8_int8_linear", int8_int8_linear_cuda, "CUDA")
library.register_fake("int8_int8_linear", _int8_int8_linear_fake)
