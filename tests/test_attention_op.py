"""`fa4::attention` and `fa4::attention_backward`: opcheck, float64 numerics, gradcheck, fake strides."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

from fa4_inductor.kernels import attention as attention_op
from fa4_inductor.kernels import reference
from fa4_inductor.kernels.key_mask import rebased_additive_mask

ATTENTION = torch.ops.fa4.attention.default
BACKWARD = torch.ops.fa4.attention_backward.default

FLAG_CASES = [
    dict(),
    dict(causal=True),
    dict(causal=True, window_left=3),
    dict(window_left=2, window_right=1),
    dict(softcap=2.5),
    dict(causal=True, softcap=1.5, window_left=4),
]


def qkv(b=2, hq=4, hkv=2, sq=7, sk=7, d=16, dv=None, dtype=torch.float32, requires_grad=False, bshd=False):
    dv = dv or d

    def make(h, s, dd):
        if bshd:  # what HF hands over: a transposed view of [B, S, H, D]
            t = torch.randn(b, s, h, dd, dtype=dtype).transpose(1, 2)
        else:
            t = torch.randn(b, h, s, dd, dtype=dtype)
        return t.detach().requires_grad_(requires_grad)

    return make(hq, sq, d), make(hkv, sk, d), make(hkv, sk, dv)


def masked_sdpa(q, k, v, scale, causal=False, window_left=-1, window_right=-1, softcap=0.0, seqused_k=None):
    """The same attention spelled with PyTorch ops and an explicit boolean mask (an independent oracle)."""
    keep = reference.allowed_keys(q.shape[2], k.shape[2], causal=causal, window_left=window_left,
                                  window_right=window_right, seqused_k=seqused_k, device=q.device)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if keep is not None:
        s = s.masked_fill(~keep.squeeze(2), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("flags", FLAG_CASES, ids=str)
@pytest.mark.parametrize("group", [1, 4])
def test_forward_matches_float64(flags, group):
    q, k, v = qkv(hq=4 * group, hkv=4, dtype=torch.float32)
    out, lse = ATTENTION(q, k, v, scale=0.3, **flags)
    expected = masked_sdpa(q.double(), k.double(), v.double(), 0.3, **flags)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=2e-6)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]


def test_matches_pytorch_sdpa_with_gqa():
    q, k, v = qkv(hq=8, hkv=2, sq=9, sk=9, d=32, dtype=torch.float64)
    out, _ = ATTENTION(q, k, v, scale=1 / math.sqrt(32), causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


def test_seqused_k_and_bottom_right_alignment():
    q, k, v = qkv(b=3, sq=2, sk=9, dtype=torch.float64)
    used = torch.tensor([9, 5, 1], dtype=torch.int32)
    out, _ = ATTENTION(q, k, v, used, scale=0.25, causal=True)
    for b, n in enumerate(used.tolist()):
        qb, kb, vb = q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n]
        # bottom-right: the last query row sees keys [0, n), the first [0, n - 1)
        keep = torch.arange(n)[None, :] <= torch.arange(2)[:, None] + n - 2
        expected = masked_sdpa_with_keep(qb, kb, vb, 0.25, keep)
        if n == 1:
            expected[:, :, 0] = 0  # the first row sees no key: zeros
        torch.testing.assert_close(out[b:b + 1], expected)


def masked_sdpa_with_keep(q, k, v, scale, keep, softcap=0.0):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1).nan_to_num() @ v


def test_empty_rows_give_zeros_and_minus_inf_lse():
    q, k, v = qkv(sq=5, sk=3)
    out, lse = ATTENTION(q, k, v, scale=0.5, causal=True)  # bottom-right: rows 0 and 1 see nothing
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2]))
    assert torch.isinf(lse[:, :, :2]).all() and torch.isfinite(lse[:, :, 2:]).all()


@pytest.mark.parametrize("bshd", [False, True])
def test_output_layout_is_bshd_and_fake_agrees(bshd):
    q, k, v = qkv(d=16, dv=8, bshd=bshd)
    out, lse = ATTENTION(q, k, v, scale=0.25)
    b, hq, sq, _ = q.shape
    assert out.shape == (b, hq, sq, 8) and out.stride() == (sq * hq * 8, 8, hq * 8, 1)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        fout, flse = ATTENTION(fq, fk, fv, scale=0.25)
    assert fout.stride() == out.stride() and flse.stride() == lse.stride()


@pytest.mark.parametrize("flags", FLAG_CASES[:4], ids=str)
def test_opcheck_forward(flags):
    q, k, v = qkv(hq=4, hkv=2, requires_grad=True)
    torch.library.opcheck(ATTENTION, (q, k, v), dict(scale=0.3, **flags))


def test_opcheck_forward_with_seqused_k():
    q, k, v = qkv(b=2, sq=3, sk=8)
    torch.library.opcheck(ATTENTION, (q, k, v, torch.tensor([8, 4], dtype=torch.int32)), dict(scale=0.3, causal=True))


@pytest.mark.parametrize("source", ["bool", "float", "expanded"])
def test_key_mask_op_is_a_new_boolean_tensor(source):
    """`fa4::key_mask(m)`: `m != 0` as a contiguous tensor of its own (never a view of m), the key mask lowering
    hands the attention ops."""
    m = torch.randn(3, 1, 5, 8)
    m = {"bool": m > 0, "float": m.masked_fill(m < 0, 0.0), "expanded": (m > 0)[:1].expand(3, 1, 5, 8)}[source]
    rows = torch.ops.fa4.key_mask.default(m[:, 0])
    assert rows.dtype == torch.bool and rows.is_contiguous() and rows.untyped_storage().data_ptr() != m.data_ptr()
    assert torch.equal(rows, m[:, 0] != 0)
    torch.library.opcheck(torch.ops.fa4.key_mask.default, (m[:, 0],))


def test_key_mask_op_copies_an_additive_mask():
    """`fa4::key_mask(m, additive=True)`: a contiguous copy of eager code's float mask in its dtype, never a view."""
    m = torch.randn(1, 1, 5, 8).masked_fill(torch.rand(1, 1, 5, 8) > 0.5, torch.finfo(torch.float32).min)
    rows = torch.ops.fa4.key_mask.default(m[:, 0].expand(3, 5, 8), additive=True)
    assert rows.dtype == m.dtype and rows.is_contiguous() and rows.untyped_storage().data_ptr() != m.data_ptr()
    assert torch.equal(rows, m[:, 0].expand(3, 5, 8))
    torch.library.opcheck(torch.ops.fa4.key_mask.default, (m[:, 0].expand(3, 5, 8),), dict(additive=True))


