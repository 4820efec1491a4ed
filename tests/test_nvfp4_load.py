"""NVFP4 checkpoints through `fa4_inductor.nvfp4` (quantize, write compressed-tensors / ModelOpt safetensors, load
into a tiny HF Llama), compiled with the backend: every quantized linear runs `fa4::nvfp4_linear`."""

import json

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

import fa4_inductor
from fa4_inductor import hf, nvfp4
from helpers import PostGradCompiled, from_torchao_hints
from test_nvfp4_linear import OP_CALL, float64_dequantized

pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")

QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # lm_head stays bf16/fp32


def llama(seed=0):
    return hf.build("llama", "sdpa", seed=seed).model


def checkpoint_tensors(model, modelopt=False) -> dict[str, torch.Tensor]:
    """`model`'s state dict as an NVFP4 checkpoint: each decoder linear quantized (compressed-tensors' names and
    encoding global scale [1], or ModelOpt's names and decoding `weight_scale_2`), everything else as it is."""
    tensors = {}
    for name, t in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module.endswith(QUANTIZED):
            packed, block, global_scale = nvfp4.quantize_weight(t)
            if modelopt:
                tensors.update({f"{module}.weight": packed, f"{module}.weight_scale": block,
                                f"{module}.weight_scale_2": torch.reciprocal(global_scale),
                                f"{module}.input_scale": torch.ones(())})
            else:
                tensors.update({f"{module}.weight_packed": packed, f"{module}.weight_scale": block,
                                f"{module}.weight_global_scale": global_scale.reshape(1)})
        else:
            tensors[name] = t.clone()
    return tensors


def write_sharded(tensors, folder):
    """Two safetensors files and the index transformers writes."""
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, folder / file)
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def exact_reference_model(tensors, seed=1):
    """The float64 model whose quantized linears hold compressed-tensors' exact dequantization
    (e2m1 * scale / global, in float64)."""
    model = llama(seed).double()
    state = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight_packed":
            scale = 1 / tensors[f"{module}.weight_global_scale"].double().reshape(())
            state[f"{module}.weight"] = float64_dequantized(t, tensors[f"{module}.weight_scale"], scale)
        elif leaf not in ("weight_scale", "weight_global_scale"):
            state[name] = t.double()
    model.load_state_dict(state)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tensors = checkpoint_tensors(llama())
    folder = tmp_path_factory.mktemp("nvfp4-llama")
    write_sharded(tensors, folder)
    return folder, tensors


