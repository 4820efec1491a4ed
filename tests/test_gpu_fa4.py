"""GPU tier: `fa4::attention` on FA4 (`kernels/fa4.py`), run with `pytest -m gpu` on an sm90 / sm100 GPU.

Numerics follow FlashAttention's rule: against the float64 reference, our max abs error is at most
2x PyTorch's own error in the same dtype, plus 1e-5. PyTorch's own is SDPA (`enable_gqa=True`)
where SDPA expresses the call, else the same attention as eager ops in the input dtype
(FlashAttention's `upcast=False` baseline). Softcap gets 3x and +3e-4 on gradients, FA4's own
tests' allowance for its `tanh.approx`.
"""

import pytest
import torch
import torch.nn.functional as F

import fa4_inductor  # noqa: F401  (registers the ops)
from fa4_inductor.kernels import attention as attention_op
from fa4_inductor.kernels import crossover, decode, fa4, fa4_replay, reference, switches
from gpu_helpers import assert_fa_rule, assert_fa_rule_with_gradients, capture, eager

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ATTENTION = torch.ops.fa4.attention.default
BACKWARD = torch.ops.fa4.attention_backward.default
HQ = 16


@pytest.fixture(autouse=True)
def fa4_device(monkeypatch):
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        pytest.skip(f"FA4 is wired for sm90 / sm100, not sm{major}{minor}")
    monkeypatch.delenv(fa4.DISABLE_ENV, raising=False)
    monkeypatch.setenv(decode.DISABLE_ENV, "1")  # decode-shaped cases here are FA4's (test_gpu_decode.py has ours)
    monkeypatch.setenv(switches.SMALL_ON_FA4, "1")  # and so are small ones (test_small_attentions_... unsets it)
    torch.manual_seed(0)


def qkv(dtype=torch.bfloat16, b=2, sq=1024, sk=None, group=1, d=128, dv=None, requires_grad=False):
    """Fresh q, k, v as HF hands them over: [B, H, S, D] views of contiguous [B, S, H, D]."""
    sk, dv = sk or sq, dv or d

    def make(s, h, dd):
        return torch.randn(b, s, h, dd, dtype=dtype, device="cuda").transpose(1, 2).requires_grad_(requires_grad)

    return make(sq, HQ, d), make(sk, HQ // group, d), make(sk, HQ // group, dv)


def attention_flags(d, causal=False, window_left=-1, window_right=-1, softcap=0.0, scale=None):
    scale = d ** -0.5 if scale is None else scale
    return dict(scale=scale, causal=causal, window_left=window_left, window_right=window_right, softcap=softcap)


def pytorch(q, k, v, seqused_k=None, **flags):
    """PyTorch's own attention: SDPA where it says the same thing (its causal mask is top-left, ours
    bottom-right: the same when Sq == Sk), else `eager`."""
    plain = flags["window_left"] < 0 and flags["window_right"] < 0 and flags["softcap"] == 0
    if plain and seqused_k is None and q.shape[2] == k.shape[2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=flags["causal"], scale=flags["scale"], enable_gqa=True)
    return eager(q, k, v, seqused_k, **flags)[0]


def float64(*tensors):
    return [t.detach().double() for t in tensors]


def assert_runs_fa4(q, k, v, seqused_k=None, route="fa4", **flags):
    name, why = attention_op.kernel_for(q, k, v, seqused_k=seqused_k, **flags)
    assert name == route, why


def check_forward(q, k, v, seqused_k=None, route="fa4", **flags):
    assert_runs_fa4(q, k, v, seqused_k, route, **flags)
    out, lse = ATTENTION(q, k, v, seqused_k, **flags)
    b, hq, sq, dv = out.shape
    assert out.dtype == q.dtype and out.stride() == (sq * hq * dv, dv, hq * dv, 1)
    assert lse.dtype == torch.float32 and lse.shape == (b, hq, sq) and lse.is_contiguous()
    ref_out, ref_lse = reference.attention_forward(*float64(q, k, v), seqused_k=seqused_k, **flags)
    assert_fa_rule("out", out, ref_out, pytorch(q, k, v, seqused_k, **flags), flags["softcap"])
    # FA4's softcap runs tanh.approx (relative error 2^-11), which moves scores by up to softcap * 2^-11.
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-3 + flags["softcap"] * 2 ** -9)