def test_rebased_additive_mask_moves_only_rows_whose_largest_value_absorbs_float32_scores():
    """`rebased_additive_mask`: a row less its largest value m where -2^40 < m <= -128, bit-exact for values within
    [2m, m], -inf kept; rows whose largest value is above -128, at finfo.min or below -2^40 (float64 absorbs
    scores there too), or -inf are unchanged. The softmax of fresh scores plus each row is unchanged in float64."""
    low = torch.finfo(torch.bfloat16).min
    rows = torch.randn(8, 6).to(torch.bfloat16)
    rows[0] = -1e9 - rows[0].float() * 1e6  # within [2m, m]
    rows[1] = torch.tensor([-1e9, float("-inf"), -1.5e9, -1e9, float("-inf"), -2e9])
    rows[2, ::2] = -1e9  # mixed with small values: largest above -128
    rows[3] = low
    rows[4] = -(2.0 ** 41) - rows[4].float().abs() * 2.0 ** 33
    rows[5] = float("-inf")
    rows[6] = -100.0 + rows[6].float()
    rows[7] = -3e4 - rows[7].float().abs() * 1e3
    rebased = rebased_additive_mask(rows)
    assert rebased.dtype == torch.bfloat16
    shifted = [0, 1, 7]
    for i in range(8):
        if i in shifted:
            largest = rows[i].float().amax()
            expected = torch.where(rows[i].isinf(), rows[i].float(), rows[i].float() - largest)
            assert torch.equal(rebased[i].float(), expected), i
            assert rebased[i].float().amax().item() == 0.0
        else:
            assert torch.equal(rebased[i], rows[i]), i
    scores = torch.randn(3, 6, dtype=torch.float64) * 8
    for i in shifted:
        torch.testing.assert_close(torch.softmax(scores + rebased[i].double(), -1),
                                   torch.softmax(scores + rows[i].double(), -1))
    assert torch.equal(rebased_additive_mask(rebased), rebased)


