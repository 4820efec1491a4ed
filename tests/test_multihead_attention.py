"""nn.MultiheadAttention: its calls opened into their SDPA call (`lowering/multihead_attention.py`: self- and
cross-attention, key padding and attention masks, weights asked for but unread) and rewritten onto `fa4::attention`;
the rest (weights read, bias_k / bias_v, zero attention, unbatched input) one opaque node each, kept with its record
(`lowering/opaque_attention.py`). Outputs against float64, gradients against eager, one compile over sequence
lengths, random calls against eager; on a GPU, ViT-B's attention (padded or not) and a DETR decoder's in bf16 against
default compile and float32."""

import math

import expecttest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fa4_inductor
from fa4_inductor import publishing
from helpers import CROSSOVER_ROUTES, Recorder, compile_and_record, module_call_against_float64


class EncoderBlockAttention(nn.Module):
    def __init__(self, dim=32, heads=4, batch_first=True, **options):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=batch_first, **options)

    def forward(self, x, key_padding_mask=None):
        return self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]


def padded(batch=2, seq=12):
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[1, seq - 5:] = True  # True: a key to ignore
    return mask


class TestMultiheadAttention(expecttest.TestCase):
    def test_plain_self_attention_reaches_the_op(self):
        torch.manual_seed(0)
        rec = module_call_against_float64(EncoderBlockAttention().eval(), torch.randn(2, 12, 32))
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
        self.assertExpectedInline(str(rec.records[0]), """[rewritten] sdpa        attn (test_multihead_attention.py:29 in forward): fa4.attention(q[2x4x12x8], k[2x4x12x8], v[2x4x12x8], scale=0.353553)""")

    def test_a_padding_mask_reaches_the_op_as_its_key_mask(self):
        torch.manual_seed(0)
        rec = module_call_against_float64(EncoderBlockAttention().eval(), torch.randn(2, 12, 32), padded())
        lines = rec.summary.splitlines()  # the projections as in the test above, then the mask and the op
        start = next(i for i, line in enumerate(lines) if line.startswith("logical_not"))
        end = next(i for i, line in enumerate(lines) if line.startswith("fa4_attention"))
        self.assertExpectedInline("\n".join(lines[start:end + 1]), """\
logical_not: b8[2, 12] = logical_not(key_padding_mask)
narrow: b8[2, 12] = narrow(logical_not, 1, 0, 12)
key_mask: b8[2, 12] = fa4.key_mask(narrow)
fa4_attention: (f32[2, 4, 12, 8], f32[2, 4, 12]) = fa4.attention(getitem, getitem_1, getitem_2, None, key_mask, scale=0.353553)""")


MEMORY_PADDING = torch.tensor([[False] * 5 + [True] * 2, [False] * 7])  # cross-attention: keys of 7


def causal(dtype=torch.float32):
    """nn.Transformer's causal mask, built in the graph: float, -inf above the diagonal. In the inputs' dtype: a float32
    mask over float64 inputs is not a float64 reference (torch's CPU SDPA misreads it on some CPUs)."""
    return nn.Transformer.generate_square_subsequent_mask(12, dtype=dtype)


def per_head_band(batch=2, heads=4, seq=12, width=3):
    """A boolean [N * H, L, S] attn_mask (True: hidden) of a different sliding window for each head."""
    d = torch.arange(seq)[None, :] - torch.arange(seq)[:, None]
    windows = torch.arange(heads).repeat(batch)[:, None, None] + width
    return (d > 0) | (d < -windows)