def check_backward(q, k, v, seqused_k=None, with_grad_lse=False, route="fa4", **flags):
    """Gradients through the op's autograd (fa4::attention_backward), by the FA rule."""
    assert_runs_fa4(q, k, v, seqused_k, route, **flags)
    out, lse = ATTENTION(q, k, v, seqused_k, **flags)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_grad_lse else None
    outputs, grads_in = ((out, lse), (dout, dlse)) if with_grad_lse else ((out,), (dout,))
    grads = torch.autograd.grad(outputs, (q, k, v), grads_in)
    for g, t in zip(grads, (q, k, v)):
        b, h, s, d = t.shape
        assert g.dtype == t.dtype and g.stride() == (s * h * d, d, h * d, 1)

    q64, k64, v64, dout64 = float64(q, k, v, dout)
    out64, lse64 = reference.attention_forward(q64, k64, v64, seqused_k=seqused_k, **flags)
    refs = reference.attention_backward(dout64, q64, k64, v64, out64, lse64, None if dlse is None else dlse.double(),
                                        seqused_k=seqused_k, **flags)

    qp, kp, vp = (t.detach().requires_grad_() for t in (q, k, v))
    if with_grad_lse:
        pt_out, pt_lse = eager(qp, kp, vp, seqused_k, **flags)
        pt_grads = torch.autograd.grad((pt_out, pt_lse), (qp, kp, vp), (dout, dlse.to(pt_lse.dtype)))
    else:
        pt_grads = torch.autograd.grad(pytorch(qp, kp, vp, seqused_k, **flags), (qp, kp, vp), dout)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, pt_grads):
        assert_fa_rule(name, g, r, p, flags["softcap"], grad=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward(dtype, group, d, causal):
    check_forward(*qkv(dtype, group=group, d=d), **attention_flags(d, causal))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_head_dim_256(dtype, causal):
    check_forward(*qkv(dtype, sq=512, group=4, d=256), **attention_flags(256, causal))


@pytest.mark.parametrize(
    "sq, sk, causal",
    [(1000, 1000, False), (1000, 1000, True), (256, 1000, True), (1, 1000, True), (1000, 256, False),
     (1000, 256, True)],  # bottom-right causal: the first 744 rows see no key (zeros, lse -inf)
)
def test_forward_odd_lengths(sq, sk, causal):
    check_forward(*qkv(sq=sq, sk=sk, group=4), **attention_flags(128, causal))


MASKS = [
    dict(causal=True, window_left=64),
    dict(window_left=64, window_right=32),
    # scale 1 puts scores (std ~11 at d 128) where tanh bends: a dropped softcap would show
    dict(softcap=30.0, scale=1.0),
    dict(causal=True, softcap=30.0, scale=1.0),
]


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("group", [1, 4])
def test_forward_window_and_softcap(mask, group):
    check_forward(*qkv(group=group), **attention_flags(128, **mask))


@pytest.mark.parametrize("sq, causal", [(1024, False), (256, True)])
def test_forward_seqused_k(sq, causal):
    used = torch.tensor([1024, 517], dtype=torch.int32, device="cuda")
    check_forward(*qkv(sq=sq, sk=1024, group=4), used, **attention_flags(128, causal))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward(dtype, group, d, causal):
    check_backward(*qkv(dtype, group=group, d=d, requires_grad=True), **attention_flags(d, causal))


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_backward_window_and_softcap(mask):
    check_backward(*qkv(group=4, requires_grad=True), **attention_flags(128, **mask))


@pytest.mark.parametrize("sq, sk, causal", [(1000, 1000, True), (256, 1000, True), (1000, 256, False), (1000, 256, True)])
def test_backward_odd_lengths(sq, sk, causal):
    check_backward(*qkv(sq=sq, sk=sk, group=4, requires_grad=True), **attention_flags(128, causal))


@pytest.mark.parametrize("sq, causal", [(1024, False), (256, True)])
def test_backward_seqused_k(sq, causal):
    used = torch.tensor([1024, 517], dtype=torch.int32, device="cuda")
    check_backward(*qkv(sq=sq, sk=1024, group=4, requires_grad=True), used, **attention_flags(128, causal))


def test_backward_through_lse():
    check_backward(*qkv(group=4, requires_grad=True), with_grad_lse=True, **attention_flags(128, causal=True))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group, d", [(1, 64), (4, 64), (4, 128)])
def test_small_attentions_run_cudnn_sdpa(monkeypatch, group, d, causal):
    """Small unmasked attentions (`crossover.small`) run cuDNN SDPA, forward and FA4's backward from its lse;
    larger ones, a key mask or Sq != Sk under causal keep their routes."""
    monkeypatch.delenv(switches.SMALL_ON_FA4)
    switches.reset()
    flags = attention_flags(d, causal=causal)
    q, k, v = qkv(b=2, sq=256, group=group, d=d, requires_grad=True)
    assert crossover.small(2, HQ, 256, 256, d, causal)
    check_forward(q, k, v, route="sdpa_small", **flags)
    check_backward(q, k, v, route="sdpa_small", **flags)
    big = qkv(b=8, sq=4096, group=group, d=d)
    assert attention_op.kernel_for(*big, **flags)[0] == "fa4"
    if causal:
        q2, k2, v2 = qkv(b=2, sq=128, sk=256, group=group, d=d)
        assert attention_op.kernel_for(q2, k2, v2, **flags)[0] == "fa4"
    monkeypatch.setenv(switches.SMALL_ON_FA4, "1")
    switches.reset()
    assert attention_op.kernel_for(q, k, v, **flags)[0] == "fa4"


def test_hf_and_sdpa_layouts_are_not_copied():
    hf = torch.randn(2, 256, HQ, 128, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    sdpa = torch.randn(2, HQ, 256, 128, dtype=torch.bfloat16, device="cuda")
    for t in (hf, sdpa):
        assert fa4._bshd(t).data_ptr() == t.data_ptr()


@pytest.mark.parametrize("layout", ["misaligned", "strided_head_dim"])
def test_other_layouts_are_copied_and_run_fa4(layout):
    q, k, v = qkv(sq=256, group=4)
    if layout == "misaligned":  # starts one element past a 16-byte boundary
        flat = torch.randn(q.numel() + 1, dtype=q.dtype, device="cuda")
        q = flat[1:].view(2, 256, HQ, 128).transpose(1, 2)
    else:
        q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    check_forward(q, k, v, **attention_flags(128, causal=True))


@pytest.mark.parametrize(
    "dtype, d, dv, reason",
    [
        (torch.float32, 128, 128, "float16 / bfloat16"),
        (torch.bfloat16, 12, 12, "multiples of 8"),
        (torch.bfloat16, 128, 264, "head dims"),
    ],
)
def test_unsupported_reason(dtype, d, dv, reason):
    q, k, v = qkv(dtype, sq=64, d=d, dv=dv)
    got = fa4.unsupported_reason(q, k, v, **attention_flags(d))
    assert got is not None and reason in got


FALLBACK_CASES = [
    dict(sq=256, sk=256, group=4, seqused=None, flags=dict(causal=True)),
    dict(sq=200, sk=1000, group=1, seqused=None, flags=dict(causal=True)),
    dict(sq=1000, sk=256, group=4, seqused=None, flags=dict(causal=True)),  # rows that see no key
    dict(sq=256, sk=1024, group=8, seqused=[1024, 517], flags=dict(causal=True)),
    dict(sq=512, sk=512, group=4, seqused=None, flags=dict(window_left=64, window_right=32)),
]


@pytest.mark.parametrize("case", FALLBACK_CASES, ids=str)
def test_disabled_fa4_falls_back_to_sdpa(monkeypatch, case):
    q, k, v = qkv(sq=case["sq"], sk=case["sk"], group=case["group"])
    used = None if case["seqused"] is None else torch.tensor(case["seqused"], dtype=torch.int32, device="cuda")
    flags = attention_flags(128, **case["flags"])
    monkeypatch.setenv(fa4.DISABLE_ENV, "1")
    switches.reset()
    name, why = attention_op.kernel_for(q, k, v, seqused_k=used, **flags)
    assert name == "sdpa" and fa4.DISABLE_ENV in why
    out, lse = ATTENTION(q, k, v, used, **flags)
    b, hq, sq, dv = out.shape
    assert out.stride() == (sq * hq * dv, dv, hq * dv, 1) and lse.dtype == torch.float32
    ref_out, ref_lse = reference.attention_forward(*float64(q, k, v), seqused_k=used, **flags)
    assert_fa_rule("out", out, ref_out, pytorch(q, k, v, used, **flags))
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-3)


def test_disabled_fa4_with_softcap_runs_the_reference(monkeypatch):
    q, k, v = qkv(sq=128, group=4)
    flags = attention_flags(128, softcap=30.0, scale=1.0)
    monkeypatch.setenv(fa4.DISABLE_ENV, "1")
    switches.reset()
    name, why = attention_op.kernel_for(q, k, v, **flags)
    assert name == "reference" and fa4.DISABLE_ENV in why and "softcap" in why
    out, _ = ATTENTION(q, k, v, **flags)
    ref_out, _ = reference.attention_forward(*float64(q, k, v), seqused_k=None, **flags)
    assert_fa_rule("out", out, ref_out, pytorch(q, k, v, **flags), softcap=30.0)


def test_reduce_overhead_replays_cuda_graphs_with_fa4():
    """`mode="reduce-overhead"` under our backend: Inductor's CUDA graphs take the fa4 op (no skip). The
    model is small enough for crossover.py to leave it on SDPA: the option turns that off."""
    from torch._dynamo.utils import counters

    from fa4_inductor.demo import Config, TinyLlama

    torch.manual_seed(0)
    model = TinyLlama(Config(attention="eager")).to(device="cuda", dtype=torch.bfloat16).eval()
    counters.clear()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=fa4_inductor.backend(small_calls_to_sdpa=False), mode="reduce-overhead")
    with torch.no_grad(), fa4_inductor.report.collecting() as records:
        for _ in range(3):  # warm-up run, recording, replay
            tokens = torch.randint(0, model.cfg.vocab, (2, 512), device="cuda")
            got = compiled(tokens).float()
            expected = model(tokens).float()
            assert ((got - expected).abs().max() / expected.abs().max()).item() < 2e-2
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert records and all(r.rewritten and r.detail.startswith("fa4.attention(") for r in records), records