def test_attention_forward_is_attention_without_autograd():
    """`fa4::attention_forward` (what compiled graphs call, lowering/post_grad.py) computes what
    `fa4::attention` does, passes opcheck, and has no autograd formula."""
    q, k, v = qkv(b=2, sq=3, sk=8)
    used = torch.tensor([8, 4], dtype=torch.int32)
    forward = torch.ops.fa4.attention_forward.default
    torch.library.opcheck(forward, (q, k, v, used), dict(scale=0.3, causal=True),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    for got, expected in zip(forward(q, k, v, used, scale=0.3, causal=True), ATTENTION(q, k, v, used, scale=0.3, causal=True)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("fa4::attention_forward", "Autograd")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("fa4::attention", "Autograd")


def test_opcheck_backward():
    q, k, v = qkv(hq=4, hkv=2)
    out, lse = ATTENTION(q, k, v, scale=0.3, causal=True)
    grad = torch.randn_like(out)
    torch.library.opcheck(BACKWARD, (grad, q, k, v, out, lse), dict(scale=0.3, causal=True))
    torch.library.opcheck(BACKWARD, (grad, q, k, v, out, lse, torch.randn_like(lse)), dict(scale=0.3))


@pytest.mark.parametrize("flags", FLAG_CASES, ids=str)
def test_gradcheck_float64(flags):
    q, k, v = qkv(b=1, hq=4, hkv=2, sq=5, sk=5, d=8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: ATTENTION(q, k, v, scale=0.4, **flags)[0], (q, k, v))


def test_gradcheck_through_lse():
    q, k, v = qkv(b=1, hq=2, hkv=1, sq=4, sk=6, d=8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: ATTENTION(q, k, v, scale=0.4, causal=True)[1], (q, k, v))


def test_rejects_head_counts_that_are_not_a_multiple():
    q, k, v = qkv(hq=3, hkv=2)
    with pytest.raises(RuntimeError, match="not a multiple"):
        ATTENTION(q, k, v, scale=1.0)


def test_rejects_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one dtype"):
        ATTENTION(q, k.double(), v, scale=1.0)


@pytest.mark.parametrize(
    "device, dtype, d, reason",
    [
        ("cuda", torch.float32, 128, "dtype float32 is not supported on cuda"),
        ("cuda", torch.bfloat16, 12, "head_dim 12 is not a multiple of 8"),
        ("cuda", torch.bfloat16, 512, "head_dim 512"),
        ("cpu", torch.float64, 64, None),
        ("cuda", torch.float16, 256, None),
    ],
)
def test_unsupported_reason(device, dtype, d, reason):
    got = attention_op.unsupported_reason(device, dtype, d, d)
    assert got == reason if reason is None else reason in got


def test_kernel_for_cpu_is_reference():
    q, k, v = qkv()
    assert attention_op.kernel_for(q, k, v)[0] == "reference"


def test_device_kernels_fill_in_the_flags_a_caller_leaves_out():
    """A call passes only some flags (the rest take the schema's defaults); the CUDA kernel body gets
    exactly those, so it must complete them. Run on CPU tensors, it takes the reference path."""
    from fa4_inductor.kernels import attention as attention_op

    q, k, v = (torch.randn(2, 4, 6, 16) for _ in range(3))
    out, lse = attention_op._attention_cuda(q, k, v, scale=0.5, softcap=3.0)
    want_out, want_lse = torch.ops.fa4.attention(q, k, v, scale=0.5, softcap=3.0)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


@pytest.mark.parametrize("sq", [1, 3])
def test_a_window_as_long_as_the_keys_is_dropped_for_the_device_kernels(sq, monkeypatch):
    """A decode step over HF's sliding-window cache (as many slots as the window) carries window_left = slots - 1,
    which hides no slot of any used length: the device kernels get the call without it, so the decode kernel takes
    it. Numerics on fresh inputs and used lengths: the same as with the window; one key fewer in the window
    differs (where a row's window starts after slot 0), so the check can fail."""
    from fa4_inductor.kernels import decode, switches

    slots = 8
    q, k, v = qkv(b=3, hq=8, hkv=2, sq=sq, sk=slots, d=64, dtype=torch.float64)
    used = torch.tensor([sq, 5, slots])
    flags = dict(scale=0.125, causal=True, window_left=slots - 1)
    assert attention_op.device_flags(flags, slots) == dict(scale=0.125, causal=True, window_left=-1,
                                                           window_right=-1, softcap=0.0)
    for kept in (dict(flags, window_left=slots - 2), dict(scale=0.125, window_right=slots)):
        assert attention_op.device_flags(kept, slots) == attention_op._complete(kept)
    with_window = torch.ops.fa4.attention(q, k, v, used, **flags)[0]
    without = torch.ops.fa4.attention(q, k, v, used, **attention_op.device_flags(flags, slots))[0]
    torch.testing.assert_close(with_window, without, rtol=0, atol=0)
    torch.testing.assert_close(with_window, masked_sdpa(q, k, v, seqused_k=used, **flags))
    narrower = torch.ops.fa4.attention(q, k, v, used, **dict(flags, window_left=slots - 2))[0]
    assert not torch.allclose(narrower[2], with_window[2])

    monkeypatch.setattr(switches, "gate", lambda kernel, switch, q, dtypes: None)
    monkeypatch.setattr(switches, "capability", lambda index: (9, 0))
    q, k, v = qkv(b=1, hq=32, hkv=8, sq=1, sk=1024, d=128, dtype=torch.bfloat16)
    used = torch.tensor([1024])
    flags = dict(scale=128 ** -0.5, causal=True, window_left=1023)
    assert decode.unsupported_reason(q, k, v, seqused_k=used, **flags) == "the decode kernel has no local window"
    assert decode.dispatch_reason(q, k, v, seqused_k=used, **attention_op.device_flags(flags, 1024)) is None


@pytest.mark.parametrize("lengths", [torch.tensor([7]).expand(3), torch.tensor([5]), torch.arange(8)[::2]])
def test_lengths_reach_kernels_with_unit_stride(lengths):
    """seqused_k often arrives expanded from one cache position (stride 0); FA4 asserts stride 1."""
    from fa4_inductor.kernels import layout

    got = layout.lengths_int32(lengths, "cpu")
    assert got.dtype == torch.int32 and got.stride() == (1,) and torch.equal(got, lengths.int())


def test_one_length_with_stride_0_is_restrided_not_copied():
    """Inductor allocates a one-sequence seqused_k as empty_strided((1,), (0,)): a copy would be a launch a call."""
    from fa4_inductor.kernels import layout

    one = torch.empty_strided((1,), (0,), dtype=torch.int32).fill_(9)
    got = layout.lengths_int32(one, "cpu")
    assert got.stride() == (1,) and got.data_ptr() == one.data_ptr() and got.item() == 9
    scales = torch.randn(2, 3, 1).as_strided((2, 3, 1), (3, 1, 0))  # one key's scales, stride 0 along the keys
    viewed = layout.unit_last_stride(scales)
    assert viewed.stride() == (3, 1, 1) and viewed.data_ptr() == scales.data_ptr() and torch.equal(viewed, scales)


def random_per_query_mask(b, sq, sk):
    mask = torch.rand(b, sq, sk) > 0.4
    mask[0, 1] = False  # a row that sees no key
    return mask


def random_key_mask(b, sk, generator=None):
    """Left padding, right padding and holes, every sequence with at least one visible key."""
    mask = torch.rand(b, sk, generator=generator) > 0.3
    mask[0, : sk // 2] = False  # left padding
    mask[-1, sk // 2:] = False  # right padding
    mask[:, sk // 2] = True
    return mask


@pytest.mark.parametrize("flags", [dict(), dict(causal=True), dict(causal=True, window_left=3), dict(softcap=2.0)],
                         ids=str)
def test_key_mask_matches_float64(flags):
    q, k, v = qkv(b=3, hq=8, hkv=2, sq=9, sk=9, dtype=torch.float32)
    key_mask = random_key_mask(3, 9)
    out, lse = ATTENTION(q, k, v, None, key_mask, scale=0.3, **flags)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    keep = key_mask[:, None, None, :] & (j <= i if flags.get("causal") else True)
    if "window_left" in flags:
        keep = keep & (j >= i - flags["window_left"])
    expected = masked_sdpa_with_keep(q.double(), k.double(), v.double(), 0.3, keep, flags.get("softcap", 0.0))
    blind = ~keep.any(-1)  # rows that see no key: zeros and lse -inf, as the contract says
    expected = expected.masked_fill(blind[..., None], 0.0)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=2e-6)
    assert torch.equal(lse.isinf(), blind.expand_as(lse))


def test_key_mask_with_seqused_k_and_a_cache():
    """Decode over a cache: the key mask hides keys on top of the used length and the bottom-right diagonal."""
    q, k, v = qkv(b=2, sq=2, sk=12, dtype=torch.float64)
    used = torch.tensor([12, 7], dtype=torch.int32)
    key_mask = random_key_mask(2, 12)
    out, _ = ATTENTION(q, k, v, used, key_mask, scale=0.25, causal=True)
    for b, n in enumerate(used.tolist()):
        keep = (torch.arange(n)[None, :] <= torch.arange(2)[:, None] + n - 2) & key_mask[b, :n]
        expected = masked_sdpa_with_keep(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], 0.25, keep)
        torch.testing.assert_close(out[b:b + 1], expected)


def test_key_mask_opcheck_and_gradcheck():
    q, k, v = qkv(b=2, sq=5, sk=5, d=8, dtype=torch.float64, requires_grad=True)
    key_mask = random_key_mask(2, 5)
    torch.library.opcheck(ATTENTION, (q, k, v, None, key_mask), dict(scale=0.3, causal=True))
    plain = [t.detach() for t in (q, k, v)]
    out, lse = ATTENTION(*plain, None, key_mask, scale=0.3, causal=True)
    torch.library.opcheck(BACKWARD, (torch.randn_like(out), *plain, out, lse, None, None, key_mask),
                          dict(scale=0.3, causal=True))
    torch.autograd.gradcheck(lambda q, k, v: ATTENTION(q, k, v, None, key_mask, scale=0.3)[0], (q, k, v))


def additive_mask(b, sq, sk, dtype, per_query):
    """Eager code's mask in q's dtype: random finite values, finfo.min on some keys and on every key of one row
    (eager's softmax makes that row uniform: the mean of V)."""
    m = torch.randn(b, sq, sk, dtype=torch.float64) * 3
    m = m.masked_fill(torch.rand(b, sq, sk) < 0.3, torch.finfo(dtype).min).to(dtype)
    m[-1, -1] = torch.finfo(dtype).min
    return m if per_query else m[:, -1]


@pytest.mark.parametrize("per_query", [False, True], ids=["[B, Sk]", "[B, Sq, Sk]"])
@pytest.mark.parametrize("flags", [dict(), dict(causal=True), dict(softcap=2.0)], ids=str)
def test_additive_key_mask_matches_float64(flags, per_query):
    """A key mask in q's dtype is added to the scaled, soft-capped scores (eager attention code's mask), any values."""
    q, k, v = qkv(b=2, hq=8, hkv=2, sq=3, sk=9, dtype=torch.float32)
    mask = additive_mask(2, 3, 9, torch.float32, per_query)
    out, lse = ATTENTION(q, k, v, None, mask, scale=0.3, **flags)
    qd, kd, vd = (t.double().repeat_interleave(4 if t is not q else 1, dim=1) for t in (q, k, v))
    scores = qd @ kd.transpose(-1, -2) * 0.3
    if "softcap" in flags:
        scores = 2.0 * torch.tanh(scores / 2.0)
    scores = scores + (mask.double()[:, None] if per_query else mask.double()[:, None, None])
    if flags.get("causal"):
        scores = scores.masked_fill(torch.ones(3, 9, dtype=torch.bool).tril(6).logical_not(), float("-inf"))
    torch.testing.assert_close(out.double(), torch.softmax(scores, -1) @ vd, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), atol=2e-5, rtol=2e-6)
    if per_query:  # the all-finfo.min row: uniform weights
        torch.testing.assert_close(out[-1, :, -1].double(), vd[-1].mean(1), atol=2e-6, rtol=2e-6)


def test_additive_key_mask_opcheck_and_gradcheck():
    q, k, v = qkv(b=2, hq=4, hkv=2, sq=4, sk=6, d=8, dtype=torch.float64, requires_grad=True)
    mask = additive_mask(2, 4, 6, torch.float64, per_query=False)
    mask[0, 1] = -1e4  # gradcheck's finite differences stay away from finfo.min's rounding
    mask = mask.clamp_min(-1e4)
    torch.library.opcheck(ATTENTION, (q, k, v, None, mask), dict(scale=0.3, causal=True, softcap=3.0))
    torch.autograd.gradcheck(lambda q, k, v: ATTENTION(q, k, v, None, mask, scale=0.3, softcap=3.0)[0], (q, k, v))
    plain = [t.detach() for t in (q, k, v)]
    full = dict(scale=0.3, causal=True, window_left=-1, window_right=-1, softcap=0.0)
    out, lse = ATTENTION(*plain, None, mask, **full)
    grad = torch.randn_like(out)
    torch.library.opcheck(BACKWARD, (grad, *plain, out, lse, None, None, mask), full)


def test_key_mask_must_be_bool_b_by_sk():
    q, k, v = qkv(b=2, sq=3, sk=5)
    with pytest.raises(ValueError, match="bool key_mask"):
        ATTENTION(q, k, v, None, torch.ones(2, 5, dtype=torch.float64), scale=0.3)
    with pytest.raises(RuntimeError, match=r"key_mask must have shape \[B, Sk\]"):
        ATTENTION(q, k, v, None, torch.ones(2, 4, dtype=torch.bool), scale=0.3)


@pytest.mark.parametrize("flags, seqused, mask_kind, expected", [
    (dict(causal=True), None, "ones", "dropped"),
    (dict(causal=True), [5, 3], "ones-then-garbage", "dropped"),  # hides nothing below seqused_k
    (dict(), None, "right", "seqused_k"),
    (dict(causal=True), None, "right", "right"),  # not seqused_k, which would move the causal diagonal
    (dict(causal=True, window_left=-1, window_right=-1, softcap=2.0), None, "right", "right"),
    (dict(window_left=1, window_right=0), None, "right", "kept"),  # a window: padding queries see no fixed run
    (dict(causal=True), [5, 4], "right", "kept"),
    (dict(), None, "left", "left"),
    (dict(causal=True), None, "left", "left"),
    (dict(window_left=1, window_right=0), None, "left", "left"),
    (dict(causal=True), [5, 4], "left", "kept"),  # left padding under a cache length: no varlen form
    (dict(), None, "empty-row", "kept"),
    (dict(causal=True), None, "holes", "kept"),
])
def test_key_masks_that_fa4_can_take_after_all(flags, seqused, mask_kind, expected, monkeypatch):
    """`key_mask_form` reads the mask's contents: the op then routes the call as if it had no key mask."""
    monkeypatch.setattr(attention_op, "RIGHT_PADDING_ON_FA4", True)
    full = {**dict(scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0), **flags}
    lengths = torch.tensor([5, 3])
    mask = {"ones": torch.ones(2, 5, dtype=torch.bool),
            "ones-then-garbage": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 1]], dtype=torch.bool),
            "right": torch.arange(5)[None, :] < lengths[:, None],
            "left": torch.arange(5)[None, :] >= 5 - lengths[:, None],
            "empty-row": torch.arange(5)[None, :] < torch.tensor([5, 0])[:, None],
            "holes": torch.tensor([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)}[mask_kind]
    used = None if seqused is None else torch.tensor(seqused, dtype=torch.int32)
    q, k, v = qkv(b=2, sq=5, sk=5, dtype=torch.float64)
    new_used, new_mask, padded = attention_op.key_mask_form(q, k, used, mask, full)[:3]
    side, positions = padded or (None, None)
    assert {"dropped": lambda: new_mask is None and new_used is used and padded is None,
            "seqused_k": lambda: new_mask is None and new_used is not None and new_used.tolist() == lengths.tolist(),
            "left": lambda: new_mask is new_used is None and side == "left" and positions.tolist() == (5 - lengths).tolist(),
            "right": lambda: new_mask is new_used is None and side == "right" and positions.tolist() == lengths.tolist(),
            "kept": lambda: new_mask is mask and new_used is used and padded is None}[expected]()
    if padded is None:  # and it is still the same attention
        out, _ = ATTENTION(q, k, v, new_used, new_mask, **full)
        torch.testing.assert_close(out, ATTENTION(q, k, v, used, mask, **full)[0])


