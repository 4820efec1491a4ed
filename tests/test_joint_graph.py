"""The joint stage (lowering/joint_graph.py): in a training step over frozen quantized weights, each weight's
dequantized form is computed again in the backward instead of saved from the forward, so the forward saves the
codes and scales alone and its quantized linears are rewritten as at inference; gradients as eager's against
float64; nothing recomputed from an input the graph writes."""

import pytest
import torch
import torch.nn as nn
from expecttest import assert_expected_inline
from torch.utils.checkpoint import CheckpointPolicy

import fa4_inductor
from fa4_inductor import publishing
from fa4_inductor.lowering import joint_graph
from fa4_inductor.nvfp4 import NVFP4Linear, replace_module
from helpers import assert_as_close_as_eager
from test_quantized_models import fp8_linear, int8_linear, torchao_configs

pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # conftest.py: a cache hit skips the passes

K, H = 64, 96
FORMATS = {"int8": (int8_linear, "int8_linear"), "nvfp4": (NVFP4Linear.from_linear, "nvfp4_linear"),
           "fp8 weight-only": (fp8_linear(None), "fp8_linear")}


class Block(nn.Module):
    """Two linears around a trainable norm: what a LoRA-style fine-tune over a quantized base looks like."""

    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(K, H), nn.LayerNorm(H), nn.Linear(H, K, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.norm(self.up(x))))


def quantized_block(fmt: str) -> tuple[nn.Module, str]:
    """The block (seed 0) with both linears in `fmt`, frozen, and the record family of their rewrite."""
    torch.manual_seed(0)
    block = Block()
    if fmt in FORMATS:
        make, family = FORMATS[fmt]
        for name in ("up", "down"):
            replace_module(block, name, make(getattr(block, name)))
    else:
        from torchao.quantization import quantize_

        config, family = torchao_configs()[fmt]
        quantize_(block, config, filter_fn=lambda module, fqn: fqn in ("up", "down"))
    for name in ("up", "down"):
        getattr(block, name).requires_grad_(False)
    return block, family


def dequantized_block(block: nn.Module) -> nn.Module:
    """A float64 copy whose linears hold the weights the quantized ones compute with (read back through each layer
    from an identity matrix, less its bias)."""
    torch.manual_seed(0)
    reference = Block().double()
    with torch.no_grad():
        reference.norm.load_state_dict(block.norm.state_dict())
        for name in ("up", "down"):
            layer, exact = getattr(block, name), getattr(reference, name)
            eye = torch.eye(layer.in_features)
            bias = layer.bias if layer.bias is not None else 0
            exact.weight.copy_((layer(eye) - bias).T)
            if layer.bias is not None:
                exact.bias.copy_(layer.bias)
            exact.requires_grad_(False)
    return reference


def saved_for_backward(fn, x, backend) -> list[str]:
    """dtype[shape] of each tensor the compiled forward graph returns beside fn's output (what it saves for the
    backward), sorted; and runs the backward."""
    saved = []

    def spy(graph):
        if not saved:
            outputs = graph.find_nodes(op="output")[0].args[0]
            saved.extend(sorted(f"{str(n.meta['val'].dtype).removeprefix('torch.')}{list(n.meta['val'].shape)}"
                                for n in outputs[1:] if isinstance(n, torch.fx.Node)))

    torch._dynamo.reset()
    with torch._inductor.config.patch(post_grad_custom_post_pass=spy):
        torch.compile(fn, backend=backend)(x).sum().backward()
    return saved


def test_the_forward_saves_codes_and_scales_not_the_dequantized_weights():
    """int8 weights (`Int8Linear`: codes [N, K] and a scale per row): with the option, the forward saves the codes,
    the scales, the norm's parameters and activations; without it, each weight [N, K] in float32 instead of its
    codes (what default torch.compile saves)."""
    block, _ = quantized_block("int8")
    x = torch.randn(5, K, requires_grad=True)
    on = saved_for_backward(block, x, fa4_inductor.backend())
    off = saved_for_backward(block, x, fa4_inductor.backend(recompute_dequantized_weights=False))
    assert_expected_inline(" ".join(on), """\
float32[5, 1] float32[5, 1] float32[5, 96] float32[64] float32[96] float32[96] float32[96] float32[96] int8[64, 96] \
int8[96, 64]""")
    assert_expected_inline(" ".join(off), """\
float32[5, 1] float32[5, 1] float32[5, 96] float32[64, 96] float32[64] float32[96, 64] float32[96] float32[96] \
float32[96] float32[96]""")