def test_warmup_compiles_the_variant_calls_use():
    interface, _ = fa4._interface()
    caches = (interface._flash_attn_fwd.compile_cache, interface._flash_attn_bwd.compile_cache)
    flags = attention_flags(64, window_left=64, window_right=0)  # a variant no other test compiles
    fa4.warmup(torch.float16, 64, 64, group=8, window=(64, 0), device="cuda", with_backward=True)
    compiled = [len(c.cache) for c in caches]
    q, k, v = qkv(torch.float16, group=8, d=64, requires_grad=True)
    out, _ = ATTENTION(q, k, v, **flags)
    out.sum().backward()
    assert [len(c.cache) for c in caches] == compiled


def test_cuda_graph_capture_and_replay():
    flags = attention_flags(128, causal=True)
    fa4.warmup(torch.bfloat16, 128, 128, group=4, causal=True, device="cuda", seqused_k=True, with_backward=True)
    q, k, v = qkv(sq=256, sk=1024, group=4)
    dout = torch.randn(2, 256, HQ, 128, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    used = torch.tensor([1024, 1024], dtype=torch.int32, device="cuda")

    def step():
        out, lse = ATTENTION(q, k, v, used, **flags)
        return (out, lse, *BACKWARD(dout, q, k, v, out, lse, None, used, **flags))

    graph, static = capture(step)

    for lengths in ([1024, 700], [300, 1024]):
        for t, fresh in zip((q, k, v, dout), (*qkv(sq=256, sk=1024, group=4), torch.randn_like(dout))):
            t.copy_(fresh)
        used.copy_(torch.tensor(lengths))
        graph.replay()
        expected = step()
        for name, got, want in zip(("out", "lse"), static, expected):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
        for got, want in zip(static[2:], expected[2:]):  # dq accumulates with atomics: order varies
            torch.testing.assert_close(got, want)


REPLAY_CASES = [dict(causal=True), dict(), dict(window_left=64, window_right=0), dict(softcap=30.0, scale=1.0)]


@pytest.mark.parametrize("seqused", [False, True])
@pytest.mark.parametrize("mask", REPLAY_CASES, ids=str)
def test_replayed_launches_match_fa4s_entry_point(monkeypatch, mask, seqused):
    """The third call of a signature replays the recorded launch: same results, bit for bit."""
    flags = attention_flags(128, **mask)
    monkeypatch.setattr(fa4_replay, "_LAUNCHES", type(fa4_replay._LAUNCHES)())
    for _ in range(3):
        q, k, v = qkv(sq=300, sk=700, group=4)
        used = torch.tensor([700, 333], dtype=torch.int32, device="cuda") if seqused else None
        out, lse = ATTENTION(q, k, v, used, **flags)
    assert any(launch is not None for launch in fa4_replay._LAUNCHES.values()), "nothing was replayable"
    monkeypatch.setenv(fa4.NO_REPLAY_ENV, "1")
    switches.reset()
    want_out, want_lse = ATTENTION(q, k, v, used, **flags)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)