def test_key_mask_form_reads_a_mask_once_and_keeps_nothing_alive(monkeypatch):
    """The layers of a forward share one mask: its contents are read (a host sync) once. What is remembered
    holds no tensor: CUDA-graph trees refuse a pool tensor that outlives its graph."""
    import gc
    import weakref

    full = dict(scale=0.3, causal=True, window_left=-1, window_right=-1, softcap=0.0)
    reads = []
    real = attention_op._mask_kind
    monkeypatch.setattr(attention_op, "_mask_kind", lambda *a: reads.append(1) or real(*a))
    q, k, _ = qkv(b=2, sq=5, sk=5, dtype=torch.float64)
    mask = torch.arange(5)[None, :] >= 5 - torch.tensor([5, 3])[:, None]
    forms = [attention_op.key_mask_form(q, k, None, mask, full) for _ in range(3)]
    assert len(reads) == 1 and all(f.padded[1].tolist() == [0, 2] for f in forms)
    mask[1, 0] = True  # an in-place update: read again
    assert attention_op.key_mask_form(q, k, None, mask, full).key_mask is mask and len(reads) == 2
    alive = weakref.ref(mask)
    del mask, forms
    gc.collect()
    assert alive() is None


class VarlenFA4OnTheCPU:
    """FA4's varlen interface as the padded paths call it, run with the reference on the CPU: sequence b's queries
    are the rows from cu_seqlens_q[b], seqused_q[b] of them (else up to the next offset), its keys likewise; masks
    bottom-right aligned within the segment; rows outside every segment are not written; the backward writes
    (does not add) the gradients of its rows."""

    @staticmethod
    def _segments(cu_seqlens_q, cu_seqlens_k, seqused_q=None, seqused_k=None, **_):
        for i in range(len(cu_seqlens_q) - 1):
            q0, k0 = int(cu_seqlens_q[i]), int(cu_seqlens_k[i])
            nq = int(seqused_q[i]) if seqused_q is not None else int(cu_seqlens_q[i + 1]) - q0
            nk = int(seqused_k[i]) if seqused_k is not None else int(cu_seqlens_k[i + 1]) - k0
            if nq and nk:
                yield slice(q0, q0 + nq), slice(k0, k0 + nk)

    @staticmethod
    def _flags(softmax_scale, causal, softcap, window_size_left, window_size_right):
        return dict(scale=softmax_scale, causal=causal, softcap=softcap,
                    window_left=-1 if window_size_left is None else window_size_left,
                    window_right=-1 if window_size_right is None else window_size_right)

    @staticmethod
    def _seq(t, rows):  # [rows, H, D] -> [1, H, rows, D]
        return t[rows].transpose(0, 1)[None]

    def _flash_attn_fwd(self, q, k, v, *, out, lse, return_lse, max_seqlen_q, max_seqlen_k, **kw):
        varlen = {n: kw.pop(n, None) for n in ("cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k")}
        for qr, kr in self._segments(**varlen):
            o, l = reference.attention_forward(self._seq(q, qr), self._seq(k, kr), self._seq(v, kr), seqused_k=None,
                                               **self._flags(**kw))
            out[qr] = o[0].transpose(0, 1).to(out.dtype)
            lse[:, qr] = l[0].float()

    def _flash_attn_bwd(self, q, k, v, out, dout, lse, *, dq, dk, dv, dlse, max_seqlen_q, max_seqlen_k, **kw):
        varlen = {n: kw.pop(n, None) for n in ("cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k")}
        for qr, kr in self._segments(**varlen):
            grads = reference.attention_backward(
                self._seq(dout, qr), self._seq(q, qr), self._seq(k, kr), self._seq(v, kr), self._seq(out, qr),
                lse[:, qr][None].to(q.dtype), None if dlse is None else dlse[:, qr][None].to(q.dtype), seqused_k=None,
                **self._flags(**kw))
            for dst, rows, g in zip((dq, dk, dv), (qr, kr, kr), grads):
                dst[rows] = g[0].transpose(0, 1).to(dst.dtype)


