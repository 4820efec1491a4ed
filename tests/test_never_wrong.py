"""Regressions from fuzzing (issue 11): each case gives eager's answer, rewritten or declined with its reason.

Every function below once compiled to a silent wrong result or to an error eager does not raise."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fa4_inductor
import upstream
from helpers import Recorder, compile_and_record

B, H, S, D = 2, 4, 16, 32


def prefix_lm(q, k, v):
    m = torch.tril(torch.ones(S, S, dtype=torch.bool))
    m[:, :3] = True
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def tril_in_place(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(S, S, dtype=torch.bool).tril_())


def bias_filled_in_place(q, k, v):
    bias = torch.zeros(S, S)
    bias.masked_fill_(~torch.tril(torch.ones(S, S, dtype=torch.bool)), -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def decode_offset_in_place(q, k, v):
    i = torch.arange(4)
    i.add_(12)
    return F.scaled_dot_product_attention(q[:, :, :4], k, v, attn_mask=torch.arange(S)[None, :] <= i[:, None])


def k_scaled_after_its_read(q, k, v):
    k = k.clone()
    s = q @ k.transpose(-2, -1) * 0.125
    k.mul_(2.0)
    return s.softmax(-1) @ v


def source_scaled_after_repeat(q, k, v):
    k, v = k[:, :2].clone(), v[:, :2]
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    k.mul_(3.0)
    return F.scaled_dot_product_attention(q, kr, vr)


def negative_softcap(q, k, v):
    return (torch.tanh(q @ k.transpose(-2, -1) * 0.1 / -5.0) * -5.0).softmax(-1) @ v


def floor_division(q, k, v):
    return torch.div(q @ k.transpose(-2, -1), 0.5, rounding_mode="floor").softmax(-1) @ v


def negative_scale(q, k, v):
    return ((q * -0.2) @ k.transpose(-2, -1)).softmax(-1) @ v


def mask_batch_larger_than_q(q, k, v):
    m = torch.tril(torch.ones(2, 1, S, S, dtype=torch.bool))
    return (q[:1] @ k[:1].transpose(-2, -1) * 0.1).masked_fill(~m, -math.inf).softmax(-1) @ v[:1]


def kv_batch_one(q, k, v):
    return F.scaled_dot_product_attention(q, k[:1], v[:1])


def one_query_head_four_kv_heads(q, k, v):
    return (q[:, :1] @ k.transpose(-2, -1) * 0.1).softmax(-1) @ v


def viewed_after_scaling(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2).view(B * H * S, D)


def viewed_after_bmm(q, k, v):
    q3, k3, v3 = (t.reshape(B * H, S, D) for t in (q, k, v))
    return torch.bmm(torch.softmax(torch.bmm(q3, k3.transpose(1, 2)) * 0.1, -1), v3).view(-1)


def viewed_then_written(q, k, v):
    out = F.scaled_dot_product_attention(q, k, v)
    flat = out.view(-1)
    flat.mul_(2.0)
    return out


CASES = {
    prefix_lm: "m, which it is built from, is updated in place",
    tril_in_place: "the mask is built by tril_",
    bias_filled_in_place: "bias, which it is built from, is updated in place",
    decode_offset_in_place: "i, which it is built from, is updated in place",
    k_scaled_after_its_read: "k is updated in place",
    source_scaled_after_repeat: "k is updated in place",
    negative_softcap: None,
    floor_division: "rounding_mode: floor}) between q @ k^T and softmax is not understood",
    negative_scale: "the scale factor -0.2 is not positive and finite",
    mask_batch_larger_than_q: "the attention's output has shape [2, 4, 16, 32], not q's [1, 4, 16, 32]",
    kv_batch_one: "q, k, v leading sizes 2, 1, 1 differ",
    one_query_head_four_kv_heads: "1 query heads against 4 key and 4 value heads",
    viewed_after_scaling: None,
    viewed_after_bmm: None,
    viewed_then_written: None,
}


@pytest.mark.parametrize("fn", list(CASES), ids=[f.__name__ for f in CASES])
def test_eager_answer(fn):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    expected = fn(q.clone(), k.clone(), v.clone())
    rec, out = compile_and_record(fn, q, k, v)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    reason = CASES[fn]
    if reason is None:
        assert rec.count() == 1 and not rec.reasons, rec.reasons
    else:
        assert rec.count() == 0 and len(rec.reasons) == 1 and reason in rec.reasons[0], rec.reasons


def test_viewed_output_compiles_through_inductor():
    """Inductor traces with the op's fake strides: the view after the rewrite must not fail there either."""
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    rec, out = compile_and_record(viewed_after_scaling, q, k, v, inductor=True)
    assert rec.count() == 1
    torch.testing.assert_close(out, viewed_after_scaling(q, k, v), atol=1e-5, rtol=1e-5)