def key_mask_call_by_fa_rule(q, k, v, mask, flags):
    """`fa4::attention` with a key mask, forward and backward, by the FA rule against float64; (out, lse,
    the reference lse)."""
    out, lse = ATTENTION(q, k, v, None, mask, **flags)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64, dout64 = float64(q, k, v, dout)
    out64, lse64 = reference.attention_forward(q64, k64, v64, seqused_k=None, key_mask=mask, **flags)
    refs = reference.attention_backward(dout64, q64, k64, v64, out64, lse64, None, seqused_k=None, key_mask=mask,
                                        **flags)
    qp, kp, vp = (t.detach().requires_grad_() for t in (q, k, v))
    pt_out = eager(qp, kp, vp, None, mask, **flags)[0]
    assert_fa_rule("out", out, out64, pt_out)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, torch.autograd.grad(pt_out, (qp, kp, vp), dout)):
        assert_fa_rule(name, g, r, p, grad=True)
    return out, lse, lse64


@pytest.mark.parametrize("causal", [False, True])
def test_key_mask_forward_and_backward(causal, monkeypatch):
    """A padding mask as the op's key_mask on prefill shapes: one with left- and right-padded rows runs on the
    SDPA fallback, forward and recomputing backward, by the FA rule; an all-visible one is read on the host
    and runs FA4 (these shapes count as large here: kernels/crossover.py would keep them on SDPA unread)."""
    monkeypatch.setattr(crossover, "GFLOP_BELOW", ())
    q, k, v = qkv(b=3, sq=500, group=4, requires_grad=True)
    flags = attention_flags(128, causal=causal)
    mask = torch.ones(3, 500, dtype=torch.bool, device="cuda")
    mask[0, :123] = False  # left padding
    mask[1, 400:] = False  # right padding
    name, why = attention_op.kernel_for(q, k, v, mask, **flags)
    assert name == "sdpa" and "key mask" in why, why
    key_mask_call_by_fa_rule(q, k, v, mask, flags)

    ones = torch.ones(3, 500, dtype=torch.bool, device="cuda")
    fa4_launches = []
    real_forward = fa4.forward
    monkeypatch.setattr(fa4, "forward", lambda *a, **kw: fa4_launches.append(1) or real_forward(*a, **kw))
    out, _ = ATTENTION(q.detach(), k.detach(), v.detach(), None, ones, **flags)
    assert fa4_launches, "an all-visible key mask should have gone to FA4"
    ref_out, _ = reference.attention_forward(*float64(q, k, v), seqused_k=None, **flags)
    assert_fa_rule("out", out, ref_out, pytorch(q.detach(), k.detach(), v.detach(), **flags))