@pytest.fixture
def fa4_dispatch_on_the_cpu(monkeypatch):
    """`_attention_cuda` / `_attention_backward_cuda` as on a GPU where FA4 takes every call without a key mask (and
    no attention is small): FA4's varlen interface on the CPU (`VarlenFA4OnTheCPU`). Yields the list of
    `fa4.forward_padded` / `backward_padded` calls made, by name."""
    from contextlib import nullcontext

    from fa4_inductor.kernels import fa4, routes

    calls = []
    for name in ("forward_padded", "backward_padded"):
        def counted(*args, _run=getattr(fa4, name), _name=name, **kwargs):
            calls.append(_name)
            return _run(*args, **kwargs)
        monkeypatch.setattr(fa4, name, counted)
    monkeypatch.setattr(fa4, "_require", VarlenFA4OnTheCPU)
    monkeypatch.setattr(fa4, "_device_guard", lambda t: nullcontext())

    def route(q, k, v, seqused_k, key_mask, flags):
        return routes.REFERENCE if key_mask is not None else routes.FA4

    monkeypatch.setattr(attention_op, "_route", route)
    monkeypatch.setattr(attention_op, "_backward_route", route)
    monkeypatch.setattr(attention_op.crossover, "small", lambda *args: False)
    yield calls


@pytest.mark.parametrize("side, flags", [
    ("left", dict(causal=True)), ("left", dict()), ("left", dict(window_left=2, window_right=0)),
    ("right", dict(causal=True)), ("right", dict(causal=True, softcap=5.0)),
], ids=str)
def test_padded_batches_as_fa4_varlen_segments(side, flags, monkeypatch, fa4_dispatch_on_the_cpu):
    """`fa4.forward_padded` / `backward_padded` over FA4's varlen semantics run on the CPU (`VarlenFA4OnTheCPU`),
    for each padding `key_mask_form` gives FA4: the op's answer with the padding mask (blind rows zeros, lse -inf),
    and its gradients (q, k, v; with a gradient into lse), float64 on fresh random inputs. Right padding runs as
    two calls whose key gradients add up."""
    from fa4_inductor.kernels import fa4

    monkeypatch.setattr(attention_op, "RIGHT_PADDING_ON_FA4", True)
    full = {**dict(scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0), **flags}
    b, s = 3, 7
    # unpadded, padded, all padding (a blind row under a band; without one such a mask stays masked), one token
    lengths = torch.tensor([7, 4, 0 if side == "left" and flags else 1])
    positions = torch.arange(s)[None, :]
    mask = positions >= (s - lengths)[:, None] if side == "left" else positions < lengths[:, None]
    form = attention_op.key_mask_form(*qkv(b=b, sq=s, sk=s)[:2], None, mask, full)
    assert form.padded is not None and form.padded[0] == side
    q, k, v = qkv(b=b, hq=4, hkv=2, sq=s, sk=s, dtype=torch.float64)
    out, lse = fa4.forward_padded(q, k, v, side, s - lengths if side == "left" else lengths, **full)
    expected, expected_lse = ATTENTION(q, k, v, None, mask, **full)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(lse, expected_lse.float())  # FA4 keeps lse in float32
    grad_out, grad_lse = torch.randn_like(out), torch.randn_like(lse).masked_fill(lse.isinf(), 0)
    got = fa4.backward_padded(grad_out, q, k, v, out, lse, grad_lse, side,
                              s - lengths if side == "left" else lengths, **full)
    want = reference.attention_backward(grad_out, q, k, v, expected, lse.double(), grad_lse, seqused_k=None,
                                        key_mask=mask, **full)  # from the same float32 lse
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("flags, per_query", [(dict(causal=True), False), (dict(), False),
                                               (dict(window_left=2, window_right=0), False), (dict(), True)],
                         ids=["causal", "plain", "window", "mask per query row"])
def test_sdpa_fallback_backward_matches_the_reference(flags, per_query):
    """The SDPA fallback's recomputing backward, run on the CPU: GQA, a key mask with an all-hidden row ([B, Sk]), or
    a [B, Sq, Sk] one over a longer cache."""
    from fa4_inductor.kernels import sdpa_fallback

    full = {**dict(scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0), **flags}
    q, k, v = qkv(b=3, hq=4, hkv=2, sq=6, sk=9 if per_query else 6, d=8, dtype=torch.float64)
    if per_query:
        mask = random_per_query_mask(3, 6, 9)
    else:
        mask = random_key_mask(3, 6)
        mask[2] = False
    out, lse = ATTENTION(q, k, v, None, mask, **full)
    grad = torch.randn_like(out)
    got = sdpa_fallback.backward_by_recomputation(grad, q, k, v, None, mask, **full)
    expected = reference.attention_backward(grad, q, k, v, out, lse, None, seqused_k=None, key_mask=mask, **full)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def static_prefill_mask(lengths, sq, sk):
    """HF's prefill mask over an empty static cache of sk slots, left-padded: query i sees the visible keys j <= i
    (sequence b's last lengths[b] tokens), slots from sq on are empty."""
    j = torch.arange(sk)
    causal = j[None, :] <= torch.arange(sq)[:, None]
    visible = (j[None, :] >= sq - lengths[:, None]) & (j[None, :] < sq)
    return causal[None] & visible[:, None, :]


@pytest.mark.parametrize("flags", [dict(), dict(causal=True), dict(softcap=2.0)], ids=str)
def test_per_query_key_mask_matches_float64(flags):
    """A [B, Sq, Sk] key mask hides key j from query row i of sequence b where it is False, on top of the flags."""
    q, k, v = qkv(b=3, hq=8, hkv=2, sq=5, sk=9, dtype=torch.float32)
    key_mask = random_per_query_mask(3, 5, 9)
    out, lse = ATTENTION(q, k, v, None, key_mask, scale=0.3, **flags)
    i, j = torch.arange(5)[:, None], torch.arange(9)[None, :]
    keep = key_mask[:, None] & (j <= i + 4 if flags.get("causal") else True)  # bottom-right diagonal
    expected = masked_sdpa_with_keep(q.double(), k.double(), v.double(), 0.3, keep, flags.get("softcap", 0.0))
    blind = ~keep.any(-1)
    expected = expected.masked_fill(blind[..., None], 0.0)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=2e-6)
    assert blind.any() and torch.equal(lse.isinf(), blind.expand_as(lse))


def test_per_query_key_mask_opcheck_gradcheck_and_shape():
    q, k, v = qkv(b=2, sq=4, sk=6, d=8, dtype=torch.float64, requires_grad=True)
    key_mask = random_per_query_mask(2, 4, 6)
    torch.library.opcheck(ATTENTION, (q, k, v, None, key_mask), dict(scale=0.3))
    plain = [t.detach() for t in (q, k, v)]
    out, lse = ATTENTION(*plain, None, key_mask, scale=0.3)
    torch.library.opcheck(BACKWARD, (torch.randn_like(out), *plain, out, lse, None, None, key_mask), dict(scale=0.3))
    torch.autograd.gradcheck(lambda q, k, v: ATTENTION(q, k, v, None, key_mask, scale=0.3)[0], (q, k, v))
    with pytest.raises(RuntimeError, match=r"a 3-D key_mask must have shape \[B, Sq, Sk\]"):
        ATTENTION(*plain, None, key_mask[:, :3], scale=0.3)