OPENED_CALLS = {
    # name: (call of the module `attn` on x [2, 12, 32], memory [2, 7, 32] and the boolean masks (graph inputs),
    #        the op's record flags, None where the mask stays with SDPA)
    "key padding": (lambda attn, x, m, pad, band: attn(x, x, x, key_padding_mask=pad, need_weights=False),
                    "key_mask=padding mask, scale=0.353553)"),
    "bool causal and key padding": (
        lambda attn, x, m, pad, band: attn(x, x, x, attn_mask=torch.ones(12, 12, dtype=torch.bool).triu(1),
                                           key_padding_mask=pad),
        "key_mask=padding mask, scale=0.353553, causal=True)"),
    "float causal mask": (lambda attn, x, m, pad, band: attn(x, x, x, attn_mask=causal(x.dtype), need_weights=False),
                          "scale=0.353553, causal=True)"),
    "is_causal hint": (
        lambda attn, x, m, pad, band: attn(x, x, x, attn_mask=causal(x.dtype), need_weights=False, is_causal=True),
        "scale=0.353553, causal=True)"),
    "float causal and bool padding": (
        lambda attn, x, m, pad, band: F.multi_head_attention_forward(
            x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), 32, 4, attn.in_proj_weight, attn.in_proj_bias,
            None, None, False, 0.0, attn.out_proj.weight, attn.out_proj.bias, training=attn.training,
            key_padding_mask=pad, need_weights=False, attn_mask=causal(x.dtype))[0].transpose(0, 1)[None],
        "key_mask=padding mask, scale=0.353553, causal=True)"),
    "per-head boolean mask": (lambda attn, x, m, pad, band: attn(x, x, x, attn_mask=band, need_weights=False), None),
    "cross-attention, memory padded": (
        lambda attn, x, m, pad, band: attn(x, m, m, key_padding_mask=pad[:, :7]),
        "k[2x4x7x8], v[2x4x7x8], key_mask=padding mask, scale=0.353553)"),
    "cross-attention, separate key and value": (
        lambda attn, x, m, pad, band: attn(x, m, m.flip(1), need_weights=False),
        "k[2x4x7x8], v[2x4x7x8], scale=0.353553)"),
}


@pytest.mark.parametrize("name", sorted(OPENED_CALLS))
@pytest.mark.parametrize("training", [False, True])
def test_masked_and_cross_attention_calls_are_opened(name, training):
    """Each call opened into its SDPA call: the output against float64 (inference) or eager's output and gradients
    (a training step), and the op's flags where the masks reach it (a per-head mask stays with SDPA, its reason
    recorded)."""
    torch.manual_seed(5)
    call, flags = OPENED_CALLS[name]
    attn = nn.MultiheadAttention(32, 4, batch_first=True).train(training)
    x, memory = torch.randn(2, 12, 32), torch.randn(2, 7, 32)
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[0, 4:] = True
    if training:
        rec = gradients_match_eager(attn, lambda x, pad, band: call(attn, x, memory, pad, band)[0], x, pad,
                                    per_head_band())
    else:
        rec = module_call_against_float64(attn, x, memory, pad, per_head_band(),
                                          call=lambda module, *inputs: call(module, *inputs)[0])
    (record,) = rec.records
    assert record.family == "sdpa" and record.rewritten == (flags is not None), record
    assert record.detail.endswith(flags) if flags else record.detail.startswith("mask not recognized"), record


def test_separate_projection_weights_are_opened():
    """kdim / vdim other than the embedding width: q / k / v projected by their own weights."""
    torch.manual_seed(6)
    attn = nn.MultiheadAttention(32, 4, kdim=24, vdim=20).eval()
    x, key, val = torch.randn(12, 2, 32), torch.randn(7, 2, 24), torch.randn(7, 2, 20)
    rec = module_call_against_float64(attn, x, key, val,
                                      call=lambda module, *qkv: module(*qkv, key_padding_mask=MEMORY_PADDING)[0])
    assert [(r.family, r.rewritten) for r in rec.records] == [("sdpa", True)], rec.records