@pytest.mark.parametrize("side, flags_kind", [("left", "causal"), ("left", "window"), ("left", "none"),
                                             ("right", "causal"), ("right", "causal-softcap")])
def test_padding_runs_fa4_varlen(side, flags_kind, monkeypatch):
    """A left-padded key mask on a self-attention, or a right-padded one under a causal mask, goes to FA4 as
    varlen segments over the padded buffer (no copy of Q/K/V, no mask; right padding as two calls, the padding
    queries seeing every token): forward and backward by the FA rule, blind rows zeros with lse -inf."""
    monkeypatch.setattr(crossover, "GFLOP_BELOW", ())  # these shapes count as large here
    monkeypatch.setattr(attention_op, "RIGHT_PADDING_ON_FA4", True)
    b, s = 4, 500
    q, k, v = qkv(b=b, sq=s, group=4, requires_grad=True)
    flags = {"causal": attention_flags(128, causal=True), "window": attention_flags(128, window_left=64, window_right=0),
             "none": attention_flags(128), "causal-softcap": attention_flags(128, causal=True, softcap=30.0)}[flags_kind]
    positions = torch.arange(s, device="cuda")[None, :]
    if side == "left":
        starts = [0, 123, 499, s if flags_kind != "none" else 7]  # the last: all padding (under a band)
        mask = positions >= torch.tensor(starts, device="cuda")[:, None]
    else:
        mask = positions < torch.tensor([s, 377, 1, 250], device="cuda")[:, None]
    calls = []
    for name in ("forward_padded", "backward_padded"):
        real = getattr(fa4, name)
        monkeypatch.setattr(fa4, name, lambda *a, _real=real, _name=name, **kw: calls.append((_name, a[-2])) or
                            _real(*a, **kw))
    out, lse, lse64 = key_mask_call_by_fa_rule(q, k, v, mask, flags)
    assert calls == [("forward_padded", side), ("backward_padded", side)], calls
    blind = torch.isinf(lse64)
    assert torch.equal(torch.isinf(lse), blind) and (side == "left" or not blind.any())
    assert (out[blind] == 0).all()
    torch.testing.assert_close(lse[~blind], lse64[~blind].float(), atol=1e-3, rtol=1e-3)


