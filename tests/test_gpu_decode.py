"""GPU tier: the split-KV decode kernel (`kernels/decode.py`), run with `pytest -m gpu` on an sm90 GPU.

Numerics follow FlashAttention's rule against the float64 reference (`kernels/reference.py`): our
max abs error is at most 2x PyTorch's own error in the same dtype, plus 1e-5. PyTorch's own is the
same attention as eager ops in the input dtype (SDPA's causal mask is top-left aligned, ours
bottom-right, so SDPA cannot express decode with a causal Sq > 1). Softcap gets 3x (tanh.approx).
Inputs are fresh random tensors: odd cache lengths, lengths that are not a multiple of the
16-key tile, cache lengths that differ across the batch (including 0 and 1), split counts from 1
to 64 (most splits empty for short sequences), and non-finite garbage past seqused_k.
"""

import pytest
import torch

import fa4_inductor
from fa4_inductor import hf
from fa4_inductor.kernels import attention as attention_op
from fa4_inductor.kernels import decode, reference, switches
from gpu_helpers import (additive_key_mask, assert_fa_rule, eager, flags, padding_key_mask, replays,
                         sm90_decode_setup)
from helpers import Recorder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ATTENTION = torch.ops.fa4.attention.default


@pytest.fixture(autouse=True)
def sm90(monkeypatch):
    sm90_decode_setup(monkeypatch, decode.DISABLE_ENV, switches.DECODE_EVERYWHERE)


def allow_head_dim(monkeypatch, d):
    """Head dim 96 compiles but is not routed until these tests pass on a GPU (`decode.HEAD_DIMS`)."""
    if d not in decode.HEAD_DIMS:
        monkeypatch.setattr(decode, "HEAD_DIMS", decode.HEAD_DIMS + (d,))


def make_inputs(dtype=torch.bfloat16, b=2, hkv=2, group=4, sq=1, sk=1000, d=128, layout="hf"):
    """q [B, Hq, Sq, D]; k, v [B, Hkv, Sk, D] as an HF static cache ("bhsd": contiguous) or as
    transposed views of [B, S, H, D] ("hf")."""
    hq = hkv * group
    q = torch.randn(b, sq, hq, d, dtype=dtype, device="cuda").transpose(1, 2)
    if layout == "bhsd":
        k = torch.randn(b, hkv, sk, d, dtype=dtype, device="cuda")
        v = torch.randn(b, hkv, sk, d, dtype=dtype, device="cuda")
    else:
        k = torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda").transpose(1, 2)
        v = torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda").transpose(1, 2)
    return q, k, v


def check(q, k, v, seqused_k=None, splits=None, via_op=False, key_mask=None, kernel="decode", **fl):
    """Run the decode kernel (directly, or through fa4::attention asserting it dispatches to `kernel`)
    and compare out / lse with the float64 reference."""
    if via_op:
        name, why = attention_op.kernel_for(q, k, v, key_mask, seqused_k=seqused_k, **fl)
        assert name == kernel, why
        out, lse = ATTENTION(q, k, v, seqused_k, key_mask, **fl)
    else:
        assert decode.unsupported_reason(q, k, v, seqused_k=seqused_k, key_mask=key_mask, **fl) is None
        out, lse = decode.forward(q, k, v, seqused_k, key_mask, splits=splits, **fl)
    b, hq, sq, dv = out.shape
    assert out.dtype == q.dtype and out.stride() == (sq * hq * dv, dv, hq * dv, 1)
    assert lse.dtype == torch.float32 and lse.shape == (b, hq, sq) and lse.is_contiguous()
    # Keys past seqused_k may hold anything: the reference must not see them either.
    ref_out, ref_lse = reference.attention_forward(q.double(), k.double().nan_to_num(0.0), v.double().nan_to_num(0.0),
                                                   seqused_k=seqused_k, key_mask=key_mask, **fl)
    k_clean, v_clean = k.nan_to_num(0.0), v.nan_to_num(0.0)
    assert_fa_rule("out", out, ref_out, eager(q, k_clean, v_clean, seqused_k, key_mask, **fl)[0], fl["softcap"])
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-3 + fl["softcap"] * 2 ** -9)
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 4, 8, 16])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_single_token(dtype, d, group, causal, monkeypatch):
    allow_head_dim(monkeypatch, d)
    check(*make_inputs(dtype, group=group, d=d, sk=1000), **flags(d, causal))