class CausalTextBlock(nn.Module):
    """OpenCLIP's text tower: the causal mask a float buffer, read by value when compiling."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.register_buffer("attn_mask", causal(), persistent=False)

    def forward(self, x):
        return self.attn(x, x, x, attn_mask=self.attn_mask, need_weights=False)[0]


def test_a_causal_mask_buffer_reaches_the_op_as_causal():
    torch.manual_seed(7)
    rec = module_call_against_float64(CausalTextBlock().eval(), torch.randn(2, 12, 32))
    assert [(r.family, r.rewritten) for r in rec.records] == [("sdpa", True)], rec.records
    assert rec.records[0].detail.endswith("scale=0.353553, causal=True)"), rec.records[0]


def gradients_match_eager(module, fn, x, *args):
    """fn(x, *args) compiled with the recorder: its output and the gradients of x and of module's parameters eager's;
    returns the recorder."""
    x = x.clone().requires_grad_()

    def grads(f):
        module.zero_grad()
        x.grad = None
        out = f(x, *args)
        out.square().mean().backward()
        return [out.detach(), x.grad.clone()] + [p.grad.clone() for p in module.parameters() if p.grad is not None]

    eager = grads(fn)
    torch._dynamo.reset()
    recorder = Recorder()
    for got, want in zip(grads(torch.compile(fn, backend=recorder, fullgraph=True)), eager, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    return recorder


@pytest.mark.parametrize("options, served", [({}, ("sdpa", True)),
                                             ({"batch_first": False, "bias": False}, ("sdpa", True)),
                                             ({"add_bias_kv": True}, ("opaque_attention", False))])
def test_training_step_matches_eager(options, served):
    """A training step, opened or kept (bias_k / bias_v): the output and every gradient eager's."""
    torch.manual_seed(1)
    model = EncoderBlockAttention(**options).train()
    x = torch.randn(2, 12, 32) if options.get("batch_first", True) else torch.randn(12, 2, 32)
    recorder = gradients_match_eager(model, model, x)
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
    """The weights read, bias_k / bias_v, zero attention, unbatched input: one node each, kept with the reason (the
    outputs eager's)."""
    torch.manual_seed(3)
    attn = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    biased = nn.MultiheadAttention(32, 4, batch_first=True, add_bias_kv=True, add_zero_attn=True).eval()
    x = torch.randn(2, 12, 32)
    calls = {"weights read": (lambda x: attn(x, x, x)[1], "opens only where its attention weights are not read"),
             "output and weights read": (lambda x: torch.cat(attn(x, x, x), -1),
                                         "opens only where its attention weights are not read"),
             "bias_k / zero attention": (lambda x: biased(x, x, x, need_weights=False)[0], "bias_k / bias_v"),
             "unbatched": (lambda x: attn(x[0], x[0], x[0], need_weights=False)[0], "unbatched input")}
    for name, (fn, reason) in calls.items():
        with torch.no_grad():
            rec, out = compile_and_record(fn, x)
            torch.testing.assert_close(out, fn(x), atol=1e-6, rtol=1e-5)
        families = {(r.family, r.rewritten) for r in rec.records}
        assert families == {("opaque_attention", False)}, (name, rec.records)
        assert reason in rec.records[0].detail, (name, rec.records[0].detail)