PER_QUERY_MASKS = {
    # name: (mask of 2 sequences, 5 queries, 8 slots; flags; the form it should read as)
    "static prefill, left-padded": (lambda: static_prefill_mask(torch.tensor([5, 2]), 5, 8), {}, "prefix"),
    "static prefill, unpadded": (lambda: static_prefill_mask(torch.tensor([5, 5]), 5, 8), {}, "prefix"),
    "static prefill, all padding": (lambda: static_prefill_mask(torch.tensor([5, 0]), 5, 8), {}, "prefix"),
    "a flag on top": (lambda: static_prefill_mask(torch.tensor([5, 2]), 5, 8), dict(causal=True), "kept"),
    "right-padded": (lambda: static_prefill_mask(torch.tensor([5, 5]), 5, 8)
                     & (torch.arange(8) < torch.tensor([5, 3])[:, None])[:, None, :], {}, "kept"),
    "after a cached prefix": (lambda: torch.ones(2, 5, 8, dtype=torch.bool).tril(3), {}, "kept"),
    "a hole": (lambda: static_prefill_mask(torch.tensor([5, 2]), 5, 8).index_put_((torch.tensor(0), torch.tensor(4),
                                                                                   torch.tensor(2)),
                                                                                  torch.tensor(False)), {}, "kept"),
    "HF's unmasked blind rows": (lambda: static_prefill_mask(torch.tensor([5, 2]), 5, 8)
                                 | (torch.arange(5)[:, None] < torch.tensor([0, 3])[:, None, None]), {}, "kept"),
    # Sq == Sk: the mask HF builds outside a compiled layer (FSDP2 per-layer units); the backward takes FA4 too
    "training mask, left-padded": (lambda: static_prefill_mask(torch.tensor([5, 2]), 5, 5), {}, "prefix"),
    "training mask, unpadded": (lambda: static_prefill_mask(torch.tensor([5, 5]), 5, 5), {}, "prefix"),
    # a sliding-window layer's (Mistral, Gemma-2/3 under static-cache generate): each row sees its last 3 keys
    "sliding window, left-padded": (lambda: static_prefill_mask(torch.tensor([5, 4]), 5, 5) & window_band(5, 3),
                                    {}, "prefix, window 2"),
    "sliding window over a static cache": (lambda: static_prefill_mask(torch.tensor([5, 2]), 5, 8)
                                           & window_band(5, 2, 8), {}, "prefix, window 1"),
    # sequences packed back to back (HF's mask from position_ids; Llama 4's chunks): FA4 varlen, one segment each
    "packed sequences": (lambda: torch.stack([packed_mask([2, 3]), packed_mask([5])]), {}, "packed 0 2 5 10 5"),
    "chunks of 2": (lambda: torch.stack([packed_mask([2, 2, 1])] * 2), {}, "packed 0 2 4 5 7 9 10 2"),
    # a sliding-window layer's packed mask (Mistral's with position_ids): each row sees its sequence's last 2 keys
    "packed, a window of 2": (lambda: torch.stack([packed_mask([1, 4]), packed_mask([3, 2])]) & window_band(5, 2), {},
                              "packed 0 1 5 8 10 4, window 1"),
    "packed, a window of 1": (lambda: torch.stack([packed_mask([2, 3])] * 2) & window_band(5, 1), {},
                              "prefix, window 0"),  # every row sees its own key only: any segmentation
    "packed, a window wider on one row": (lambda: (torch.stack([packed_mask([1, 4])] * 2) & window_band(5, 2))
                                          .index_put_((torch.tensor(0), torch.tensor(4), torch.tensor(2)),
                                                      torch.tensor(True)), {}, "kept"),
    "packed, a row seeing no key": (lambda: torch.stack([packed_mask([2, 3]), packed_mask([5])])
                                    .index_put_((torch.tensor(1), torch.tensor(3)), torch.tensor(False)), {}, "kept"),
    # left padding (Llama 4's chunks left-padded; packed sequences after padding): the rows that see no key are gaps
    # after the segments' used lengths, never computed (zeros, lse -inf)
    "chunks of 2, left-padded": (lambda: torch.stack([packed_mask([2, 2, 1]) & left_padded(0),
                                                      packed_mask([2, 2, 1]) & left_padded(3)]), {},
                                 "packed 0 2 4 8 9 10 2, used 2 2 1 1 1"),
    "packed, left-padded": (lambda: torch.stack([packed_mask([1, 2, 2]) & left_padded(1), packed_mask([5])]), {},
                            "packed 0 1 3 5 10 5, used 0 2 2 5"),
    "packed, padding at a row's end": (lambda: torch.stack([packed_mask([2, 3]), packed_mask([3, 2]) & ~left_padded(3)]),
                                       {}, "packed 0 2 5 10 3, used 2 3 3"),
    "packed, all padding": (lambda: torch.stack([packed_mask([2, 3]), packed_mask([5]) & left_padded(5)]), {},
                            "packed 0 2 10 3, used 2 3"),
    "packed, a sequence seeing the one before": (lambda: torch.stack([packed_mask([2, 3]), packed_mask([5])])
                                                 .index_put_((torch.tensor(0), torch.tensor(3), torch.tensor(1)),
                                                             torch.tensor(True)), {}, "kept"),
    "a window wider on one row": (lambda: (static_prefill_mask(torch.tensor([5, 4]), 5, 5) & window_band(5, 3))
                                  .index_put_((torch.tensor(0), torch.tensor(4), torch.tensor(1)), torch.tensor(True)),
                                  {}, "kept"),
}


def left_padded(pad, s=5):
    """[S, S]: keys from `pad` on (rows before it see none of them under a causal mask)."""
    return (torch.arange(s) >= pad)[None, :].expand(s, s)


def packed_mask(lengths):
    """[S, S] causal within each of the sequences of these lengths, placed back to back."""
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return (ids[:, None] == ids[None, :]) & torch.ones(len(ids), len(ids), dtype=torch.bool).tril()


def window_band(sq, window, sk=None):
    """[Sq, Sk] keys j with i - window < j <= i."""
    behind = torch.arange(sq)[:, None] - torch.arange(sk or sq)[None, :]
    return (behind >= 0) & (behind < window)


@pytest.mark.parametrize("name", PER_QUERY_MASKS)
def test_per_query_masks_that_fa4_can_take(name, monkeypatch, fa4_dispatch_on_the_cpu):
    """`key_mask_form` reads a [B, Sq, Sk] mask: the static-cache prefill's becomes a left-padded causal attention
    over the first Sq keys (a sliding-window layer's with its window), and one of sequences packed back to back a
    causal attention within each, which FA4 runs as varlen segments (here FA4's varlen interface on the CPU): the
    same output and lse as the op with the mask, and the same gradients where the keys are all in the prefix.
    Anything else keeps its mask."""
    make, flags, expected = PER_QUERY_MASKS[name]
    mask = make()
    full = {**dict(scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0), **flags}
    q, k, v = qkv(b=2, hq=4, hkv=2, sq=5, sk=mask.shape[-1], dtype=torch.float64)
    form = attention_op.key_mask_form(q, k, None, mask, full)
    if expected == "kept":
        assert form.key_mask is mask and form.padded is None and form.causal_keys is None
        return
    assert form.key_mask is None and form.causal_keys == 5
    if expected.startswith("packed"):
        *offsets, longest = (int(n) for n in expected.split(",")[0].split()[1:])
        assert form.padded[0] == "packed" and form.padded[1][0].tolist() == offsets and form.padded[1][1] == longest
        used = form.padded[1][2]
        assert (None if used is None else used.tolist()) == (
            [int(n) for n in expected.split("used ")[1].split()] if "used" in expected else None)
    else:
        assert form.padded[0] == "left"
    assert form.window_left == (int(expected.split()[-1]) if "window" in expected else -1)
    out, lse = attention_op._attention_cuda(q, k, v, None, mask, **full)
    assert fa4_dispatch_on_the_cpu == ["forward_padded"]
    expected_out, expected_lse = ATTENTION(q, k, v, None, mask, **full)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(lse, expected_lse.float())
    grad_out, grad_lse = torch.randn_like(out), torch.randn_like(lse).masked_fill(lse.isinf(), 0)
    got = attention_op._attention_backward_cuda(grad_out, q, k, v, out, lse, grad_lse, None, mask, **full)
    # every key in the prefix: FA4's backward; else the mask stays (the keys past the prefix need their gradients)
    assert fa4_dispatch_on_the_cpu[1:] == (["backward_padded"] if k.shape[2] == 5 else [])
    want = reference.attention_backward(grad_out, q, k, v, expected_out, lse.double(), grad_lse, seqused_k=None,
                                        key_mask=mask, **full)
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, msg=lambda m: f"d{name}: {m}")