def test_additive_static_prefill_mask_runs_fa4_with_eagers_blind_rows(monkeypatch):
    """Eager code's prefill mask over an empty static cache (`additive_masks_on_op`: [B, Sq, Sk] bfloat16 of 0 and
    finfo.min, left-padded): read on the host, it runs FA4 as left-padded varlen segments, and the rows that see no
    key get the mean of V over every slot, as eager's uniform softmax gives them; the backward runs on the SDPA
    fallback with the mask (its floor keeps those rows uniform). By the FA rule against float64."""
    monkeypatch.setattr(crossover, "GFLOP_BELOW", ())  # these shapes count as large here
    b, sq, d, capacity = 4, 500, 128, 1024
    q = qkv(b=b, sq=sq, group=4, requires_grad=True)[0]
    k, v = (torch.randn(b, HQ // 4, capacity, d, dtype=torch.bfloat16, device="cuda").requires_grad_()
            for _ in range(2))
    j = torch.arange(capacity, device="cuda")
    starts = torch.tensor([0, 123, 499, sq], device="cuda")  # the last: all padding
    visible = ((j[None, :] <= torch.arange(sq, device="cuda")[:, None])[None]
               & ((j >= starts[:, None]) & (j < sq))[:, None, :])
    mask = torch.zeros(visible.shape, dtype=torch.bfloat16, device="cuda").masked_fill(
        ~visible, torch.finfo(torch.bfloat16).min)
    calls = []
    real = fa4.forward_padded
    monkeypatch.setattr(fa4, "forward_padded", lambda *a, **kw: calls.append(kw["causal"]) or real(*a, **kw))
    out, lse, lse64 = key_mask_call_by_fa_rule(q, k, v, mask, attention_flags(d))
    assert calls == [True], calls
    blind = ~visible.any(-1)[:, None].expand_as(lse)
    assert blind.any() and lse.isfinite().all()
    torch.testing.assert_close(lse, lse64.float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("kind", ["static-prefill", "custom", "training", "sliding-window", "packed", "packed-window",
                                  "packed-left-padded"])
def test_per_query_mask_over_a_static_cache(kind, monkeypatch):
    """HF's prefill mask over an empty static cache ([B, Sq, Sk] key mask, left padding, slots from Sq on empty):
    read on the host, it runs FA4 as left-padded varlen segments over the cache's first Sq slots, causal, and the
    backward on the SDPA fallback with the mask; "training": Sq == Sk (the mask HF builds outside a compiled layer),
    FA4's backward too; "sliding-window": a sliding layer's prefill mask (Sq == Sk, each row its last 100 keys), FA4
    with the window, forward and backward; "packed": sequences back to back in each row, causal within each (HF's
    packed position_ids, Llama 4's chunks; `run_time_masks`), FA4 varlen forward and backward, a segment a sequence;
    "packed-window": the same within a window of 100 keys (a sliding layer's packed mask); "packed-left-padded": Llama 4's
    chunks of 128 left-padded (the pad rows see no key: gaps after the segments' used lengths); any other mask per
    query row runs on the SDPA fallback with its mask.
    Forward and backward by the FA rule; blind rows zeros with lse -inf."""
    monkeypatch.setattr(crossover, "GFLOP_BELOW", ())  # these shapes count as large here
    b, sq, d = 4, 500, 128
    capacity = sq if kind in ("training", "sliding-window") or kind.startswith("packed") else 1024
    q = qkv(b=b, sq=sq, group=4, requires_grad=True)[0]
    # K/V are the cache buffers, [B, Hkv, capacity, D] contiguous, prompt written in the first sq slots
    k, v = (torch.randn(b, HQ // 4, capacity, d, dtype=torch.bfloat16, device="cuda").requires_grad_()
            for _ in range(2))
    flags = attention_flags(d)
    j = torch.arange(capacity, device="cuda")
    starts = torch.tensor([0, 123, 499, sq], device="cuda")  # the last: all padding
    mask = ((j[None, :] <= torch.arange(sq, device="cuda")[:, None])[None]
            & ((j >= starts[:, None]) & (j < sq))[:, None, :])
    if kind == "custom":
        mask = mask | (torch.rand(b, sq, capacity, device="cuda") > 0.99)
    if kind == "sliding-window":
        mask = mask & (torch.arange(sq, device="cuda")[:, None] - j[None, :] < 100)
    if kind.startswith("packed"):
        ids = torch.stack([torch.bucketize(j, torch.tensor(bounds, device="cuda", dtype=torch.long), right=True)
                           for bounds in ([123, 499], [250], [1, 2, 3, 300], [])])
        if kind == "packed-left-padded":
            ids = (j // 128).expand(b, -1)
        mask = (ids[:, :, None] == ids[:, None, :]) & (j[None, :] <= j[:, None])[None]
        if kind == "packed-window":
            mask = mask & (j[:, None] - j[None, :] < 100)[None]
        if kind == "packed-left-padded":
            mask = mask & (j >= starts[:, None])[:, None, :]
    calls = []
    for name in ("forward_padded", "backward_padded"):
        real = getattr(fa4, name)
        monkeypatch.setattr(fa4, name, lambda *a, _real=real, _name=name, **kw: calls.append((_name, kw["causal"]))
                            or _real(*a, **kw))
    out, lse, lse64 = key_mask_call_by_fa_rule(q, k, v, mask, flags)
    expected = {"static-prefill": [("forward_padded", True)], "custom": [],
                "training": [("forward_padded", True), ("backward_padded", True)],
                "sliding-window": [("forward_padded", True), ("backward_padded", True)],
                "packed": [("forward_padded", True), ("backward_padded", True)],
                "packed-window": [("forward_padded", True), ("backward_padded", True)],
                "packed-left-padded": [("forward_padded", True), ("backward_padded", True)]}[kind]
    assert calls == expected, calls
    blind = torch.isinf(lse64)
    assert torch.equal(torch.isinf(lse), blind) and (kind in ("custom", "packed", "packed-window") or blind.any())
    assert (out[blind] == 0).all()
    torch.testing.assert_close(lse[~blind], lse64[~blind].float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("sq, sk", [(1, 128), (64, 64)], ids=["one-query", "self"])
def test_key_masks_built_in_graph_under_cuda_graph_trees(sq, sk, monkeypatch):
    """A padding mask computed inside a `reduce-overhead` graph lives in the CUDA-graph pool; reading its form
    (key_mask_form) must keep none of it past the graph (the trees refuse such a tensor)."""
    monkeypatch.setattr(crossover, "GFLOP_BELOW", ())  # read the form of these small calls too
    def attend(q, k, v, lengths):
        keep = torch.arange(k.shape[2], device=q.device)[None, :] >= (k.shape[2] - lengths)[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])

    torch._dynamo.reset()
    compiled = torch.compile(attend, backend=fa4_inductor.backend(small_calls_to_sdpa=False), mode="reduce-overhead")
    lengths = torch.tensor([sk, sk // 3], device="cuda")
    with torch.no_grad():
        for _ in range(4):  # warm-up, recording, replays
            q, k, v = (torch.randn(2, 4, s, 64, device="cuda", dtype=torch.bfloat16) for s in (sq, sk, sk))
            got = compiled(q, k, v, lengths).float()
            expected = attend(*(t.float() for t in (q, k, v)), lengths)
            assert got.isfinite().all() and (got - expected).abs().max().item() < 2e-2


def test_eager_codes_rows_that_see_no_key_in_training(monkeypatch):
    """Eager code's left-padded finfo.min mask in training (lowering: the op with the key mask, then
    `blind_rows_as_eagers`): rows that see no key are the mean of V and get eager's softmax gradient to q and k; the
    op's own backward (FA4 varlen or the SDPA fallback) gives them none. Output and gradients by the FA rule against
    HF's eager attention in float64, PyTorch's in bfloat16."""
    from fa4_inductor.kernels.attention import blind_rows_as_eagers

    monkeypatch.setattr(crossover, "GFLOP_BELOW", ())
    q, k, v = qkv(b=3, sq=500, group=4, requires_grad=True)
    flags = attention_flags(128, causal=True)
    mask = torch.ones(3, 500, dtype=torch.bool, device="cuda")
    mask[0, :123] = False
    mask[2, :499] = False  # one real token

    def eager_code(q, k, v):  # HF's: the model dtype's finfo.min, a float32 softmax (float64 for the reference)
        group = q.shape[1] // k.shape[1]
        scores = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * flags["scale"]
        allowed = torch.ones(500, 500, dtype=torch.bool, device="cuda").tril()[None, None] & mask[:, None, None, :]
        scores = scores + torch.zeros_like(scores[:, :1]).masked_fill(~allowed, torch.finfo(torch.bfloat16).min)
        softmax_dtype = torch.promote_types(q.dtype, torch.float32)
        return torch.softmax(scores, -1, dtype=softmax_dtype).to(q.dtype) @ v.repeat_interleave(group, 1)

    out = blind_rows_as_eagers(*ATTENTION(q, k, v, None, mask, **flags), q, k, v, flags["scale"])
    assert_fa_rule_with_gradients(out, torch.randn_like(out), (q, k, v), eager_code, ("dq", "dk", "dv"))


@pytest.mark.parametrize("sq", [1, 777])
def test_attention_sinks_compiled(sq):
    """GPT-OSS's sinks compiled by the backend (lowering: the op's out * sigmoid(lse - sink)): a left-padded causal
    prefill as HF's eager code masks it (FA4 varlen, rows that see no key 0 as the sink takes their weight; FA4's
    backward through lse gives the sinks' gradient), and one query over all the keys (decode shape). Output and
    gradients by the FA rule against the same code in float64, PyTorch's in bfloat16."""
    import fa4_inductor

    q, k, v = qkv(b=2, sq=sq, sk=777, group=2, d=64, requires_grad=True)
    sinks = torch.randn(HQ, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    attention_mask = torch.ones(2, 777, dtype=torch.long, device="cuda")
    attention_mask[1, :300] = 0

    def gpt_oss(q, k, v, sinks, attention_mask):
        group = q.shape[1] // k.shape[1]
        scores = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * 0.125
        if scores.shape[-2] > 1:
            n = scores.shape[-1]
            visible = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()[None, None] \
                & attention_mask.bool()[:, None, None, :]
            scores = scores + torch.zeros(visible.shape, dtype=scores.dtype, device="cuda").masked_fill(
                ~visible, torch.finfo(scores.dtype).min)
        c = torch.cat([scores, sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)], dim=-1)
        c = c - c.max(dim=-1, keepdim=True).values
        p = torch.softmax(c, dim=-1, dtype=torch.promote_types(c.dtype, torch.float32))[..., :-1].to(v.dtype)
        return p @ v.repeat_interleave(group, 1)

    torch._dynamo.reset()
    out = torch.compile(gpt_oss, backend=fa4_inductor.backend(), fullgraph=True)(q, k, v, sinks, attention_mask)
    assert_fa_rule_with_gradients(out, torch.randn_like(out), (q, k, v, sinks),
                                  lambda *leaves: gpt_oss(*leaves, attention_mask), ("dq", "dk", "dv", "dsinks"))


def test_eager_codes_packed_training_mask_on_fa4(monkeypatch):
    """Eager code's packed training mask (0 and finfo.min per query row, HF's from `position_ids` restarts), with
    left padding in one sequence: FA4 varlen forward and backward (the op reads the mask on the host), rows that see
    no key given eager's value (the mean of V) and gradient (`blind_rows_gradients`). Output and gradients by the FA
    rule against the same code in float64, PyTorch's in bfloat16."""
    monkeypatch.setattr(crossover, "GFLOP_BELOW", ())
    calls = []
    for name in ("forward_padded", "backward_padded"):
        monkeypatch.setattr(fa4, name, lambda *a, _run=getattr(fa4, name), _name=name, **kw:
                            calls.append(_name) or _run(*a, **kw))
    s = 600
    segment = torch.cat([torch.full((n,), i) for i, n in enumerate((200, 250, 150))]).cuda()
    padded = torch.cat([torch.full((100,), -1), torch.full((300,), 0), torch.full((200,), 1)]).cuda()
    causal = torch.ones(s, s, dtype=torch.bool, device="cuda").tril()
    visible = torch.stack([(ids[:, None] == ids[None, :]) & (ids[None, :] >= 0) & causal for ids in (segment, padded)])
    mask = torch.zeros(2, s, s, dtype=torch.bfloat16, device="cuda").masked_fill(~visible, torch.finfo(torch.bfloat16).min)
    q, k, v = qkv(b=2, sq=s, group=2, d=64, requires_grad=True)
    flags = attention_flags(64)

    def eager_code(q, k, v):
        group = q.shape[1] // k.shape[1]
        scores = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * flags["scale"] + mask[:, None].to(q.dtype)
        softmax_dtype = torch.promote_types(q.dtype, torch.float32)
        return torch.softmax(scores, -1, dtype=softmax_dtype).to(q.dtype) @ v.repeat_interleave(group, 1)

    out, _ = ATTENTION(q, k, v, None, mask, **flags)
    assert_fa_rule_with_gradients(out, torch.randn_like(out), (q, k, v), eager_code, ("dq", "dk", "dv"))
    assert calls == ["forward_padded", "backward_padded"], calls


def test_attention_dropout_in_training_runs_sdpas_dropout():
    """Hand-written causal attention with dropout on its weights, training, compiled by the backend: one SDPA call
    with dropout_p (lowering `_dropout_rewrite`), so PyTorch's fused kernel draws the mask. Averaged over 64 calls
    the output and q's gradient come to the attention without dropout (dropout keeps the expectation), within
    8 standard errors of the per-call spread."""
    from fa4_inductor import report

    q, k, v = qkv(b=1, sq=256, group=1, d=64, requires_grad=True)

    def attend(q, k, v, p):
        s = (q @ k.transpose(-1, -2) * 0.125).masked_fill(
            torch.ones(256, 256, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        return F.dropout(s.softmax(-1), p=p, training=True) @ v

    torch._dynamo.reset()
    with report.collecting() as records:
        compiled = torch.compile(lambda q, k, v: attend(q, k, v, 0.1), backend=fa4_inductor.backend(), fullgraph=True)
        compiled(q, k, v)
    assert any("dropout_p=0.1" in r.detail for r in records), [r.detail for r in records]
    g = torch.randn_like(q)
    outs, grads = [], []
    for _ in range(64):
        out = compiled(q, k, v)
        outs.append(out.detach().float())
        grads.append(torch.autograd.grad(out, q, g)[0].float())
    want = attend(q, k, v, 0.0)
    want_grad = torch.autograd.grad(want, q, g)[0].float()
    for samples, expected in ((torch.stack(outs), want.detach().float()), (torch.stack(grads), want_grad)):
        error = (samples.mean(0) - expected).abs()
        assert (error <= samples.std(0) + 2e-2 * expected.abs().max()).all(), error.max()  # std: 8 standard errors
