"""nn.TransformerEncoderLayer in eval mode without gradients: PyTorch's fused fast path
(`torch._transformer_encoder_layer_fwd`, one node holding the layer) opened into the layer it computes
(`lowering/encoder_layer.py`), its attention on `fa4::attention`. Goldens, outputs against float64 for each norm
placement, activation and mask, and a TransformerEncoder stack against eager over its real (unpadded) rows."""

import copy
import math

import expecttest
import pytest
import torch
import torch.nn as nn

from helpers import Recorder, compile_and_record, module_call_against_float64


def layer(norm_first=False, activation="relu"):
    return nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True, norm_first=norm_first,
                                      activation=activation).eval()


def padding():
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[1, 8:] = True  # True: a key to ignore
    return mask


def causal():
    return torch.ones(12, 12, dtype=torch.bool).triu(1)


class Encoder(nn.Module):
    """A layer inside a user's module (the graph's inputs then carry the user's names, `x` and `self.layer`)."""

    def __init__(self):
        super().__init__()
        self.layer = layer()

    def forward(self, x):
        return self.layer(x)


class TestEncoderLayer(expecttest.TestCase):
    def test_the_fused_call_is_opened(self):
        torch.manual_seed(0)
        with torch.no_grad():
            rec, out = compile_and_record(Encoder().eval(), torch.randn(2, 12, 32))
        lines = rec.summary.splitlines()  # q / k / v projected and split as nn.MultiheadAttention's opened call
        assert lines[0].startswith("linear: f32[2, 12, 96] = linear(x, self.layer.self_attn.in_proj_weight"), lines[0]
        start = next(i for i, line in enumerate(lines) if line.startswith("fa4_attention"))
        self.assertExpectedInline("\n".join(lines[start:]), """\
fa4_attention: (f32[2, 4, 12, 8], f32[2, 4, 12]) = fa4.attention(getitem, getitem_1, getitem_2, scale=0.353553)
attention_out: f32[2, 4, 12, 8] = getitem(fa4_attention, 0)
transpose: f32[2, 12, 4, 8] = .transpose(attention_out, 1, 2)
flatten: f32[2, 12, 32] = .flatten(transpose, 2)
linear_1: f32[2, 12, 32] = linear(flatten, self.layer.self_attn.out_proj.weight, self.layer.self_attn.out_proj.bias)
add: f32[2, 12, 32] = add(x, linear_1)
layer_norm: f32[2, 12, 32] = layer_norm(add, (32), self.layer.norm1.weight, self.layer.norm1.bias, 1e-05)
linear_2: f32[2, 12, 64] = linear(layer_norm, self.layer.linear1.weight, self.layer.linear1.bias)
relu: f32[2, 12, 64] = relu(linear_2)
linear_3: f32[2, 12, 32] = linear(relu, self.layer.linear2.weight, self.layer.linear2.bias)
add_1: f32[2, 12, 32] = add(layer_norm, linear_3)
layer_norm_1: f32[2, 12, 32] = layer_norm(add_1, (32), self.layer.norm2.weight, self.layer.norm2.bias, 1e-05)""")


CALLS = {
    # name: (call of the layer on x and a key padding mask (a graph input), the op's record flags)
    "no mask": (lambda module, x, pad: module(x), "scale=0.353553)"),
    "key padding": (lambda module, x, pad: module(x, src_key_padding_mask=pad), "key_mask=padding mask, scale=0.353553)"),
    "causal": (lambda module, x, pad: module(x, src_mask=causal()), "scale=0.353553, causal=True)"),
    "causal and key padding": (lambda module, x, pad: module(x, src_mask=causal(), src_key_padding_mask=pad),
                               "key_mask=padding mask, scale=0.353553, causal=True)"),
    "float causal": (lambda module, x, pad: module(x, src_mask=nn.Transformer.generate_square_subsequent_mask(12)),
                     "scale=0.353553, causal=True)"),
    # a float padding mask the caller made: added as the fused call adds it (its values unknown: SDPA keeps it)
    "float key padding": (lambda module, x, pad: module(x, src_key_padding_mask=torch.zeros(2, 12).masked_fill(
        pad, -math.inf)), None),
}


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_opened_layer_matches_float64(name, norm_first, activation):
    torch.manual_seed(1)
    call, flags = CALLS[name]
    module = layer(norm_first, activation)
    x, pad = torch.randn(2, 12, 32), padding()
    rec = module_call_against_float64(module, x, pad, call=call)
    (record,) = rec.records
    assert record.family == "sdpa" and record.rewritten == (flags is not None), record
    assert record.detail.endswith(flags) if flags else record.detail.startswith("mask not recognized"), record


def test_an_encoder_stack_matches_eager_on_its_real_rows():
    """nn.TransformerEncoder with a padding mask: eager runs its fast path over a nested tensor and gives 0 at padded
    positions; under Dynamo (any backend, default compile too) the stack runs on the padded batch, so padded rows
    hold computed values. The real rows are eager's; every layer is on the op."""
    torch.manual_seed(2)
    stack = nn.TransformerEncoder(layer(), 2).eval()
    x, pad = torch.randn(2, 12, 32), padding()
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        out = torch.compile(lambda x, pad: stack(x, src_key_padding_mask=pad), backend=recorder)(x, pad)
        want = stack(x, src_key_padding_mask=pad)
    torch.testing.assert_close(out[~pad], want[~pad], atol=1e-5, rtol=1e-5)
    assert [(r.family, r.rewritten) for r in recorder.records] == [("sdpa", True)] * 2, recorder.records


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "key padding"])
def test_bert_base_shaped_stack_on_the_gpu(masked):
    """A BERT-base-shaped stack (768 wide, 12 heads, GELU) in bf16, 4 x 256 tokens right-padded or not, eval without
    gradients: every layer served (on the op or a measured route), the real rows within twice default compile's
    error against float32 eager."""
    import fa4_inductor
    from fa4_inductor import publishing

    from helpers import CROSSOVER_ROUTES

    torch.manual_seed(3)
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu",
                                                             batch_first=True), 2, enable_nested_tensor=False)
    stack = stack.cuda().eval()
    x = torch.randn(4, 256, 768, device="cuda")
    pad = torch.arange(256, device="cuda")[None, :] >= torch.tensor([[256], [200], [120], [256]], device="cuda")
    kwargs = {"src_key_padding_mask": pad} if masked else {}
    real = ~pad if masked else torch.ones_like(pad)
    with torch.no_grad():
        reference = stack(x, **kwargs)
        bf16 = copy.deepcopy(stack).to(torch.bfloat16)
        torch._dynamo.reset()
        with publishing.collecting() as records:
            ours = torch.compile(bf16, backend=fa4_inductor.backend())(x.bfloat16(), **kwargs)
        torch._dynamo.reset()
        default = torch.compile(bf16)(x.bfloat16(), **kwargs)
    error = lambda out: (out.float() - reference)[real].abs().max().item()  # noqa: E731
    assert error(ours) <= 2 * error(default) + 1e-3 * reference.abs().max().item()
    assert len(records) == 2 and all(r.rewritten or r.detail.startswith(CROSSOVER_ROUTES) for r in records), records