def test_packed_masks_with_blind_rows_follow_their_switch(monkeypatch):
    """`PACKED_BLIND_ROWS_ON_FA4` (on since its GPU run) decides whether a packed mask with blind rows runs as FA4
    varlen segments or keeps the SDPA fallback; a packed mask without blind rows does not depend on it."""
    flags = dict(scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0)
    assert attention_op.PACKED_BLIND_ROWS_ON_FA4
    blind = PER_QUERY_MASKS["chunks of 2, left-padded"][0]()
    assert attention_op._per_query_mask_kind(None, blind, flags).name == "packed"
    monkeypatch.setattr(attention_op, "PACKED_BLIND_ROWS_ON_FA4", False)
    assert attention_op._per_query_mask_kind(None, blind, flags) == attention_op.MaskKind("kept")
    assert attention_op._per_query_mask_kind(None, PER_QUERY_MASKS["chunks of 2"][0](), flags).name == "packed"


ADDITIVE_PREFILL_MASKS = {
    # name: (an additive [2, 5, 8] mask in float32 built from a boolean one, whether the op reads it as FA4's)
    "left-padded": (lambda hide: torch.zeros(2, 5, 8).masked_fill(hide, torch.finfo(torch.float32).min), True),
    "all padding": (lambda hide: torch.zeros(2, 5, 8).masked_fill(hide | True, torch.finfo(torch.float32).min), True),
    "-inf hides": (lambda hide: torch.zeros(2, 5, 8).masked_fill(hide, float("-inf")), False),
    "a bias": (lambda hide: torch.full((2, 5, 8), 0.5).masked_fill(hide, torch.finfo(torch.float32).min), False),
    "sliding window": (lambda hide: torch.zeros(2, 5, 8).masked_fill(hide | ~window_band(5, 2, 8),
                                                                     torch.finfo(torch.float32).min), True),
}


@pytest.mark.parametrize("name", ADDITIVE_PREFILL_MASKS)
def test_an_additive_prefill_mask_of_zeros_and_finfo_min_runs_as_fa4_varlen(name, fa4_dispatch_on_the_cpu):
    """Eager code's static-cache prefill mask (`additive_masks_on_op`): read on the host like the boolean one when
    its values are 0 and finfo.min, run as FA4 varlen segments (FA4's varlen interface on the CPU), and the rows
    that see no key made eager's: the mean of V over all keys, lse finfo.min (`_blind_rows_as_mean`). The same
    output and lse as the op with the additive mask. Other values keep the mask."""
    make, read = ADDITIVE_PREFILL_MASKS[name]
    mask = make(~static_prefill_mask(torch.tensor([5, 2]), 5, 8))
    full = dict(scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0)
    q, k, v = qkv(b=2, hq=4, hkv=2, sq=5, sk=8, dtype=torch.float32)
    form = attention_op.key_mask_form(q, k, None, mask, full)
    out, lse = attention_op._attention_cuda(q, k, v, None, mask, **full)
    expected_out, expected_lse = ATTENTION(q, k, v, None, mask, **full)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(lse, expected_lse)
    if not read:
        assert form.key_mask is mask and form.padded is None and form.causal_keys is None
        assert fa4_dispatch_on_the_cpu == []
        return
    assert form.key_mask is None and form.causal_keys == 5 and form.padded[0] == "left"
    assert fa4_dispatch_on_the_cpu == ["forward_padded"]
    assert lse.isfinite().all() and torch.equal(out[1, :, 0], v[1].mean(1).repeat_interleave(2, 0))


@pytest.mark.parametrize("name", ["packed sequences", "chunks of 2, left-padded", "packed, left-padded",
                                  "packed, all padding"])
def test_an_additive_packed_mask_trains_on_fa4_varlen_with_eagers_gradients(name, fa4_dispatch_on_the_cpu):
    """Eager code's packed training mask (0 and finfo.min, per query row): forward and backward as FA4 varlen
    segments (FA4's varlen interface on the CPU), and the rows that see no key get what eager's softmax gives them,
    forward (the mean of V) and backward (`blind_rows_gradients`: through the absorbed scores to q and k, through
    the mean to V, and lse's gradient, softmax's weights): output, lse and gradients against float64 autograd."""
    hide = ~PER_QUERY_MASKS[name][0]()
    mask = torch.zeros(hide.shape).masked_fill(hide, torch.finfo(torch.float32).min)
    full = dict(scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0)
    q, k, v = qkv(b=2, hq=4, hkv=2, sq=5, sk=5, dtype=torch.float32)
    out, lse = attention_op._attention_cuda(q, k, v, None, mask, **full)
    grad_out, grad_lse = torch.randn_like(out), torch.randn_like(lse)
    got = attention_op._attention_backward_cuda(grad_out, q, k, v, out, lse, grad_lse, None, mask, **full)
    assert fa4_dispatch_on_the_cpu == ["forward_padded", "backward_padded"]

    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    scores = leaves[0] @ leaves[1].repeat_interleave(2, 1).mT * 0.3 + mask.double()[:, None]
    top = scores.amax(-1, keepdim=True).detach()  # `logsumexp`'s own backward reads exp(s - lse), 1 on an absorbed row
    want_lse = (scores - top).exp().sum(-1).log() + top[..., 0]
    want_out = scores.softmax(-1) @ leaves[2].repeat_interleave(2, 1)
    want = torch.autograd.grad((want_out * grad_out.double()).sum() + (want_lse * grad_lse.double()).sum(), leaves)
    torch.testing.assert_close(out.double(), want_out.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse.detach(), atol=1e-5, rtol=1e-5)
    for n, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g.double(), w, atol=1e-5, rtol=1e-5, msg=lambda m: f"d{n}: {m}")


def test_signature_caches_forget_their_oldest_entries():
    from fa4_inductor.kernels.layout import SignatureCache

    cache = SignatureCache(limit=2)
    for key in "abc":
        cache[key] = key.upper()
    assert list(cache) == ["b", "c"] and cache.get("a") is None and type(cache)().limit > 2