def test_graph_output_is_contiguous_as_in_eager():
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    _, out = compile_and_record(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert out.is_contiguous()


def test_hf_layout_needs_no_copy():
    """HF's `out.transpose(1, 2).reshape(B, S, -1)` into a linear reads our [B, S, H, D] storage as it is."""
    proj = torch.nn.Linear(H * D, H * D)

    def fn(q, k, v):
        return proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, -1))

    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    rec, out = compile_and_record(fn, q, k, v)
    torch.testing.assert_close(out, fn(q, k, v), atol=1e-5, rtol=1e-5)
    assert rec.count() == 1 and "contiguous" not in rec.summary, rec.summary  # the rewrite adds no copy


@pytest.mark.parametrize("mask_shape", [(1, 1, 1, S), (B, 1, 1, 1), (1, 1, S, S)])
def test_bool_mask_input_broadcast(mask_shape):
    """A boolean mask input that broadcasts over batch or keys (eager broadcasts it) is read as a key mask, one per
    query row ([1, 1, S, S]: the op's [B, S, S] key mask) included."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    m = torch.rand(mask_shape) > 0.3
    m[..., 0] = True
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    rec, out = compile_and_record(fn, q, k, v, m)
    torch.testing.assert_close(out, fn(q, k, v, m), atol=1e-5, rtol=1e-5)
    assert rec.count() == 1, rec.reasons
    assert ("mask per query row" in rec.records[0].detail) == (mask_shape[2] != 1)


def test_attention_mask_with_one_row_for_the_batch():
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    am = (torch.rand(1, S) > 0.3).long()
    am[:, 0] = 1

    def bert(q, k, v, am):
        ext = (1.0 - am[:, None, None, :].float()) * torch.finfo(torch.float32).min
        return (q @ k.transpose(-2, -1) * 0.1 + ext).softmax(-1) @ v

    rec, out = compile_and_record(bert, q, k, v, am)
    assert rec.count() == 1, rec.reasons
    torch.testing.assert_close(out, bert(q, k, v, am), atol=1e-5, rtol=1e-5)


def test_is_causal_with_lengths_known_equal_only_at_run_time():
    """Under dynamic shapes Sq and Sk may be different symbols that are equal: guarded, not declined."""
    def fn(q, k1, k2, v1, v2):
        return F.scaled_dot_product_attention(q, torch.cat([k1, k2], 2), torch.cat([v1, v2], 2), is_causal=True)

    torch._dynamo.reset()
    rec = Recorder()
    compiled = torch.compile(fn, backend=rec, dynamic=True)
    for a, b in ((3, 5), (4, 7)):
        args = [torch.randn(B, H, a + b, D)] + [torch.randn(B, H, n, D) for n in (a, b, a, b)]
        torch.testing.assert_close(compiled(*args), fn(*args), atol=1e-5, rtol=1e-5)
    assert rec.count() == len(rec.graphs) and not rec.reasons, rec.reasons


class NanoGptMask(upstream.CausalSelfAttention):
    """nanoGPT's hand-written attention (its `bias` buffer mask) on given q, k, v, without dropout."""

    def __init__(self):
        super().__init__(block_size=S, dropout=0.0)

    def forward(self, q, k, v):
        return self.attend(q, k, v)


def test_mask_buffer_changed_after_compiling():
    """nanoGPT's `bias` is read by value; an update after compiling reaches the result, as with plain Inductor."""
    torch._dynamo.reset()
    module = NanoGptMask()
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    compiled = torch.compile(module, backend=fa4_inductor)
    with fa4_inductor.report.collecting() as records:
        torch.testing.assert_close(compiled(q, k, v), module(q, k, v), atol=1e-5, rtol=1e-5)
    assert [r.rewritten for r in records] == [True]
    window = torch.tril(torch.ones(S, S)) - torch.tril(torch.ones(S, S), -4)
    module.bias.copy_(window.view(1, 1, S, S))
    for _ in range(2):
        torch.testing.assert_close(compiled(q, k, v), module(q, k, v), atol=1e-5, rtol=1e-5)


def test_mask_buffer_updated_inside_the_graph():
    class Updated(NanoGptMask):
        def forward(self, q, k, v):
            self.bias[..., :2] = 1.0  # every query sees the first two keys
            return super().forward(q, k, v)

    module = Updated()
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    expected = Updated()(q, k, v)
    rec, out = compile_and_record(module, q, k, v)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert rec.count() == 0 and "is updated in place" in rec.reasons[0], rec.reasons
