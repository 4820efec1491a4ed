"""nn.MultiheadAttention: its plain self-attention (torchvision ViT's call: one input, no mask, need_weights=False)
opened into its SDPA call (`lowering/multihead_attention.py`) and rewritten onto `fa4::attention`; every other call
one opaque node, kept with its record (`lowering/opaque_attention.py`). Outputs against float64, gradients against
eager, one compile over sequence lengths; on a GPU, ViT-B's attention in bf16 against default compile and float32."""

import copy

import expecttest
import pytest
import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import publishing
from helpers import CROSSOVER_ROUTES, Recorder, compile_and_record


class EncoderBlockAttention(nn.Module):
    def __init__(self, dim=32, heads=4, batch_first=True, bias=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=batch_first, bias=bias)

    def forward(self, x, key_padding_mask=None):
        return self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]


def padded(batch=2, seq=12):
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[1, seq - 5:] = True  # True: a key to ignore
    return mask


def against_float64(model, *args):
    """The recorder of `model` compiled with it, after checking the compiled output against the float64 module's."""
    with torch.no_grad():
        rec, out = compile_and_record(model, *args)
        reference = copy.deepcopy(model).double()(*(a.double() if a.is_floating_point() else a for a in args))
    torch.testing.assert_close(out.double(), reference, atol=1e-5, rtol=1e-5)
    return rec


class TestMultiheadAttention(expecttest.TestCase):
    def test_plain_self_attention_reaches_the_op(self):
        torch.manual_seed(0)
        rec = against_float64(EncoderBlockAttention().eval(), torch.randn(2, 12, 32))
        self.assertExpectedInline(rec.summary, """\
linear: f32[12, 2, 96] = linear(.transpose(x, 1, 0), self.attn.in_proj_weight, self.attn.in_proj_bias)
unflatten: f32[12, 2, 3, 4, 8] = .unflatten(linear, -1, (3, 4, 8))
permute: f32[3, 2, 4, 12, 8] = .permute(unflatten, 2, 1, 3, 0, 4)
getitem: f32[2, 4, 12, 8] = getitem(permute, 0)
getitem_1: f32[2, 4, 12, 8] = getitem(permute, 1)
getitem_2: f32[2, 4, 12, 8] = getitem(permute, 2)
fa4_attention: (f32[2, 4, 12, 8], f32[2, 4, 12]) = fa4.attention(getitem, getitem_1, getitem_2, scale=0.353553)
attention_out: f32[2, 4, 12, 8] = getitem(fa4_attention, 0)
permute_1: f32[12, 2, 4, 8] = .permute(attention_out, 2, 0, 1, 3)
flatten: f32[12, 2, 32] = .flatten(permute_1, 2)
linear_1: f32[12, 2, 32] = linear(flatten, self.attn.out_proj.weight, self.attn.out_proj.bias)""")
        self.assertExpectedInline(str(rec.records[0]), """[rewritten] sdpa        attn (test_multihead_attention.py:24 in forward): fa4.attention(q[2x4x12x8], k[2x4x12x8], v[2x4x12x8], scale=0.353553)""")

    def test_a_padding_mask_is_kept_with_its_reason(self):
        torch.manual_seed(0)
        rec = against_float64(EncoderBlockAttention().eval(), torch.randn(2, 12, 32), padded())
        self.assertExpectedInline("\n".join(map(str, rec.records)), """[kept] opaque_attention attn (test_multihead_attention.py:24 in forward): nn.MultiheadAttention's F.multi_head_attention_forward is one call in Dynamo's graph (projections, masks and attention inside it), which this backend opens only for plain self-attention (one input, no mask, need_weights=False, no bias_k / bias_v, no dropout in training): kept as written""")
        assert rec.summary == "", rec.summary  # nothing added to the graph


@pytest.mark.parametrize("batch_first, bias, mask, served", [(True, True, False, ("sdpa", True)),
                                                              (False, False, False, ("sdpa", True)),
                                                              (True, True, True, ("opaque_attention", False))])
def test_training_step_matches_eager(batch_first, bias, mask, served):
    """A training step, opened or kept: the output and every gradient eager's."""
    torch.manual_seed(1)
    model = EncoderBlockAttention(batch_first=batch_first, bias=bias).train()
    x = torch.randn(2, 12, 32) if batch_first else torch.randn(12, 2, 32)
    x.requires_grad_()
    args = (padded(),) if mask else ()

    def grads(fn):
        model.zero_grad()
        x.grad = None
        out = fn(x, *args)
        out.square().mean().backward()
        return [out.detach()] + [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    eager = grads(model)
    torch._dynamo.reset()
    recorder = Recorder()
    for got, want in zip(grads(torch.compile(model, backend=recorder)), eager):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert [(r.family, r.rewritten) for r in recorder.records] == [served], recorder.records


def test_one_compile_over_sequence_lengths():
    torch.manual_seed(2)
    model = EncoderBlockAttention().eval()
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder, dynamic=True)
    with torch.no_grad():
        for seq in (9, 17, 30):
            x = torch.randn(3, seq, 32)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert len(recorder.graphs) == 1 and [r.rewritten for r in recorder.records] == [True], recorder.records


def test_calls_it_does_not_open_keep_their_record():
    """Cross-attention, a mask, the weights asked for: one node each, kept with the reason (the outputs eager's)."""
    torch.manual_seed(3)
    attn = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x, memory = torch.randn(2, 12, 32), torch.randn(2, 7, 32)
    causal = torch.ones(12, 12, dtype=torch.bool).triu(1)
    calls = {"cross-attention": lambda x: attn(x, memory, memory, need_weights=False)[0],
             "a mask": lambda x: attn(x, x, x, attn_mask=causal, need_weights=False)[0],
             "weights asked for": lambda x: attn(x, x, x)[0]}
    for name, fn in calls.items():
        with torch.no_grad():
            rec, out = compile_and_record(fn, x)
            torch.testing.assert_close(out, fn(x), atol=1e-6, rtol=1e-5)
        assert [(r.family, r.rewritten) for r in rec.records] == [("opaque_attention", False)], (name, rec.records)
        assert "opens only for plain self-attention" in rec.records[0].detail, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vit_base_block_attention_on_the_gpu():
    """ViT-B/16's attention (768 wide, 12 heads, 197 tokens) in bf16 under the backend with Inductor: served (on the
    op or a measured route) and within twice default compile's error against float32 eager, forward and gradients."""
    torch.manual_seed(4)
    model = EncoderBlockAttention(dim=768, heads=12).cuda()
    x = torch.randn(4, 197, 768, device="cuda")

    def run(fn, dtype):
        module = model.to(dtype)
        module.zero_grad()
        inputs = x.to(dtype).requires_grad_()
        out = fn(inputs)
        out.float().square().mean().backward()
        return [out.float()] + [inputs.grad.float()] + [p.grad.float() for p in module.parameters()]

    reference = run(model, torch.float32)
    torch._dynamo.reset()
    with publishing.collecting() as records:
        ours = run(torch.compile(model, backend=fa4_inductor.backend()), torch.bfloat16)
    torch._dynamo.reset()
    default = run(torch.compile(model), torch.bfloat16)
    for o, d, r in zip(ours, default, reference):
        bound = 2 * (d - r).abs().max().item() + 1e-3 * r.abs().max().item()
        assert (o - r).abs().max().item() <= bound
    assert records and all(r.rewritten or r.detail.startswith(CROSSOVER_ROUTES) for r in records), records