INVALID_CALLS = {
    "int64 inputs": (lambda q: (q.long(), q.long(), q.long()), {}, "takes float16, bfloat16, float32 or float64"),
    "bool inputs": (lambda q: (q > 0, q > 0, q > 0), {}, "takes float16, bfloat16, float32 or float64"),
    "complex inputs": (lambda q: (q.to(torch.complex64),) * 3, {}, "takes float16, bfloat16, float32 or float64"),
    "head dim 20": (lambda q: (torch.randn(2, 4, 7, 20),) * 3, {}, "head_dim 20 is not a multiple of 8"),
    "head dim 512": (lambda q: (torch.randn(2, 4, 7, 512),) * 3, {}, "head_dim 512 is not a multiple of 8"),
    "negative softcap": (lambda q: (q, q, q), dict(softcap=-5.0), "softcap >= 0"),
    "window -5": (lambda q: (q, q, q), dict(window_left=-5), "window_left >= 0, or -1"),
    "negative scale": (lambda q: (q, q, q), dict(scale=-0.3), "positive finite scale"),
    "float seqused_k": (lambda q: (q, q, q, torch.tensor([3.0, 4.0])), {}, "int32 or int64 seqused_k"),
    "negative seqused_k": (lambda q: (q, q, q, torch.tensor([-1, 4], dtype=torch.int32)), {}, "not within 0..7"),
    "seqused_k past the keys": (lambda q: (q, q, q, torch.tensor([8, 4], dtype=torch.int32)), {}, "not within 0..7"),
}


@pytest.mark.parametrize("case", list(INVALID_CALLS))
def test_invalid_calls_are_errors(case):
    """What the kernels cannot take is an error, never reinterpreted (a negative softcap is not "off")."""
    make, flags, message = INVALID_CALLS[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        ATTENTION(*make(torch.randn(2, 4, 7, 16)), **{"scale": 0.3, **flags})


def test_small_key_mask_calls_skip_the_host_read_of_the_mask():
    """A small attention with a key mask runs on the SDPA fallback with its mask: its form is not read on the
    host (a sync that stalls a host-bound graph); a large one is (kernels/crossover.py draws the line)."""
    full = dict(scale=0.1, causal=True, window_left=-1, window_right=-1, softcap=0.0)
    small_q, small_k = torch.empty(8, 4, 2048, 64, device="meta"), torch.empty(8, 1, 2048, 64, device="meta")
    large_q, large_k = torch.empty(4, 32, 4096, 128, device="meta"), torch.empty(4, 8, 4096, 128, device="meta")
    key_mask = torch.empty(8, 2048, dtype=torch.bool, device="meta")
    assert not attention_op._reads_mask_form(small_q, small_k, key_mask, full)
    assert attention_op._reads_mask_form(large_q, large_k, key_mask, full)
    # A mask per query row is sized as the causal attention over Sq keys it may become, not over the whole cache.
    per_query = torch.empty(8, 2048, 16384, dtype=torch.bool, device="meta")
    long_k = torch.empty(8, 1, 16384, 64, device="meta")
    assert attention_op._reads_mask_form(small_q, long_k, key_mask, full)
    assert not attention_op._reads_mask_form(small_q, long_k, per_query, full)
    assert attention_op._reads_mask_form(large_q, torch.empty(4, 8, 16384, 128, device="meta"), per_query, full)
    # An additive mask is read per query row only, and only where finfo.min absorbs the scores (not float16's).
    for dtype, reads in ((torch.bfloat16, True), (torch.float32, True), (torch.float16, False)):
        additive = torch.empty(4, 4096, 16384, dtype=dtype, device="meta")
        long_k = torch.empty(4, 8, 16384, 128, dtype=dtype, device="meta")
        assert attention_op._reads_mask_form(large_q.to(dtype), long_k, additive, full) == reads
        assert not attention_op._reads_mask_form(large_q.to(dtype), long_k, additive[:, 0], full)


def test_an_sdpa_calls_rows_that_see_no_key_get_the_derivative_of_what_sdpa_computes():
    """SDPA with a finfo.min mask per query row in training, rows that see no key (causal under left padding, GQA):
    compiled with the backend, output and gradients are those of SDPA's math backend in float64, the derivative of
    the function SDPA computes. (torch's fused CPU backward recomputes such a row's weights from a log-sum-exp that
    absorbed log Sk, so eager's default gradients there are Sk times these: docs/benchmarks.md session 43.)"""
    from helpers import Recorder
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, hq, hkv, s, d = 2, 4, 2, 6, 8
    keys = torch.arange(s)[None, :] >= torch.tensor([0, 3])[:, None]
    allowed = (torch.ones(s, s, dtype=torch.bool).tril()[None] & keys[:, None, :])[:, None]  # [B, 1, Sq, Sk]: batch
    # 1's first 3 rows see no key

    def fn(q, k, v, allowed):
        bias = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, torch.finfo(q.dtype).min)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)

    q = torch.randn(b, hq, s, d)
    k, v = torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d)
    grad = torch.randn(b, hq, s, d)

    def outputs(f, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = f(*leaves, allowed)
        return (out, *torch.autograd.grad(out, leaves, grad.to(dtype)))

    torch._dynamo.reset()
    recorder = Recorder()
    got = outputs(torch.compile(fn, backend=recorder, fullgraph=True), torch.float32)
    assert recorder.count() == 1, recorder.reasons
    assert "rows that see no key: mean of V" in recorder.records[0].detail, recorder.records
    with sdpa_kernel(SDPBackend.MATH):
        expected = outputs(fn, torch.float64)
    assert expected[1][1, :, :3].abs().max() > 0.1  # the blind rows' gradient is not zero
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected):
        torch.testing.assert_close(g.double(), e, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_blind_rows_as_eagers_gives_eagers_values_and_gradients():
    """Eager code's finfo.min mask, left padding under a causal band, GQA: rows that see no key are the mean of V, and
    eager's softmax passes them a gradient to q and k (and V through P^T dO); the op with the key mask plus
    `blind_rows_as_eagers` gives the same output and gradients, float64, on fresh random inputs."""
    from fa4_inductor.kernels.attention import blind_rows_as_eagers

    b, hq, hkv, s, d, scale = 2, 4, 2, 6, 8, 0.3
    q = torch.randn(b, hq, s, d, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, hkv, s, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    keys = torch.arange(s)[None, :] >= torch.tensor([0, 3])[:, None]
    allowed = torch.ones(s, s, dtype=torch.bool).tril()[None] & keys[:, None, :]

    def eager(q, k, v):
        scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) * scale
        mask = torch.zeros(b, 1, s, s, dtype=q.dtype).masked_fill(~allowed[:, None], torch.finfo(q.dtype).min)
        return torch.softmax(scores + mask, -1) @ v.repeat_interleave(2, 1)

    def ours(q, k, v):
        out, lse = ATTENTION(q, k, v, None, keys, scale=scale, causal=True)
        assert (lse[1, :, :3] == float("-inf")).all()  # the blind rows the fix-up replaces
        return blind_rows_as_eagers(out, lse, q, k, v, scale)

    grad = torch.randn(b, hq, s, d, dtype=torch.float64)
    expected, got = eager(q, k, v), ours(q, k, v)
    torch.testing.assert_close(got, expected)
    for name, g, e in zip("qkv", torch.autograd.grad(got, (q, k, v), grad),
                          torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(g, e, msg=lambda m: f"d{name}: {m}")
