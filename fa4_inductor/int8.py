"""Int8 weight-only linears as plain buffers: torchao's `Int8WeightOnlyConfig` weights (an `Int8Tensor` subclass per
linear) turned into `Int8Linear` layers over the same codes, whose plain-PyTorch forward our backend rewrites into
`fa4::int8_linear` when the model is compiled.

    from fa4_inductor import int8
    quantize_(model, Int8WeightOnlyConfig())     # torchao
    int8.from_torchao(model)                     # the same weights, bit for bit the same outputs
    model = torch.compile(model, backend=fa4_inductor)

Why: torch.compile guards on every tensor subclass and AOTAutograd unwraps each one around every call of the compiled
graph, host time that a decode step (one CUDA-graph replay under `reduce-overhead`) pays 7 times per decoder layer;
torchao's float32 scale is also cast to the activations' dtype on every call, one more kernel per linear.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .nvfp4 import replace_module


class Int8Linear(nn.Module):
    """`F.linear(x, weight.to(x.dtype)) * scale [+ bias]`: gpt-fast's int8 weight-only linear with a bias, an int8
    `weight` [N, K] and a per-output-channel `scale` [N] buffer in the model's dtype (cast with it by `.to(dtype)`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scale", torch.ones(out_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False) \
            if bias else None

    def forward(self, x: Tensor) -> Tensor:
        out = F.linear(x, self.weight.to(x.dtype)) * self.scale
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def is_torchao_int8_weight_only(t) -> bool:
    """Whether t is torchao's int8 tensor subclass (told by its type, without importing torchao) holding a weight-only,
    per-output-channel weight (what `from_torchao` takes)."""
    return (type(t).__name__ == "Int8Tensor" and type(t).__module__.startswith("torchao")
            and getattr(t, "act_quant_kwargs", None) is None and getattr(t, "act_pre_scale", None) is None
            and t.qdata.dim() == 2 and list(t.block_size) == [1, t.qdata.shape[1]]
            and tuple(t.scale.shape) in ((t.qdata.shape[0], 1), (t.qdata.shape[0],)))


def from_torchao(model: nn.Module) -> list[str]:
    """Replace each `nn.Linear` whose weight is torchao's int8 weight-only, per-output-channel tensor
    (`Int8WeightOnlyConfig()`) with an `Int8Linear` over the same codes, in place. torchao computes
    `mm(x, qdata.T.to(x.dtype)) * scale.to(x.dtype) + bias`; the layer keeps `scale.to(dtype)` once, dtype the
    weight's original dtype (torchao's `Int8Tensor.dtype`), so for activations of that dtype its outputs are the
    same bit for bit. Weights with activation quantization (`Int8DynamicActivationInt8WeightConfig`), a pre-scale,
    or per-group scales are left as they are. Returns the names replaced."""
    replaced = []
    for name, module in list(model.named_modules()):
        w = getattr(module, "weight", None)
        if type(module) is not nn.Linear or not is_torchao_int8_weight_only(w):
            continue
        layer = Int8Linear(module.in_features, module.out_features, bias=module.bias is not None,
                           device=w.qdata.device, dtype=w.dtype)
        with torch.no_grad():
            layer.weight.copy_(w.qdata)
            layer.scale.copy_(w.scale.to(w.dtype).flatten())
            if module.bias is not None:
                layer.bias.copy_(module.bias)
        replace_module(model, name, layer)
        replaced.append(name)
    return replaced