@pytest.mark.parametrize("sq", [2, 3, 4, 8])
@pytest.mark.parametrize("group", [1, 2, 4, 16])  # 16 x 8 = 128 packed rows: eight row tiles
def test_several_query_tokens_causal(sq, group):
    check(*make_inputs(group=group, sq=sq, sk=777), **flags(128, causal=True))


@pytest.mark.parametrize("sk", [1, 15, 16, 17, 100, 517, 4097, 32768 + 5])
@pytest.mark.parametrize("splits", [None, 1, 3, 64])
def test_cache_lengths_and_split_counts(sk, splits):
    check(*make_inputs(b=1, group=4, sq=2, sk=sk), splits=splits, **flags(128, causal=True))


@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("splits", [33, 65, 100, 128])
def test_combine_passes(d, splits, monkeypatch):
    """The combine loads SLOTS splits a thread in one pass (`decode_combine.load_pass`: 128, 80, 64 and 32 splits a
    pass at head dim 64, 96, 128 and 256): counts past one pass, and up to MAX_SPLITS, take further passes."""
    allow_head_dim(monkeypatch, d)
    check(*make_inputs(b=2, group=4, sq=1, sk=splits * 16 * 3 + 5, d=d), splits=splits, **flags(d, causal=True))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["hf", "bhsd"])
@pytest.mark.parametrize("splits", [None, 1, 16, 64])
def test_seqused_k_differs_across_the_batch(causal, layout, splits):
    q, k, v = make_inputs(b=5, group=4, sq=4, sk=2048, layout=layout)
    used = torch.tensor([2048, 1000, 17, 1, 0], dtype=torch.int32, device="cuda")
    # what sits past the used length is garbage, possibly non-finite: it must never reach the output
    for t in (k, v):
        for i, n in enumerate(used.tolist()):
            t[i, :, n:] = float("nan")
    check(q, k, v, used, splits=splits, **flags(128, causal))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq", [1, 3])
