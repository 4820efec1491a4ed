"""FP8 (e4m3) linears as plain buffers: torchao's `Float8DynamicActivationFloat8WeightConfig` and
`Float8WeightOnlyConfig` weights (a `Float8Tensor` subclass per linear) turned into `Fp8Linear` layers over the same
codes and scales, whose plain-PyTorch forward our backend rewrites into `fa4::fp8_linear` where that is measured
faster.

    from fa4_inductor import fp8
    quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))     # torchao
    fp8.from_torchao(model)                      # the same weights, bit for bit the same outputs (torch's kernels)
    model = torch.compile(model, backend=fa4_inductor)

Why: Dynamo guards every tensor subclass among a graph's inputs in Python around every call (our backend spares them
AOTAutograd's unwrap: lowering/subclass_weights.py), host time that a host-bound step pays. A Llama-1B-shaped fp8
decode step under `reduce-overhead` (GPU-bound) took 1.46 ms/token as plain buffers and 1.44 with torchao's subclass
weights under our backend, 2.58 under default compile (one H100, docs/benchmarks.md session 53).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from .nvfp4 import replace_module

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
ACTIVATIONS = (None, "row", "tensor")  # weight-only; x quantized per row; x quantized per tensor


class Fp8Linear(nn.Module):
    """A linear over an e4m3 `weight` [N, K] with a float32 `weight_scale` [N, 1] (per output channel) or [1, 1] (per
    tensor), in torchao's arithmetic (torchao 0.18, its PyTorch kernels):

    - `activation` None (weight-only): `x @ (weight.float() * weight_scale).to(x.dtype)^T`, then `+ bias`.
    - "row" / "tensor": x's scale amax(|x|) / 448 (over each row / the whole x) in x's dtype, then float32; x / scale
      clamped to +-448 and cast to e4m3; `torch._scaled_mm` of the two with both scales and the bias, out in x's
      dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, activation: Optional[str] = "row",
                 per_channel: bool = True, use_fast_accum: bool = True, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation is one of {ACTIVATIONS}, not {activation!r}")
        self.in_features, self.out_features = in_features, out_features
        self.activation, self.use_fast_accum = activation, use_fast_accum
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=E4M3, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features if per_channel else 1, 1, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False) \
            if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if self.activation is None:
            out = torch.matmul(x, (self.weight.t().float() * self.weight_scale.t()).to(x.dtype))
            return out + self.bias if self.bias is not None else out
        dims = -1 if self.activation == "row" else tuple(range(x.dim()))
        x_scale = (x.abs().amax(dim=dims, keepdim=True) / E4M3_MAX).to(torch.float32)
        x_fp8 = (x.to(torch.float32) / x_scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        out = torch._scaled_mm(x_fp8.reshape(-1, self.in_features), self.weight.t(), x_scale.reshape(-1, 1),
                               self.weight_scale.t(), self.bias, out_dtype=x.dtype, use_fast_accum=self.use_fast_accum)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activation={self.activation}, per_channel={self.weight_scale.shape[0] != 1}")


def _granularity(kwargs) -> Optional[str]:
    """"row" / "tensor" for torchao's activation quantization kwargs of those granularities, else None."""
    name = type(getattr(kwargs, "granularity", None)).__name__
    if name == "PerRow" and getattr(kwargs.granularity, "dim", -1) == -1:
        return "row"
    return "tensor" if name == "PerTensor" else None


def torchao_fp8_layout(t) -> Optional[tuple[Optional[str], bool, bool]]:
    """(activation, per_channel, use_fast_accum) of a torchao `Float8Tensor` weight that `Fp8Linear` reproduces (told
    by its type, without importing torchao), or None: e4m3 codes [N, K] with one float32 scale a row or one for the
    tensor; no activation quantization, or e4m3 per row / per tensor without bounds on the scale."""
    if not (type(t).__name__ == "Float8Tensor" and type(t).__module__.startswith("torchao")):
        return None
    q, scale = getattr(t, "qdata", None), getattr(t, "scale", None)
    if q is None or q.dtype != E4M3 or q.dim() != 2 or scale is None or scale.dtype != torch.float32:
        return None
    per_channel = tuple(scale.shape) == (q.shape[0], 1)
    if not (per_channel or tuple(scale.shape) == (1, 1)):
        return None
    kwargs = getattr(t, "act_quant_kwargs", None)
    if kwargs is None:
        return None, per_channel, False
    activation = _granularity(kwargs)
    if (activation is None or getattr(kwargs, "float8_dtype", None) != E4M3
            or getattr(kwargs, "hp_value_lb", None) is not None or getattr(kwargs, "hp_value_ub", None) is not None):
        return None
    mm_config = getattr(t, "mm_config", None)
    return activation, per_channel, bool(getattr(mm_config, "use_fast_accum", False))


def is_torchao_fp8(t) -> bool:
    """Whether t is a torchao fp8 weight `from_torchao` takes."""
    return torchao_fp8_layout(t) is not None


def from_torchao(model: nn.Module) -> list[str]:
    """Replace each `nn.Linear` whose weight is a torchao `Float8Tensor` that `torchao_fp8_layout` takes with an
    `Fp8Linear` over the same codes and scales, in place. For activations of the weight's original dtype its outputs
    are torchao's bit for bit where torchao runs PyTorch's kernels (on GPUs with mslk installed torchao runs mslk's
    instead: the same arithmetic, its own roundings). Returns the names replaced."""
    replaced = []
    for name, module in list(model.named_modules()):
        w = getattr(module, "weight", None)
        layout = torchao_fp8_layout(w) if type(module) is nn.Linear else None
        if layout is None:
            continue
        activation, per_channel, fast = layout
        layer = Fp8Linear(module.in_features, module.out_features, bias=module.bias is not None,
                          activation=activation, per_channel=per_channel, use_fast_accum=fast,
                          device=w.qdata.device, dtype=w.dtype)
        with torch.no_grad():
            layer.weight.copy_(w.qdata)
            layer.weight_scale.copy_(w.scale)
            if module.bias is not None:
                layer.bias.copy_(module.bias)
        replace_module(model, name, layer)
        replaced.append(name)
    return replaced