@pytest.mark.slow  # ~40 s on 2 cores: Inductor compiles the whole model
def test_load_compile_and_every_quantized_linear_runs_the_op(checkpoint):
    folder, tensors = checkpoint
    model = llama(seed=1)  # other random weights: everything must come from the checkpoint
    loaded = nvfp4.load_checkpoint(model, folder)
    quantized = [f"model.layers.{i}.{part}.{proj}" for i in range(2)
                 for part, projs in (("self_attn", QUANTIZED[:4]), ("mlp", QUANTIZED[4:])) for proj in projs]
    assert sorted(loaded.compressed_tensors) == sorted(quantized) and loaded.modelopt == []
    assert all(isinstance(model.get_submodule(name), nvfp4.NVFP4Linear) for name in quantized)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # with gradients, the training forward saves the dequantized weights: kept as written
        compiled = PostGradCompiled(lambda ids: model(ids).logits, ids,
                                    backend=fa4_inductor.backend(nvfp4_linear=True))
    nvfp4_records = [r for r in compiled.records if r.family == "nvfp4_linear"]
    assert sorted(r.module for r in nvfp4_records) == sorted(quantized)
    assert all(r.rewritten for r in nvfp4_records)
    # a layer's q / k / v and gate / up each run as one fa4::nvfp4_sibling_linears, o and down alone
    groups = [r.detail for r in compiled.records if r.family == "sibling_linears"]
    assert len(groups) == 4 and compiled.code.count("torch.ops.fa4.nvfp4_sibling_linears.default(") == 4, groups
    assert compiled.code.count(OP_CALL) == len(quantized) - 10
    # Bound: the op's float32 weight is within 2 float32 ulps of the exact one (kernels/nvfp4_linear.py, plus the
    # reciprocal of the global scale: NVFP4Linear), and the rest runs in float32; 1e-4 of the logits' scale holds.
    expected = exact_reference_model(tensors)(ids).logits
    torch.testing.assert_close(compiled.out.double(), expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(compiled.out, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_modelopt_checkpoint_loads_to_the_same_model(checkpoint, tmp_path):
    """ModelOpt's `weight_scale_2` written as the reciprocal of compressed-tensors' global scale: the same
    decoding multiplier, so the same logits bit for bit."""
    folder, _ = checkpoint
    modelopt = checkpoint_tensors(llama(), modelopt=True)
    save_file(modelopt, tmp_path / "model.safetensors")
    ours, theirs = llama(seed=1), llama(seed=2)
    nvfp4.load_checkpoint(ours, folder)
    loaded = nvfp4.load_checkpoint(theirs, tmp_path / "model.safetensors")
    assert len(loaded.modelopt) == 14 and loaded.compressed_tensors == []
    ids = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)


def test_strict_loading_names_what_is_left_over(checkpoint):
    _, tensors = checkpoint
    missing = {k: v for k, v in tensors.items() if k != "model.norm.weight"}
    with pytest.raises(RuntimeError, match=r"missing \['model.norm.weight'\], unexpected \[\]"):
        nvfp4.load_checkpoint(llama(), missing)
    extra = tensors | {"model.extra": torch.zeros(1)}
    with pytest.raises(RuntimeError, match=r"missing \[\], unexpected \['model.extra'\]"):
        nvfp4.load_checkpoint(llama(), extra)
    assert nvfp4.load_checkpoint(llama(), extra, strict=False).unexpected == ["model.extra"]


def test_state_dict_round_trip_refreshes_the_decode_scale():
    layer = nvfp4.NVFP4Linear.from_linear(nn.Linear(64, 32))
    other = nvfp4.NVFP4Linear(64, 32)
    other.load_state_dict(layer.state_dict())
    assert "weight_decode_scale" not in layer.state_dict()
    assert torch.equal(other.weight_decode_scale, layer.weight_decode_scale)
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(other(x), layer(x))


def test_dequantization_against_compressed_tensors_formula():
    """NVFP4Linear takes 1 / global, then its product with the block scale; compressed-tensors divides the block
    scale by the global scale. Their float32 weights differ by at most 2 ulps; rounded to bfloat16, by at most one
    bfloat16 ulp, and rarely."""
    torch.manual_seed(0)
    layer = nvfp4.NVFP4Linear.from_linear(nn.Linear(1024, 256))
    ours = layer.dequantized_weight(torch.float32)
    scale = (layer.weight_scale.float() / layer.weight_global_scale).repeat_interleave(16, dim=1)
    theirs = nvfp4.e2m1_values(nvfp4.unpack(layer.weight_packed)) * scale
    ulp = torch.finfo(torch.float32).eps * theirs.abs()
    assert ((ours - theirs).abs() <= 2 * ulp).all()
    ours_bf16, theirs_bf16 = ours.bfloat16().float(), theirs.bfloat16().float()
    assert ((ours_bf16 - theirs_bf16).abs() <= torch.finfo(torch.bfloat16).eps * theirs_bf16.abs()).all()
    assert (ours_bf16 != theirs_bf16).float().mean() < 0.01


def test_casting_the_model_keeps_the_nvfp4_buffers():
    """`model.to(torch.bfloat16)` casts the bias, not the e4m3 scales or the float32 global scale."""
    layer = nvfp4.NVFP4Linear.from_linear(nn.Linear(64, 32))
    before = {name: t.clone() for name, t in layer.named_buffers()}
    layer.to(torch.bfloat16)
    assert layer.bias.dtype == torch.bfloat16
    for name, t in layer.named_buffers():
        assert t.dtype == before[name].dtype and torch.equal(t.view(torch.uint8) if t.dim() else t, before[name].view(
            torch.uint8) if t.dim() else before[name]), name


def test_quantize_replaces_every_linear_that_fits():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8), nn.Linear(8, 4))
    assert nvfp4.quantize(model) == ["0", "2"]  # 8 input features are not a multiple of 16
    assert isinstance(model[0], nvfp4.NVFP4Linear) and type(model[3]) is nn.Linear