@pytest.mark.parametrize("splits", [None, 1, 7])
def test_key_mask(causal, sq, splits):
    """A padding mask on top of seqused_k (HF generate with a static cache): rows of the all-hidden
    sequence get zeros and lse -inf, like every row that sees no key."""
    q, k, v = make_inputs(b=4, group=4, sq=sq, sk=2003, layout="bhsd")
    used = torch.tensor([2003, 1500, 700, 2003], dtype=torch.int32, device="cuda")
    mask = padding_key_mask(4, 2003)
    out, lse = check(q, k, v, used, splits=splits, key_mask=mask, **flags(128, causal))
    assert (lse[-1] == float("-inf")).all() and (out[-1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("splits", [None, 1, 7])
def test_additive_key_mask(dtype, softcap, splits):
    """Eager code's mask input ([B, Sk] in q's dtype, added to the scores; `backend(additive_masks_on_op=True)`):
    random values, finfo.min on padded keys, one sequence seeing only its last key; through the op too."""
    q, k, v = make_inputs(dtype=dtype, b=4, group=4, sq=1, sk=2003, layout="bhsd")
    mask = additive_key_mask(4, 2003, dtype)
    fl = flags(128, softcap=softcap)
    check(q, k, v, splits=splits, key_mask=mask, **fl)
    if splits is None:
        check(q, k, v, key_mask=mask, via_op=True, **fl)


def minus_inf_key_mask(b, sk, dtype=torch.bfloat16):
    """A [b, sk] additive mask with -inf: on a third of sequence 0's keys (the rest random), on every key of
    sequence 1, on sequence 2's even keys with finfo.min on its odd ones, and on a hole of sequence 3's."""
    g = torch.Generator().manual_seed(1)
    mask = torch.randn(b, sk, generator=g) * 2
    mask[0, : sk // 3] = float("-inf")
    mask[1] = float("-inf")
    mask[2, 0::2], mask[2, 1::2] = float("-inf"), torch.finfo(dtype).min
    mask[3, sk // 2: sk // 2 + 40] = float("-inf")
    return mask.to(dtype).cuda()


@pytest.mark.parametrize("make_mask", [additive_key_mask, minus_inf_key_mask], ids=["finfo_min", "minus_inf"])
def test_additive_key_mask_on_the_sdpa_fallback_for_prefill(make_mask):
    q, k, v = make_inputs(b=4, group=4, sq=300, sk=300)
    mask = make_mask(4, 300, torch.bfloat16)
    fl = flags(128, causal=True)
    name, why = attention_op.kernel_for(q, k, v, mask, **fl)
    assert name == "sdpa", why
    out, _ = ATTENTION(q, k, v, None, mask, **fl)
    ref_out, _ = reference.attention_forward(q.double(), k.double(), v.double(), seqused_k=None, key_mask=mask, **fl)
    assert_fa_rule("out", out, ref_out, eager(q, k, v, None, mask, **fl)[0])


@pytest.mark.parametrize("splits", [None, 1, 7])
def test_minus_inf_in_an_additive_key_mask(splits):
    """-inf in an additive key mask hides its key on the decode kernel, as eager's softmax weighs it 0: next to finite
    keys, next to finfo.min keys only (that row is the mean of V over its finfo.min keys) and on every key (zeros, lse
    -inf). The SDPA fallback's prefill: `test_additive_key_mask_on_the_sdpa_fallback_for_prefill`."""
    mask = minus_inf_key_mask(4, 2003)
    q, k, v = make_inputs(b=4, group=4, sq=1, sk=2003, layout="bhsd")
    fl = flags(128)
    out, lse = decode.forward(q, k, v, None, mask, splits=splits, **fl)
    ref_out, _ = reference.attention_forward(q.double(), k.double(), v.double(), seqused_k=None, key_mask=mask, **fl)
    assert_fa_rule("out", out, ref_out, eager(q, k, v, None, mask, **fl)[0])
    assert (out[1] == 0).all() and (lse[1] == float("-inf")).all()


def test_a_float_mask_input_hiding_every_key_of_a_row_compiles_to_eagers_nan():
    """A hand-written softmax whose float mask input is -inf on every key of some rows: compiled, those rows are NaN
    as in eager, the others eager's (float64), on each path the rewrite takes: the op for a decode step's [B, 1, 1,
    Sk] mask and a prefill's [1, 1, Sq, Sk] one, SDPA with the floored mask for a [Sq, Sk] one."""
    def attend(q, k, v, m):
        return torch.softmax(q @ k.mT * 128 ** -0.5 + m, -1) @ v

    one_row = minus_inf_key_mask(4, 2003)[:, None, None]
    per_query = minus_inf_key_mask(300, 300)[None, None]
    for m, sq, sk in ((one_row, 1, 2003), (per_query, 300, 300), (per_query[0, 0], 300, 300)):
        torch._dynamo.reset()
        q, k, v = (torch.randn(4, 8, s, 128, dtype=torch.bfloat16, device="cuda") for s in (sq, sk, sk))
        recorder = Recorder(inductor=True)
        out = torch.compile(attend, backend=recorder)(q, k, v, m)
        assert [r.rewritten for r in recorder.records] == [True], recorder.records
        want = attend(q.double(), k.double(), v.double(), m.double())
        assert want.isnan().any()
        torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2, equal_nan=True)


def test_key_mask_through_the_op_and_the_sdpa_fallback_for_prefill():
    q, k, v = make_inputs(b=4, group=4, sq=1, sk=4096)
    check(q, k, v, key_mask=padding_key_mask(4, 4096), via_op=True, **flags(128, causal=True))
    q, k, v = make_inputs(b=8, group=4, sq=1, sk=147)  # a short cache (generate's first steps): still ours
    check(q, k, v, key_mask=padding_key_mask(8, 147), via_op=True, **flags(128, causal=True))
    q, k, v = make_inputs(b=4, group=4, sq=300, sk=300)  # prefill-shaped: FA4 takes no key mask
    mask = padding_key_mask(4, 300)
    fl = flags(128, causal=True)
    name, why = attention_op.kernel_for(q, k, v, mask, **fl)
    assert name == "sdpa" and "key mask" in why, why
    out, _ = ATTENTION(q, k, v, None, mask, **fl)
    ref_out, _ = reference.attention_forward(q.double(), k.double(), v.double(), seqused_k=None, key_mask=mask, **fl)
    assert_fa_rule("out", out, ref_out, eager(q, k, v, None, mask, **fl)[0])


def test_seqused_k_shorter_than_query():
    """Causal rows before the first key (Sq > seqused_k) see nothing: zeros and lse = -inf."""
    q, k, v = make_inputs(b=2, group=2, sq=8, sk=600)
    used = torch.tensor([3, 600], dtype=torch.int32, device="cuda")
    out, lse = check(q, k, v, used, **flags(128, causal=True))
    assert (lse[0, :, :5] == float("-inf")).all() and (out[0, :, :5] == 0).all()


def test_combine_without_pdl(monkeypatch):
    monkeypatch.setenv(decode.PDL_ENV, "0")
    switches.reset()
    check(*make_inputs(b=2, group=4, sq=1, sk=3000), splits=12, **flags(128, causal=True))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_softcap(dtype, causal):
    # scale 1 puts scores where tanh bends: a dropped softcap would show
    check(*make_inputs(dtype, group=8, sq=2, sk=3000), **flags(128, causal, softcap=30.0, scale=1.0))


@pytest.mark.parametrize("d, softcap", [(128, 0.0), (256, 50.0)])
@pytest.mark.parametrize("sq", [1, 2])
def test_a_sliding_window_cache_step_runs_the_decode_kernel(d, softcap, sq):
    """A decode step over HF's sliding-window cache (Mistral, Gemma 2 / 3: as many slots as the window, window_left =
    slots - 1): the window hides no slot, so fa4::attention sends it to the decode kernel without it
    (`attention.device_flags`); outputs as the float64 reference's with the window. Used lengths below and at the
    slots, garbage past them."""
    q, k, v = make_inputs(b=3, hkv=4, group=2, sq=sq, sk=1024, d=d)
    used = torch.tensor([1024, 700, sq], dtype=torch.int32, device="cuda")
    for t in (k, v):
        for i, n in enumerate(used.tolist()):
            t[i, :, n:] = float("nan")
    check(q, k, v, used, via_op=True, **dict(flags(d, causal=True, softcap=softcap), window_left=1023))


def test_issue_shape_through_the_op(monkeypatch):
    """hq32 hkv8 d128, one token against a 32k cache: with per-sequence lengths fa4::attention sends it
    to the decode kernel; with one length for the batch to cuDNN SDPA (faster there), or to the
    decode kernel under FA4_INDUCTOR_DECODE_EVERYWHERE=1."""
    q, k, v = make_inputs(b=1, hkv=8, group=4, sq=1, sk=32768, layout="bhsd")
    used = torch.tensor([12345], dtype=torch.int32, device="cuda")
    check(q, k, v, used, via_op=True, **flags(128, causal=True))
    check(q, k, v, via_op=True, kernel="sdpa_cudnn", **flags(128, causal=True))
    monkeypatch.setenv(switches.DECODE_EVERYWHERE, "1")
    switches.reset()
    check(q, k, v, via_op=True, **flags(128, causal=True))


@pytest.mark.parametrize("b, hkv, group, sq, sk, d, causal", [
    (1, 8, 4, 1, 4096, 128, True), (3, 2, 8, 1, 1000, 64, False), (2, 4, 2, 4, 2049, 128, False),
    (1, 1, 16, 1, 777, 64, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fixed_length_decode_runs_cudnn_sdpa(dtype, b, hkv, group, sq, sk, d, causal):
    """Decode-shaped calls with one cache length go to cuDNN SDPA through the op: out in the op's
    layout, lse [B, Hq, Sq] natural log, both against the float64 reference (HF's transposed views)."""
    q, k, v = make_inputs(dtype, b=b, hkv=hkv, group=group, sq=sq, sk=sk, d=d)
    check(q, k, v, via_op=True, kernel="sdpa_cudnn", **flags(d, causal))


def test_dispatch_rule():
    q, k, v = make_inputs(b=1, hkv=8, group=4, sq=1, sk=4096)
    used = torch.tensor([4000], dtype=torch.int32, device="cuda")
    mask = torch.ones(1, 4096, dtype=torch.bool, device="cuda")
    assert attention_op.kernel_for(q, k, v, seqused_k=used, **flags(128, causal=True))[0] == "decode"
    assert attention_op.kernel_for(q, k, v, mask, **flags(128, causal=True))[0] == "decode"
    assert attention_op.kernel_for(q, k, v, **flags(128, causal=True))[0] == "sdpa_cudnn"
    assert attention_op.kernel_for(q, k, v, **flags(128, softcap=30.0))[0] == "decode"
    q, k, v = make_inputs(b=1, hkv=8, group=4, sq=2, sk=4096)  # causal Sq > 1: bottom-right, ours
    assert attention_op.kernel_for(q, k, v, **flags(128, causal=True))[0] == "decode"
    q, k, v = make_inputs(b=1, hkv=8, group=4, sq=1, sk=4096, d=256)  # head dim 256: ours
    assert attention_op.kernel_for(q, k, v, **flags(256, causal=True))[0] == "decode"
    q, k, v = make_inputs(b=8, hkv=8, group=4, sq=1, sk=768)  # B * Hkv = 64 below 1024 keys: FA4's
    used8 = used.expand(8).contiguous()
    assert attention_op.kernel_for(q, k, v, seqused_k=used8, **flags(128, causal=True))[0] == "fa4"
    q, k, v = make_inputs(b=8, hkv=8, group=4, sq=1, sk=1024)
    assert attention_op.kernel_for(q, k, v, seqused_k=used8, **flags(128, causal=True))[0] == "decode"
    q, k, v = make_inputs(b=1, hkv=8, group=4, sq=8, sk=4096)  # 32 packed rows: FA4's
    assert attention_op.kernel_for(q, k, v, seqused_k=used, **flags(128, causal=True))[0] not in ("decode", "sdpa_cudnn")
    q, k, v = make_inputs(b=1, hkv=8, group=4, sq=1, sk=256)  # short cache: FA4's
    assert attention_op.kernel_for(q, k, v, seqused_k=used, **flags(128, causal=True))[0] not in ("decode", "sdpa_cudnn")
    short_mask = torch.ones(1, 256, dtype=torch.bool, device="cuda")  # unless a key mask: FA4 takes none
    assert attention_op.kernel_for(q, k, v, short_mask, **flags(128, causal=True))[0] == "decode"
    q, k, v = make_inputs(b=1, hkv=8, group=4, sq=1, sk=4096)
    windowed = dict(flags(128, causal=True), window_left=128)
    assert attention_op.kernel_for(q, k, v, seqused_k=used, **windowed)[0] not in ("decode", "sdpa_cudnn")


def test_misaligned_cache_is_declined():
    q, _, _ = make_inputs(b=1, hkv=2, group=4, sk=1024)
    flat = torch.randn(1 * 2 * 1024 * 128 + 1, dtype=q.dtype, device="cuda")
    k = flat[1:].view(1, 2, 1024, 128)
    assert "16-byte" in decode.unsupported_reason(q, k, k, **flags(128))


def test_disable_env(monkeypatch):
    q, k, v = make_inputs(b=1, hkv=8, group=4, sq=1, sk=4096)
    monkeypatch.setenv(decode.DISABLE_ENV, "1")
    switches.reset()
    assert decode.DISABLE_ENV in decode.dispatch_reason(q, k, v, **flags(128, causal=True))
    assert attention_op.kernel_for(q, k, v, **flags(128, causal=True))[0] != "decode"


def test_warmup_then_no_compile():
    decode.warmup(torch.bfloat16, 128, 4, q_len=1, device="cuda", causal=True, seqused_k=True)
    compiled = decode.compile_cache_info()
    q, k, v = make_inputs(b=1, hkv=2, group=4, sk=4096)
    used = torch.tensor([3000], dtype=torch.int32, device="cuda")
    decode.forward(q, k, v, used, splits=1, **flags(128, causal=True))
    decode.forward(q, k, v, used, splits=8, **flags(128, causal=True))
    assert decode.compile_cache_info() == compiled


def check_replays(splits, lengths=([4096, 700, 1], [0, 4095, 2049])):
    """Capture a decode step (3 sequences of up to 4096 keys, two query tokens of a group of 4, causal) once; change
    q / k / v contents and seqused_k between replays: each replay equals a fresh call bit for bit (`replays`) and the
    float64 reference by the FA rule."""
    fl = flags(128, causal=True)
    decode.warmup(torch.bfloat16, 128, 4, q_len=2, device="cuda", causal=True, seqused_k=True)
    q, k, v = make_inputs(b=3, hkv=2, group=4, sq=2, sk=4096, layout="bhsd")
    used = torch.tensor([4096, 4096, 4096], dtype=torch.int32, device="cuda")

    def step():
        return decode.forward(q, k, v, used, splits=splits, **fl)

    def fresh():
        return make_inputs(b=3, hkv=2, group=4, sq=2, sk=4096, layout="bhsd")

    for _, static_out, static_lse in replays(step, (q, k, v), used, fresh, lengths):
        ref_out, ref_lse = reference.attention_forward(q.double(), k.double(), v.double(), seqused_k=used, **fl)
        assert_fa_rule("out", static_out, ref_out, eager(q, k, v, used, **fl)[0])
        torch.testing.assert_close(static_lse.double(), ref_lse, rtol=0, atol=1e-3)


@pytest.mark.parametrize("splits", [None, 1])
def test_cuda_graph_replay_with_changing_cache_lengths(splits):
    """Each replay of a captured call equals a fresh one (the kernels use no atomics) and the reference."""
    check_replays(splits, ([4096, 700, 1], [0, 4095, 2049], [33, 17, 4000]))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("splits", [2, 16, 33, 65, 128])
def test_fused_combine(fused_combine, d, splits):
    """FA4_INDUCTOR_DECODE_FUSED_COMBINE: the last split CTA of each (batch, row tile) merges the splits
    (`SplitKVMerge.combine_if_last`): the float64 reference by the FA rule at split counts up to MAX_SPLITS (passes of
    COMBINE_SLOTS), another count over the same counters next, every counter back at zero after each call."""
    q, k, v = make_inputs(b=2, group=4, sq=2, sk=splits * 48 + 5, d=d)
    for n in (splits, max(2, splits // 3)):
        check(q, k, v, splits=n, **flags(d, causal=True))
        torch.cuda.synchronize()
        assert not any(t.any() for t in fused_combine())


def test_fused_combine_under_cuda_graph_replay(fused_combine):
    """Captured with the fused combine (its counters made in the warm-up run, outside capture): each replay equals a
    fresh call bit for bit (the last CTA sums the splits in a fixed order, whichever CTA it is) and the reference."""
    check_replays(24)
    assert not any(t.any() for t in fused_combine())


def test_bench_entry_point_runs():
    from fa4_inductor.bench import decode_kernel_comparison

    result = decode_kernel_comparison(b=1, sk=4096, hq=32, hkv=8, d=128, graphs=True, seqused=True)
    assert result["decode_ms"] > 0 and result["sdpa_ms"] > 0
    assert result["max_abs_diff_vs_sdpa"] < 2e-2


@pytest.mark.parametrize("attention_mask", [False, True], ids=["no-mask", "generate-mask"])
def test_llama_static_cache_decode_runs_the_decode_kernel(monkeypatch, attention_mask):
    """A Llama-style HF model (head dim 128, 4 query / 1 KV heads), compiled with our backend under
    `mode="reduce-overhead"`, decodes from a static cache through the decode kernel (with generate's
    attention mask: as its key_mask); its logits are judged like the kernels: error against the
    float32 model at most 2x bf16 eager's, plus 1e-3."""
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    config = LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=128, attn_implementation="sdpa")
    reference_model = LlamaForCausalLM(config).cuda().eval()
    model = LlamaForCausalLM(config).cuda().eval().to(torch.bfloat16)
    model.load_state_dict(reference_model.state_dict())
    calls = []
    real_forward = decode.forward
    monkeypatch.setattr(decode, "forward", lambda *a, **kw: calls.append(1) or real_forward(*a, **kw))
    prompt = torch.randint(0, 512, (1, 600), device="cuda")
    steps = torch.randint(0, 512, (1, 6), device="cuda")

    def run(m, compile_backend=None):
        cache = {hf.cache_keyword(m): StaticCache(config=config, max_cache_len=1024)}

        def step(token, position, mask):
            return m(token, position_ids=position, **cache, use_cache=True, attention_mask=mask).logits[:, -1]

        fn = torch.compile(step, backend=compile_backend, mode="reduce-overhead", fullgraph=True) \
            if compile_backend else step
        m(prompt, position_ids=torch.arange(600, device="cuda")[None], **cache, use_cache=True)
        logits = []
        for i in range(steps.shape[1]):  # generate's mask: ones over the tokens so far
            mask = torch.ones(1, 600 + i + 1, dtype=torch.long, device="cuda") if attention_mask else None
            logits.append(fn(steps[:, i:i + 1].clone(), torch.tensor([[600 + i]], device="cuda"), mask).float().clone())
        return torch.stack(logits)

    torch._dynamo.reset()
    with torch.no_grad():
        expected = run(reference_model)
        bf16_eager = run(model)
        ours = run(model, fa4_inductor.backend(small_calls_to_sdpa=False))  # small: lowering keeps SDPA otherwise
    assert len(calls) >= config.num_hidden_layers, "the decode kernel never ran"
    our_error = (ours - expected).abs().max().item()
    eager_error = (bf16_eager - expected).abs().max().item()
    assert our_error <= 2 * eager_error + 1e-3, (our_error, eager_error)


def test_llama4_chunked_decode_over_a_dynamic_cache_takes_its_mask_as_the_key_mask(monkeypatch):
    """Llama 4's chunked layers over a left-padded batch in a DynamicCache: each step's mask (the chunks placed by the
    attention_mask's values) is a row the graph computes, which reaches the decode kernel as its key mask; logits
    judged against the float32 model as above, or as close as default compile's (on the CPU, Inductor's bfloat16 code
    of this model's first step is 0.6 off in a logit, with or without the op)."""
    config = hf.tiny_config("llama4_text", "sdpa")
    for key, size in dict(vocab_size=512, hidden_size=512, intermediate_size=1024, intermediate_size_mlp=1024,
                          num_attention_heads=4, num_key_value_heads=1, head_dim=128, attention_chunk_size=256).items():
        setattr(config, key, size)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    reference_model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").cuda().eval()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").cuda().eval().to(torch.bfloat16)
    model.load_state_dict(reference_model.state_dict())
    calls = []
    real_forward = decode.forward
    monkeypatch.setattr(decode, "forward", lambda *a, **kw: calls.append(1) or real_forward(*a, **kw))
    prompt = torch.randint(0, 512, (2, 600), device="cuda")
    keep = torch.ones(2, 600, dtype=torch.long, device="cuda")
    keep[1, :100] = 0
    steps = torch.randint(0, 512, (2, 4), device="cuda")

    def run(m, compile_backend=None):
        fn = torch.compile(m, backend=compile_backend) if compile_backend else m
        out = m(prompt, attention_mask=keep, use_cache=True)
        mask, logits = keep, []
        for i in range(steps.shape[1]):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype, device="cuda")], 1)
            out = fn(steps[:, i:i + 1], attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
            logits.append(out.logits[:, -1].float())
        return torch.stack(logits)

    torch._dynamo.reset()
    with torch.no_grad():
        expected = run(reference_model)
        bf16_eager = run(model)
        ours = run(model, fa4_inductor.backend(small_calls_to_sdpa=False))
        torch._dynamo.reset()
        default = run(model, "inductor")
    assert len(calls) >= config.num_hidden_layers, "the decode kernel never ran"
    our_error = (ours - expected).abs().max().item()
    eager_error = (bf16_eager - expected).abs().max().item()
    default_error = (default - expected).abs().max().item()
    assert our_error <= max(2 * eager_error + 1e-3, 1.25 * default_error), (our_error, eager_error, default_error)
