"""NVFP4 weights kept in 4 bits on Hopper: load a checkpoint (or quantize a model) into `NVFP4Linear` layers, whose
plain-PyTorch forward our backend rewrites into `fa4::nvfp4_linear` when the model is compiled.

    from fa4_inductor import nvfp4
    model = AutoModelForCausalLM.from_config(config)     # the architecture; its weights come from the checkpoint
    nvfp4.load_checkpoint(model, "path/to/checkpoint")    # compressed-tensors or ModelOpt NVFP4 safetensors
    model = model.to("cuda", torch.bfloat16)               # casts the rest; the NVFP4 buffers keep their dtypes
    model = torch.compile(model, backend=fa4_inductor.backend(nvfp4_linear=True))

    nvfp4.quantize(model)                                  # or: every nn.Linear of a float model, in place
    nvfp4.from_torchao(model)                              # or: torchao NVFP4 weight-only linears as NVFP4Linear

Why: on sm90, transformers' compressed-tensors integration decompresses an NVFP4 checkpoint to bf16 when it loads
it (no Hopper kernel takes FP4), so the compiled graph holds plain bf16 linears and the 4-bit weights are gone.

Checkpoint formats (read from their public sources; both pack input 2i in the low nibble of byte i):
- compressed-tensors (`nvfp4-pack-quantized`, llm-compressor): `<linear>.weight_packed` uint8 [N, K / 2],
  `<linear>.weight_scale` float8_e4m3fn [N, K / 16], `<linear>.weight_global_scale` float32 [1], an *encoding*
  scale (448 * 6 / amax(w)): w = e2m1 * (float(weight_scale) / weight_global_scale).
- ModelOpt (TensorRT Model Optimizer): `<linear>.weight` uint8 [N, K / 2], `<linear>.weight_scale` float8_e4m3fn
  [N, K / 16], `<linear>.weight_scale_2` float32, a *decoding* scale (amax(w) / (6 * 448)):
  w = e2m1 * float(weight_scale) * weight_scale_2.
Activation scales (compressed-tensors' `input_global_scale`, ModelOpt's `input_scale`) of W4A4 checkpoints are
dropped: Hopper has no FP4 matmul, so the layers run weight-only (W4A16), as vLLM's FP4 Marlin path runs them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .kernels.nvfp4_linear import BLOCK, unblocked

E2M1_MAX, E4M3_MAX = 6.0, 448.0
E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # midpoints between the e2m1 magnitudes 0, 0.5, ..., 4, 6


def e2m1_values(codes: Tensor) -> Tensor:
    """The float32 values of 4-bit e2m1 codes (an integer tensor, 0..15), exactly, in pointwise ops:
    bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa."""
    magnitude = codes & 7
    exponent, mantissa = magnitude >> 1, magnitude & 1
    quarters = torch.where(exponent == 0, 2 * mantissa, (2 + mantissa) << exponent)  # the value times 4
    value = quarters.float() * 0.25
    return torch.where(codes >= 8, -value, value)


def unpack(packed: Tensor) -> Tensor:
    """uint8 [N, K / 2] -> codes uint8 [N, K]: input 2i from byte i's low nibble, 2i + 1 from its high one."""
    n, half = packed.shape
    return torch.stack((packed & 15, packed >> 4), dim=-1).view(n, 2 * half)