def test_quantize_weight_round_trips_representable_weights():
    """A weight of e2m1 values times power-of-two block scales, each block reaching 6: quantized, it gives back
    its values and block scales (compressed-tensors' decoding, `scale / global`, exactly)."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8, 32), generator=generator)
    codes[:, ::16] = 7  # 6.0 in every block
    block = 2.0 ** torch.randint(-3, 3, (8, 2), generator=generator).float()
    values = nvfp4.e2m1_values(codes)
    packed, block_scale, global_scale = nvfp4.quantize_weight(values * block.repeat_interleave(16, dim=1))
    assert torch.equal(nvfp4.e2m1_values(nvfp4.unpack(packed)), values)
    assert torch.equal(block_scale.float() / global_scale, block)


@pytest.mark.parametrize("per_tensor_scale, bias", [(True, True), (False, False)], ids=["global-bias", "no-global"])
def test_from_torchao_keeps_the_weights_bit_for_bit_as_plain_buffers(per_tensor_scale, bias):
    """`nvfp4.from_torchao` turns torchao's NVFP4 weight-only linears (swizzled scales, with or without the
    per-tensor scale) into `NVFP4Linear` layers: the same outputs bit for bit (eager), no tensor subclass left,
    within float32 rounding of the float64 dequantization, and compiled with the backend every one runs the op."""
    pytest.importorskip("torchao")
    from test_nvfp4_linear import K, N, torchao_model, torchao_reference

    model = torchao_model(torch.float32, bias, per_tensor_scale)
    model.append(nn.ReLU())
    model.append(nn.Linear(N, N, bias=False))  # not quantized: left as it is
    x = torch.randn(6, K)
    with torch.no_grad():
        before, exact = model(x), torchao_reference(model, x)
    assert nvfp4.from_torchao(model) == ["0"]
    layer = model[0]
    assert isinstance(layer, nvfp4.NVFP4Linear) and type(model[2]) is nn.Linear
    assert not any(type(t).__name__ == "NVFP4Tensor" for t in [*model.parameters(), *model.buffers()])
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, atol=0, rtol=0)
        got = layer(x).double()
    torch.testing.assert_close(got, exact, atol=1e-5 * exact.abs().max().item(), rtol=1e-5)
    with torch.no_grad():
        compiled = PostGradCompiled(model, x, backend=fa4_inductor.backend(nvfp4_linear=True))
    assert compiled.code.count(OP_CALL) == 1 and "scale_layout" not in compiled.code  # scales stored un-blocked
    torch.testing.assert_close(compiled.out, before, atol=0, rtol=0)


def test_compiling_torchao_nvfp4_weights_hints_at_from_torchao_once(monkeypatch):
    """torchao NVFP4 weights reach the compiled graph as tensor subclasses (host time on every call): the backend
    says so once a process, with the count and the remedy; after `nvfp4.from_torchao` it has nothing to say."""
    pytest.importorskip("torchao")
    from test_nvfp4_linear import K, torchao_model

    model, x = torchao_model(torch.float32, False), torch.randn(2, K)
    hints = from_torchao_hints(monkeypatch, model, x, compiles=2)
    assert len(hints) == 1 and hints[0][1].startswith("1 torchao NVFP4 weights reach this graph"), hints
    nvfp4.from_torchao(model)
    assert from_torchao_hints(monkeypatch, model, x) == []