@pytest.mark.parametrize("fmt", [*FORMATS, "torchao int8", "torchao nvfp4", "torchao fp8 weight-only"])
def test_a_training_step_over_frozen_quantized_weights(fmt):
    """The input's and the norm's gradients and the loss of a compiled step as eager's against float64; no
    quantized linear kept because its dequantized weight is saved for the backward (the ones whose raw matmul
    output the partitioner saves, `up` before the norm, stay as written for that); nothing of a weight's shape
    saved in the model's dtype. NVFP4 with the option set (its default saves them: `test_nvfp4_is_saved_by_default`)."""
    backend = fa4_inductor.backend(recompute_dequantized_weights=True if "nvfp4" in fmt else None)
    block, family = quantized_block(fmt)
    reference = dequantized_block(block)
    torch.manual_seed(1)
    x = torch.randn(6, K)

    def step(model, dtype=torch.float32):
        xg = x.detach().to(dtype).clone().requires_grad_(True)
        model.zero_grad(set_to_none=True)
        loss = model(xg).sin().sum()
        loss.backward()
        return [loss.detach(), xg.grad, model.norm.weight.grad, model.norm.bias.grad]

    eager = step(block)
    exact = step(reference, torch.float64)
    torch._dynamo.reset()
    with publishing.collecting() as records:
        ours = step(torch.compile(block, backend=backend))
    for name, o, e, r in zip(["loss", "x", "norm.weight", "norm.bias"], ours, eager, exact):
        assert_as_close_as_eager(name, o, e, r, slack=1e-5)
    reasons = [str(r) for r in records if r.family == family and not r.rewritten]
    assert not any("saves it for the backward" in reason for reason in reasons), reasons
    assert any(r.rewritten and r.family == family for r in records), [str(r) for r in records]
    saved = saved_for_backward(block, torch.randn(6, K, requires_grad=True), backend)
    assert not {"float32[96, 64]", "float32[64, 96]"} & set(saved), saved


@pytest.mark.parametrize("fmt", ["nvfp4", "torchao nvfp4"])
def test_nvfp4_is_saved_by_default(fmt):
    """NVFP4's packed codes (uint8) are not recomputed from by default (the step measured slower than default
    compile's that way on the H200): the forward saves each weight dequantized, as with the option off; the step's
    loss and gradients as eager's."""
    block, _ = quantized_block(fmt)
    x = torch.randn(5, K, requires_grad=True)
    default = saved_for_backward(block, x, fa4_inductor.backend())
    assert default == saved_for_backward(block, x, fa4_inductor.backend(recompute_dequantized_weights=False))
    assert {"float32[96, 64]", "float32[64, 96]"} <= set(default), default
    assert default != saved_for_backward(block, x, fa4_inductor.backend(recompute_dequantized_weights=True))
    torch._dynamo.reset()
    x.grad = None
    got = torch.compile(block, backend=fa4_inductor.backend())(x)
    got.sin().sum().backward()
    grad, x.grad = x.grad, None
    expected = block(x)
    expected.sin().sum().backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grad, x.grad)


def test_option_off_keeps_the_linears_with_the_reason():
    """Without the option the dequantized weights escape the forward (saved for the backward): the linears stay as
    written, with that reason."""
    block, _ = quantized_block("int8")
    torch._dynamo.reset()
    with publishing.collecting() as records:
        out = torch.compile(block, backend=fa4_inductor.backend(recompute_dequantized_weights=False))(
            torch.randn(3, K, requires_grad=True))
        out.sum().backward()
    kept = [r for r in records if r.family == "int8_linear"]
    assert kept and not any(r.rewritten for r in kept), [str(r) for r in kept]
    assert any("a training forward saves it for the backward" in r.detail for r in kept), [str(r) for r in kept]


