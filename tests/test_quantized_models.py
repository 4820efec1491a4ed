"""A tiny HF Llama whose linears hold quantized weights as plain buffers (the layers `int8.from_torchao`,
`nvfp4.from_torchao` and `fp8.from_torchao` leave) or as torchao's tensor subclasses (which reach Inductor as their
inner tensors, lowering/subclass_weights.py), called the ways `explain` calls a causal LM (prefill and decode
over a StaticCache, a left-padded prefill, a forward without a cache) and compiled by the backend with Inductor:
every attention layer and every quantized linear of every graph rewritten, nothing kept, outputs as eager's (the
ops' CPU references; the GPU tier runs the same formats through `generate`, tests/test_gpu_models.py); and a
training step over frozen quantized weights against float64."""

import pytest
import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import publishing
from fa4_inductor.fp8 import E4M3, E4M3_MAX, Fp8Linear
from fa4_inductor.int8 import Int8Linear
from fa4_inductor.nvfp4 import NVFP4Linear, replace_module
from helpers import assert_as_close_as_eager, loss_and_gradients, tiny

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


def torchao_configs():
    """torchao's configs by format name, for a float32 model (torchao's fp8 per row takes bf16 weights only)."""
    pytest.importorskip("torchao")
    from torchao import quantization
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig

    return {"torchao int8": (quantization.Int8WeightOnlyConfig(set_inductor_config=False), "int8_linear"),
            "torchao nvfp4": (NVFP4WeightOnlyConfig(), "nvfp4_linear"),
            "torchao fp8 weight-only": (quantization.Float8WeightOnlyConfig(set_inductor_config=False), "fp8_linear")}


def quantized_tiny_llama(fmt: str):
    """The tiny Llama with every linear but lm_head in `fmt`, the names of those linears and their record family."""
    model = tiny("llama", "sdpa")
    quantized = [name for name, module in model.model.named_modules()
                 if type(module) is nn.Linear and "lm_head" not in name]
    if fmt in FORMATS:
        make, family = FORMATS[fmt]
        for name in quantized:
            replace_module(model.model, name, make(model.model.get_submodule(name)))
        return model, quantized, family
    from torchao.quantization import quantize_

    config, family = torchao_configs()[fmt]
    model.model.requires_grad_(False)
    quantize_(model.model, config, filter_fn=lambda module, fqn: fqn in quantized)
    return model, quantized, family


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [*FORMATS, "torchao int8", "torchao nvfp4", "torchao fp8 weight-only"])
def test_every_call_of_a_quantized_model_is_rewritten(fmt):
    model, quantized, family = quantized_tiny_llama(fmt)
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
            assert not expected.isnan().any() or ("fp8 per row" in fmt and phase == "prefill, left-padded")
    assert not [str(r) for r in records if not r.rewritten]
    graphs = len(phases)  # each phase its own graph (shapes, the cache, the mask)
    assert sum(r.family == "sdpa" for r in records) == graphs * model.attention_layers, [str(r) for r in records]
    linears = [r.module for r in records if r.family == family]
    assert sorted(set(linears)) == sorted(f"model.{name}" for name in quantized) and len(linears) == graphs * len(
        quantized), [str(r) for r in records]


def dequantized_tiny_llama(model, quantized: list[str]):
    """The tiny Llama as built (the same seed) with each quantized linear's weight as it computes it (read back
    through the layer from an identity matrix: these formats quantize weights only)."""
    reference = tiny("llama", "sdpa")
    with torch.no_grad():
        for name in quantized:
            layer = model.model.get_submodule(name)
            reference.model.get_submodule(name).weight.copy_(layer(torch.eye(layer.in_features)).T)
    return reference.model


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int8", "torchao int8", "torchao nvfp4"])
def test_a_training_step_over_frozen_quantized_weights(fmt):
    """Fine-tuning around frozen quantized linears (the embedding, norms and lm_head train; `use_cache=False`,
    labels): the compiled step's loss and every gradient as eager's against float64 (`assert_as_close_as_eager`; the
    reference holds the weights the quantized layers compute with), every attention rewritten. The dequantized
    weights are recomputed in the backward (lowering/joint_graph.py; NVFP4's with the option set, its default saves
    them), so no quantized linear is kept for a saved dequantized weight; torchao's weights reach the joint graph as
    their inner tensors."""
    model, quantized, family = quantized_tiny_llama(fmt)
    reference_model = dequantized_tiny_llama(model, quantized).double()
    model.model.requires_grad_(True)
    for name in quantized:
        model.model.get_submodule(name).requires_grad_(False)
        reference_model.get_submodule(name).requires_grad_(False)
    model.model.train()
    reference_model.train()
    inputs = {**model.inputs(seq=12), "use_cache": False}
    inputs["labels"] = inputs["input_ids"]
    eager = loss_and_gradients(model.model, model.model, inputs)
    torch._dynamo.reset()
    with publishing.collecting() as records:
        backend = fa4_inductor.backend(recompute_dequantized_weights=True if "nvfp4" in fmt else None)
        ours = loss_and_gradients(torch.compile(model.model, backend=backend), model.model, inputs)
    reference = loss_and_gradients(reference_model, reference_model, inputs)
    names = ["loss"] + [name for name, _ in model.model.named_parameters()]
    exact = dict(zip(["loss"] + [name for name, _ in reference_model.named_parameters()], reference))
    assert sum(g is not None for g in eager) > 1
    for name, o, e in zip(names, ours, eager):
        assert (o is None) == (e is None) == (exact[name] is None), name
        if e is not None:
            assert_as_close_as_eager(name, o, e, exact[name], slack=1e-5)
    assert sum(r.rewritten and r.family == "sdpa" for r in records) == model.attention_layers, [str(r) for r in records]
    assert all(r.rewritten or r.family == family for r in records), [str(r) for r in records]
    assert not any("saves it for the backward" in r.detail for r in records), [str(r) for r in records]
