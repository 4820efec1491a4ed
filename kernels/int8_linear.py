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

Kernels: CPU and CUDA both run this reference (on CUDA: the dequantized weight is materialized on the
device, then cuBLAS multiplies). Fast kernels, which read the int8 weight directly, come later, with GPU
measurements. The op has no autograd formula: lowering emits it in Inductor's compiled graphs, after
AOTAutograd has written any backward out. `unsupported_reason` is the check lowering asks before emitting
it (exported as `kernels.int8_linear_unsupported_reason`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import library

X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCALE_DTYPES = X_DTYPES
DEVICES = ("cpu", "cuda")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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


library.define("int8_linear(Tensor x, Tensor w_int8, Tensor w_scale, Tensor? bias=None, *, int group_size=-1, "
               "bool scale_after_matmul=False) -> Tensor")
library.impl("int8_linear", int8_linear, "CompositeExplicitAutograd")
# For now the same dequantize-then-matmul on the device; int8 kernels come later, measured on the GPU.
library.impl("int8_linear", int8_linear, "CUDA")
library.register_fake("int8_linear", _int8_linear_fake)