class DecoderBlockAttention(nn.Module):
    """DETR's decoder attention: queries over themselves, then over the encoder's memory, its padding masked."""

    def __init__(self, dim, heads):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x, memory, memory_padding):
        x = x + self.self_attn(x, x, x, need_weights=False)[0]
        return x + self.cross_attn(x, memory, memory, key_padding_mask=memory_padding)[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("block", ["vit", "vit padded", "detr decoder"])
def test_block_attention_on_the_gpu(block):
    """ViT-B/16's attention (768 wide, 12 heads, 197 tokens; its batch right-padded or not) and a DETR decoder's
    self- and cross-attention (256 wide, 8 heads, 100 queries over 850 memory tokens, padded) in bf16 under the
    backend with Inductor: served (on the op or a measured route) and within twice default compile's error against
    float32 eager, forward and gradients."""
    torch.manual_seed(4)
    if block.startswith("vit"):
        model = EncoderBlockAttention(dim=768, heads=12).cuda()
        inputs = [torch.randn(4, 197, 768, device="cuda")]
        if block == "vit padded":
            inputs.append(torch.arange(197, device="cuda")[None, :] >= torch.tensor([[197], [150], [90], [197]],
                                                                                     device="cuda"))
    else:
        model = DecoderBlockAttention(256, 8).cuda()
        padding = torch.arange(850, device="cuda")[None, :] >= torch.tensor([[850], [600]], device="cuda")
        inputs = [torch.randn(2, 100, 256, device="cuda"), torch.randn(2, 850, 256, device="cuda"), padding]

    def run(fn, dtype):
        module = model.to(dtype)
        module.zero_grad()
        args = [t.detach().to(dtype).requires_grad_() if t.is_floating_point() else t for t in inputs]
        out = fn(*args)
        out.float().square().mean().backward()
        return [out.float()] + [t.grad.float() for t in args if t.is_floating_point()] + \
            [p.grad.float() for p in module.parameters()]

    reference = run(model, torch.float32)
    torch._dynamo.reset()
    with publishing.collecting() as records:
        ours = run(torch.compile(model, backend=fa4_inductor.backend()), torch.bfloat16)
    torch._dynamo.reset()
    default = run(torch.compile(model), torch.bfloat16)
    for o, d, r in zip(ours, default, reference, strict=True):
        bound = 2 * (d - r).abs().max().item() + 1e-3 * r.abs().max().item()
        assert (o - r).abs().max().item() <= bound
    assert records and all(r.rewritten or r.detail.startswith(CROSSOVER_ROUTES) for r in records), records


MASKS = ("none", "padding", "bool causal", "bool random", "float causal", "float padding and causal", "per head",
         "is_causal hint")


@st.composite
def multihead_calls(draw):
    """A random nn.MultiheadAttention call: width and heads, batch first or not, biases, separate q / k / v weights
    (kdim / vdim), self- or cross-attention (key is value or not), each kind of mask as a graph input, weights asked
    for (unread) or not, inference or a training step."""
    embed, heads = draw(st.sampled_from([(16, 2), (24, 3), (32, 4)]))
    separate = draw(st.booleans())
    cross = separate or draw(st.booleans())
    batch, length = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    return dict(embed=embed, heads=heads, batch_first=draw(st.booleans()), bias=draw(st.booleans()),
                kdim=12 if separate else None, vdim=20 if separate else None, cross=cross,
                key_is_value=not separate and draw(st.booleans()), batch=batch, length=length,
                source=draw(st.integers(1, 9)) if cross else length, mask=draw(st.sampled_from(MASKS)),
                need_weights=draw(st.booleans()), training=draw(st.booleans()), seed=draw(st.integers(0, 99)))


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=multihead_calls())
def test_random_calls_match_eager(call):
    """Whatever the call, opened or kept: the output (and in training the gradients) eager's."""
    torch.manual_seed(call["seed"])
    n, length, source, heads = call["batch"], call["length"], call["source"], call["heads"]
    attn = nn.MultiheadAttention(call["embed"], heads, bias=call["bias"], batch_first=call["batch_first"],
                                 kdim=call["kdim"], vdim=call["vdim"]).train(call["training"])
    laid = (lambda t, d: torch.randn(n, t, d)) if call["batch_first"] else (lambda t, d: torch.randn(t, n, d))
    x = laid(length, call["embed"])
    key = laid(source, call["kdim"] or call["embed"]) if call["cross"] else x
    value = key if call["key_is_value"] or not call["cross"] else laid(source, call["vdim"] or call["embed"])
    causal = torch.ones(length, source, dtype=torch.bool).triu(1)
    padding = torch.rand(n, source) < 0.3
    padding[:, 0] = False
    kind, is_causal = call["mask"], call["mask"] == "is_causal hint" and length == source
    attn_mask = {"bool causal": causal, "bool random": torch.rand(length, source) < 0.3,
                 "float causal": torch.zeros(length, source).masked_fill(causal, -math.inf),
                 "float padding and causal": torch.zeros(length, source).masked_fill(causal, -math.inf),
                 "per head": torch.rand(n * heads, length, source) < 0.3,
                 "is_causal hint": torch.zeros(length, source).masked_fill(causal, -math.inf)}.get(kind)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask[..., 0] = False
    key_padding_mask = {"padding": padding,
                        "float padding and causal": torch.zeros(n, source).masked_fill(padding, -math.inf)}.get(kind)

    def fn(x, key, value, key_padding_mask, attn_mask):
        return attn(x, key, value, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                    need_weights=call["need_weights"], is_causal=is_causal)[0]

    args = (x, key, value, key_padding_mask, attn_mask)
    if call["training"]:
        gradients_match_eager(attn, lambda x: fn(x, *args[1:]), x)
        return
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(fn, backend=Recorder())(*args), fn(*args), atol=1e-5, rtol=1e-4)