def pack(codes: Tensor) -> Tensor:
    """codes [N, K] (0..15) -> uint8 [N, K / 2], the inverse of `unpack`."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


class NVFP4Linear(nn.Module):
    """`F.linear` over an NVFP4 weight, in plain PyTorch. The forward decodes the codes and dequantizes in float32,
    the arithmetic of `fa4::nvfp4_linear` (kernels/nvfp4_linear.py), so eager, CPU and the compiled op agree:

        w = (e2m1(weight_packed) * (weight_decode_scale * float(weight_scale))[n, k // 16]).to(x.dtype)

    Buffers as compressed-tensors stores them: `weight_packed` uint8 [N, K / 2], `weight_scale` float8_e4m3fn
    [N, K / 16], `weight_global_scale` float32 0-d (its encoding scale: w = q * scale / global). The forward reads
    `weight_decode_scale` (not saved), the decoding multiplier: 1 / weight_global_scale, set again by
    `load_state_dict`; a ModelOpt checkpoint's `weight_scale_2` exactly, when loaded from one. Its rounding order
    (the reciprocal, then the product of the two scales) can differ from compressed-tensors' own `scale / global`
    by up to two float32 ulps of the weight before it is rounded to x's dtype; rounded to bfloat16, under 1% of
    the weights differ, by one bfloat16 ulp (tests/test_nvfp4_load.py checks both).
    """

    NVFP4_BUFFERS = ("weight_packed", "weight_scale", "weight_global_scale", "weight_decode_scale")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if in_features % BLOCK:
            raise ValueError(f"NVFP4Linear: {in_features} input features are not a multiple of {BLOCK}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_packed", torch.zeros(out_features, in_features // 2, dtype=torch.uint8,
                                                          device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, in_features // BLOCK, device=device)
                             .to(torch.float8_e4m3fn))
        self.register_buffer("weight_global_scale", torch.ones((), device=device))
        self.register_buffer("weight_decode_scale", torch.ones((), device=device), persistent=False)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False) \
            if bias else None
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh_decode_scale())

    def _apply(self, fn, recurse=True):
        """`.to(dtype)`, `.half()` and the like cast the bias only: the NVFP4 buffers keep their dtypes (their
        values exactly) and follow device moves."""
        kept = {name: self._buffers[name] for name in self.NVFP4_BUFFERS}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            if self._buffers[name].dtype != before.dtype:
                self._buffers[name] = before.to(self._buffers[name].device)
        return self

    def refresh_decode_scale(self) -> None:
        with torch.no_grad():
            self.weight_decode_scale.copy_(torch.reciprocal(self.weight_global_scale))

    def forward(self, x: Tensor) -> Tensor:
        n, k = self.out_features, self.in_features
        scale = self.weight_decode_scale * self.weight_scale.float()
        decoded = e2m1_values(unpack(self.weight_packed))
        w = (decoded.view(n, k // BLOCK, BLOCK) * scale.unsqueeze(-1)).view(n, k).to(x.dtype)
        return F.linear(x, w, self.bias)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weight the forward multiplies by, in `dtype`."""
        n, k = self.out_features, self.in_features
        scale = (self.weight_decode_scale * self.weight_scale.float()).repeat_interleave(BLOCK, dim=1)
        return (e2m1_values(unpack(self.weight_packed)) * scale).view(n, k).to(dtype)

    @classmethod
    def from_tensors(cls, packed: Tensor, block_scale: Tensor, *, global_scale: Tensor | None = None,
                     decode_scale: Tensor | None = None, bias: Tensor | None = None) -> "NVFP4Linear":
        """A layer over given NVFP4 tensors; the per-tensor scale as compressed-tensors' encoding `global_scale`
        or as ModelOpt's decoding `decode_scale` (exactly one)."""
        if (global_scale is None) == (decode_scale is None):
            raise ValueError("NVFP4Linear.from_tensors wants exactly one of global_scale and decode_scale")
        n, half = packed.shape
        if packed.dtype != torch.uint8 or block_scale.dtype != torch.float8_e4m3fn or \
                tuple(block_scale.shape) != (n, 2 * half // BLOCK):
            raise ValueError(f"NVFP4Linear wants uint8 [N, K / 2] codes and float8_e4m3fn [N, K / 16] scales, got "
                             f"{packed.dtype} {list(packed.shape)} and {block_scale.dtype} {list(block_scale.shape)}")
        layer = cls(2 * half, n, bias=bias is not None, device=packed.device,
                    dtype=bias.dtype if bias is not None else None)
        with torch.no_grad():
            layer.weight_packed.copy_(packed)
            layer.weight_scale.copy_(block_scale)
            if global_scale is not None:
                layer.weight_global_scale.copy_(global_scale.float().reshape(()))
                layer.refresh_decode_scale()
            else:
                layer.weight_decode_scale.copy_(decode_scale.float().reshape(()))
                layer.weight_global_scale.copy_(torch.reciprocal(layer.weight_decode_scale))
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "NVFP4Linear":
        """`linear` quantized to NVFP4 (`quantize_weight`); the bias stays in its dtype."""
        packed, block_scale, global_scale = quantize_weight(linear.weight.detach())
        bias = linear.bias.detach() if linear.bias is not None else None
        return cls.from_tensors(packed, block_scale, global_scale=global_scale, bias=bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """weight [N, K] -> (packed uint8 [N, K / 2], block scales e4m3 [N, K / 16], encoding global scale float32 0-d),
    as compressed-tensors computes them: global = 448 * 6 / amax(w); block scale = global * amax(block) / 6 in e4m3
    (0 becomes 0.125); codes = w / (block / global) rounded to the nearest e2m1 value (ties toward zero), saturated."""
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"NVFP4: {k} input features are not a multiple of {BLOCK}")
    w = weight.float().view(n, k // BLOCK, BLOCK)
    amax = w.abs().amax()
    global_scale = E4M3_MAX * E2M1_MAX / torch.where(amax > 0, amax, torch.ones_like(amax))
    block = (global_scale * (w.abs().amax(dim=-1) / E2M1_MAX)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    block = torch.where(block.float() == 0, torch.full_like(block.float(), 0.125), block.float()).to(torch.float8_e4m3fn)
    scaled = (w / (block.float() / global_scale).unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX).view(n, k)
    magnitude = torch.bucketize(scaled.abs(), torch.tensor(E2M1_BOUNDS, device=weight.device))
    codes = magnitude | ((scaled < 0).to(magnitude.dtype) << 3)
    return pack(codes), block, global_scale


def quantize(model: nn.Module, filter_fn: Callable[[nn.Linear, str], bool] | None = None) -> list[str]:
    """Replace each `nn.Linear` of `model` (those `filter_fn(module, name)` accepts; input features a multiple of
    16) with its `NVFP4Linear.from_linear`, in place. Returns the names replaced."""
    replaced = []
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and module.in_features % BLOCK == 0 and (filter_fn is None or
                                                                               filter_fn(module, name)):
            replace_module(model, name, NVFP4Linear.from_linear(module))
            replaced.append(name)
    return replaced


def is_torchao_nvfp4(t) -> bool:
    """Whether t is torchao's NVFP4 tensor subclass (told by its type, without importing torchao)."""
    return type(t).__name__ == "NVFP4Tensor" and type(t).__module__.startswith("torchao")


def from_torchao(model: nn.Module) -> list[str]:
    """Replace each `nn.Linear` whose weight is torchao's NVFP4 weight-only tensor (`NVFP4WeightOnlyConfig`: codes,
    e4m3 block scales, swizzled or not, an optional float32 per-tensor scale) with an `NVFP4Linear` over the same
    codes and scales as plain buffers, in place: the same weight bit for bit (torchao's `per_tensor_scale *
    float(scale)` is the layer's decoding product), and no tensor subclass for torch.compile to guard on and
    unwrap around every call (on the CPU that host time is ~3x that of the same codes as plain tensors; decode
    steps are host-bound there). A weight with activation quantization, another block size, or transposed codes is
    left as it is. Returns the names replaced."""
    replaced = []
    for name, module in list(model.named_modules()):
        w = getattr(module, "weight", None)
        if type(module) is not nn.Linear or not is_torchao_nvfp4(w) or w.block_size != BLOCK or \
                w.act_quant_kwargs is not None or w.qdata.dim() != 2 or w.qdata.stride(-1) != 1:
            continue
        n, k = module.out_features, module.in_features
        scale = unblocked(w.scale, n, k // BLOCK) if w.is_swizzled_scales else w.scale
        decode = w.per_tensor_scale if w.per_tensor_scale is not None else torch.ones((), device=w.qdata.device)
        bias = module.bias.detach() if module.bias is not None else None
        replace_module(model, name, NVFP4Linear.from_tensors(w.qdata.view(torch.uint8), scale.contiguous(), decode_scale=decode,
                                                       bias=bias))
        replaced.append(name)
    return replaced


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """model.<name> = new."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


@dataclass
class Loaded:
    """What `load_checkpoint` did: the linears it made NVFP4Linear, by format, and the keys nothing took."""

    compressed_tensors: list[str] = field(default_factory=list)
    modelopt: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def read_safetensors(checkpoint: str | Path) -> dict[str, Tensor]:
    """Every tensor of a .safetensors file, or of the files a folder's `model.safetensors.index.json` lists (all
    its .safetensors files when there is no index)."""
    from safetensors.torch import load_file

    path = Path(checkpoint)
    if path.is_file():
        return load_file(path)
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else \
        sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path}")
    tensors = {}
    for name in files:
        tensors.update(load_file(path / name))
    return tensors


def load_checkpoint(model: nn.Module, checkpoint: str | Path | Mapping[str, Tensor], *, strict: bool = True) -> Loaded:
    """Load an NVFP4 checkpoint (compressed-tensors or ModelOpt, module docstring) into `model`, in place: each
    `nn.Linear` the checkpoint quantizes becomes an `NVFP4Linear` holding its 4-bit tensors on the linear's
    device (its bias in the linear's dtype); every other tensor is loaded as `load_state_dict` would. `strict`
    raises when a key of the checkpoint or of the model is left over (weights the model ties count as loaded)."""
    tensors = dict(read_safetensors(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint)
    loaded = Loaded()
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        prefix = f"{name}." if name else ""
        device, dtype = module.weight.device, module.weight.dtype
        bias = tensors.pop(prefix + "bias").to(device, dtype) if module.bias is not None and \
            prefix + "bias" in tensors else None
        if prefix + "weight_packed" in tensors:
            layer = NVFP4Linear.from_tensors(tensors.pop(prefix + "weight_packed").to(device),
                                             tensors.pop(prefix + "weight_scale").to(device),
                                             global_scale=tensors.pop(prefix + "weight_global_scale").to(device),
                                             bias=bias)
            for unused in ("weight_zero_point", "input_global_scale"):  # a zero point; W4A4's activation scale
                tensors.pop(prefix + unused, None)
            loaded.compressed_tensors.append(name)
        elif prefix + "weight_scale_2" in tensors:
            layer = NVFP4Linear.from_tensors(tensors.pop(prefix + "weight").to(device),
                                             tensors.pop(prefix + "weight_scale").to(device),
                                             decode_scale=tensors.pop(prefix + "weight_scale_2").to(device),
                                             bias=bias)
            tensors.pop(prefix + "input_scale", None)
            loaded.modelopt.append(name)
        else:
            if bias is not None:
                tensors[prefix + "bias"] = bias
            continue
        if layer.out_features != module.out_features or layer.in_features != module.in_features:
            raise ValueError(f"{name}: the checkpoint's NVFP4 weight is [{layer.out_features}, {layer.in_features}], "
                             f"the model's linear [{module.out_features}, {module.in_features}]")
        if module.bias is not None and bias is None:
            raise ValueError(f"{name}: the model's linear has a bias, the checkpoint none")
        replace_module(model, name, layer)
    result = model.load_state_dict(tensors, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    loaded.unexpected = list(result.unexpected_keys)
    loaded.missing = _untied(model, [k for k in result.missing_keys if not _is_nvfp4_key(model, k)], tensors)
    if strict and (loaded.missing or loaded.unexpected):
        raise RuntimeError(f"load_checkpoint: missing {loaded.missing}, unexpected {loaded.unexpected}")
    return loaded


def _is_nvfp4_key(model: nn.Module, key: str) -> bool:
    owner, _, _ = key.rpartition(".")
    return isinstance(model.get_submodule(owner) if owner else model, NVFP4Linear)


def _untied(model: nn.Module, missing: list[str], loaded: Mapping[str, Tensor]) -> list[str]:
    """The missing keys whose parameter no loaded key shares (after tying)."""
    names_of = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), set()).add(name)
    params = dict(model.named_parameters(remove_duplicate=False))
    return [k for k in missing if k not in params or not (names_of[id(params[k])] & loaded.keys())]
