"""A tiny HF Llama whose linears hold quantized weights as plain buffers (the layers `int8.from_torchao`,
`nvfp4.from_torchao` and `fp8.from_torchao` leave), called the ways `explain` calls a causal LM (prefill and decode
over a StaticCache, a left-padded prefill, a forward without a cache) and compiled by the backend with Inductor:
every attention layer and every quantized linear of every graph rewritten, nothing kept, outputs as eager's (the
ops' CPU references; the GPU tier runs the same formats through `generate`, tests/test_gpu_models.py)."""

import pytest
import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import publishing
from fa4_inductor.fp8 import E4M3, E4M3_MAX, Fp8Linear
from fa4_inductor.int8 import Int8Linear
from fa4_inductor.nvfp4 import NVFP4Linear, replace_module
from helpers import tiny

pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # conftest.py: a cache hit skips the passes


def int8_linear(linear: nn.Linear) -> Int8Linear:
    w = linear.weight.detach()
    scale = w.abs().amax(1) / 127
    layer = Int8Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_((w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        layer.scale.copy_(scale)
    return layer


def fp8_linear(activation):
    def make(linear: nn.Linear) -> Fp8Linear:
        w = linear.weight.detach()
        scale = w.abs().amax(1, keepdim=True) / E4M3_MAX
        layer = Fp8Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          activation=activation, dtype=w.dtype)
        with torch.no_grad():
            layer.weight.copy_((w / scale).to(E4M3))
            layer.weight_scale.copy_(scale)
        return layer
    return make


FORMATS = {  # the layer each nn.Linear but lm_head becomes, and the record family of its rewrite
    "int8": (int8_linear, "int8_linear"),
    "nvfp4": (NVFP4Linear.from_linear, "nvfp4_linear"),
    "fp8 per row": (fp8_linear("row"), "fp8_linear"),
    "fp8 weight-only": (fp8_linear(None), "fp8_linear"),
}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_call_of_a_quantized_model_is_rewritten(fmt):
    make, family = FORMATS[fmt]
    model = tiny("llama", "sdpa")
    quantized = [name for name, module in model.model.named_modules()
                 if type(module) is nn.Linear and "lm_head" not in name]
    for name in quantized:
        replace_module(model.model, name, make(model.model.get_submodule(name)))
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, backend=fa4_inductor.fa4_inductor)
    torch.manual_seed(0)
    phases = model.phases()
    torch.manual_seed(0)
    eager_phases = model.phases()  # the same inputs over a cache of its own
    with torch.no_grad(), publishing.collecting() as records:
        for (phase, kwargs), (_, eager_kwargs) in zip(phases, eager_phases):
            expected = model.forward(**eager_kwargs)
            # the left-padded prefill's pad rows are zero before o_proj: fp8's per-row activation scale is then 0, and
            # torchao's arithmetic (x / scale) makes them NaN in eager code too
            torch.testing.assert_close(compiled(**kwargs), expected, atol=1e-5, rtol=1e-5, equal_nan=True,
                                       msg=lambda m: f"{fmt}, {phase}: {m}")
            assert not expected.isnan().any() or (fmt, phase) == ("fp8 per row", "prefill, left-padded")
    assert not [str(r) for r in records if not r.rewritten]
    graphs = len(phases)  # each phase its own graph (shapes, the cache, the mask)
    assert sum(r.family == "sdpa" for r in records) == graphs * model.attention_layers, [str(r) for r in records]
    linears = [r.module for r in records if r.family == family]
    assert sorted(set(linears)) == sorted(f"model.{name}" for name in quantized) and len(linears) == graphs * len(
        quantized), [str(r) for r in records]