def test_an_input_the_graph_writes_is_not_recomputed_from():
    """An int8 buffer read dequantized, then written in place: recomputing its dequantized value in the backward
    would read the new contents. The compiled step's gradient is eager's, whether the write is seen in the Dynamo
    graph (the backend leaves the joint graph as it is) or only in the joint graph (`copy_` into the primal)."""
    torch.manual_seed(0)
    codes = torch.randint(-127, 128, (16, 32), dtype=torch.int8)
    scale = torch.rand(16, 1)
    x = torch.randn(4, 32)

    def f(x, codes, scale):
        w = codes.to(torch.float32) * scale
        codes.add_(1)
        return (x @ w.t()).sin().sum()

    def gradient(fn):
        xg = x.clone().requires_grad_(True)
        fn(xg, codes.clone(), scale).backward()
        return xg.grad

    expected = gradient(f)
    torch._dynamo.reset()
    torch.testing.assert_close(gradient(torch.compile(f, backend=fa4_inductor.backend())), expected)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def reads_only(x, codes, scale):
        return (x @ (codes.to(torch.float32) * scale).t()).sin().sum()

    for fn in (f, reads_only):
        torch._dynamo.reset()
        torch.compile(fn, backend=capture)(x, codes.clone(), scale)
    assert [joint_graph.quantized_inputs_written(gm) for gm in graphs] == [True, False]

    marked = []

    def joint(graph):
        marked.extend(joint_graph.mark_dequantized_weights(graph))

    torch._dynamo.reset()
    with torch._inductor.config.patch(joint_custom_pre_pass=joint):
        torch.compile(f)(x.clone().requires_grad_(True), codes.clone(), scale).backward()
    assert marked == [], marked


def test_what_is_marked_in_a_joint_graph():
    """Computed from primals alone with a quantized one among them: marked (the dequantization, its transpose);
    from a float primal alone, through a matmul, from an activation, or random: not."""
    seen = {}

    def joint(graph):
        marked = set(joint_graph.mark_dequantized_weights(graph))
        seen.update({getattr(n.target, "__name__", str(n.target)).split(".")[0]: n in marked
                     for n in graph.nodes if n.op == "call_function"})
        assert all(n.meta.get("recompute") == CheckpointPolicy.MUST_RECOMPUTE for n in marked)

    def f(x, codes, scale, lora):
        w = codes.to(torch.float32) * scale
        noise = torch.rand_like(scale) * codes.to(torch.float32)[:, :1]
        return ((x @ w.t()) * noise.t() + x @ lora.t().exp()).sum()

    torch.manual_seed(0)
    args = (torch.randn(4, 32, requires_grad=True), torch.randint(-127, 128, (16, 32), dtype=torch.int8),
            torch.rand(16, 1), torch.randn(16, 32, requires_grad=True))
    torch._dynamo.reset()
    with torch._inductor.config.patch(joint_custom_pre_pass=joint):
        torch.compile(f)(*args).backward()
    assert seen.get("mul") is not None and seen.get("rand") is False and seen.get("mm") is False, seen
    assert seen.get("exp") is False, seen  # lora: a float primal
    assert seen.get("convert_element_type") is True, seen


def test_an_inference_graph_is_left_alone():
    """Inductor runs the joint hook on inference graphs too (no tangents): nothing is marked there."""
    marked = []

    def joint(graph):
        marked.extend(joint_graph.mark_dequantized_weights(graph))

    block, _ = quantized_block("int8")
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(joint_custom_pre_pass=joint):
        torch.compile(block)(torch.randn(3, K))
    assert marked == []


def test_under_activation_checkpointing():
    """A block under `torch.utils.checkpoint` (its nodes carry the user's recompute policy, which stands): the
    compiled step's gradient is eager's."""
    from torch.utils.checkpoint import checkpoint

    block, _ = quantized_block("int8")
    torch.manual_seed(2)
    x = torch.randn(5, K)

    def step(x):
        return checkpoint(block, x, use_reentrant=False).sin().sum()

    def gradient(fn):
        xg = x.clone().requires_grad_(True)
        fn(xg).backward()
        return xg.grad

    torch._dynamo.reset()
    torch.testing.assert_close(gradient(torch.compile(step, backend=fa4_inductor.backend())), gradient(step))
