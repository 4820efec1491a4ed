"""K/V head repetition folded into GQA: every spelling reaches `fa4::attention` with K/V un-repeated."""

import expecttest
import pytest
import torch
import torch.nn.functional as F

import upstream
from helpers import compile_and_record


SPELLINGS = {
    "repeat_kv": lambda x, r: upstream.repeat_kv(x, r),
    "repeat_interleave_method": lambda x, r: x.repeat_interleave(r, dim=1),
    "repeat_interleave_function": lambda x, r: torch.repeat_interleave(x, r, dim=1),
    "unsqueeze_expand_reshape": lambda x, r: x.unsqueeze(2).expand(-1, -1, r, -1, -1).reshape(x.shape[0], -1, *x.shape[2:]),
    "unsqueeze_expand_flatten": lambda x, r: x.unsqueeze(2).expand(-1, -1, r, -1, -1).flatten(1, 2),
}


def inputs(hq=8, hkv=2, s=5, d=16):
    return torch.randn(2, hq, s, d), torch.randn(2, hkv, s, d), torch.randn(2, hkv, s, d)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_is_folded(spelling):
    rep = SPELLINGS[spelling]

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, rep(k, 4), rep(v, 4), is_causal=True)

    q, k, v = inputs()
    rec, out = compile_and_record(fn, q, k, v)
    torch.testing.assert_close(out, fn(q, k, v), atol=1e-5, rtol=1e-5)
    (node,) = [n for g in rec.graphs for n in g.graph.nodes if n.target is torch.ops.fa4.attention.default]
    assert [a.name for a in node.args] == ["l_q_", "l_k_", "l_v_"]  # K/V straight from the inputs
    # op, getitem, contiguous (a graph output keeps eager's layout), output: nothing of the repetition is left
    assert len([n for g in rec.graphs for n in g.graph.nodes if n.op != "placeholder"]) == 4, rec.summary
    assert "folded, group 4" in rec.records[0].detail


class TestGqaGraphs(expecttest.TestCase):
    def test_repeat_kv_handwritten(self):
        def fn(q, k, v):
            k, v = upstream.repeat_kv(k, 4), upstream.repeat_kv(v, 4)
            return torch.softmax(q @ k.transpose(2, 3) * 0.25, dim=-1) @ v

        rec, out = compile_and_record(fn, *inputs())
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 8, 5, 16], f32[2, 8, 5]) = fa4.attention(q, k, v, scale=0.25)
attention_out: f32[2, 8, 5, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 8, 5, 16] = .contiguous(attention_out)""")
        self.assertExpectedInline(str(rec.records[0]), """[rewritten] handwritten test_gqa.py:46 in fn: fa4.attention(q[2x8x5x16], k[2x2x5x16], v[2x2x5x16], scale=0.25); repeat_kv folded, group 4""")

    def test_tiling_repeat_is_not_gqa(self):
        """`k.repeat(1, 4, 1, 1)` puts kv head h % Hkv at head h: not GQA; attention still rewritten, K/V as given."""

        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k.repeat(1, 4, 1, 1), v.repeat(1, 4, 1, 1))

        q, k, v = inputs()
        rec, out = compile_and_record(fn, q, k, v)
        torch.testing.assert_close(out, fn(q, k, v), atol=1e-5, rtol=1e-5)
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 8, 5, 16], f32[2, 8, 5]) = fa4.attention(q, .repeat(k, 1, 4, 1, 1), .repeat(v, 1, 4, 1, 1), scale=0.25)
attention_out: f32[2, 8, 5, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 8, 5, 16] = .contiguous(attention_out)""")

    def test_option_off_keeps_repeats(self):
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, upstream.repeat_kv(k, 4), upstream.repeat_kv(v, 4))

        rec, _ = compile_and_record(fn, *inputs(), gqa=False)
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 8, 5, 16], f32[2, 8, 5]) = fa4.attention(q, .reshape(.expand(getitem(k, (:, :, None, :, :)), 2, 2, 4, 5, 16), 2, 8, 5, 16), .reshape(.expand(getitem(v, (:, :, None, :, :)), 2, 2, 4, 5, 16), 2, 8, 5, 16), scale=0.25)
attention_out: f32[2, 8, 5, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 8, 5, 16] = .contiguous(attention_out)""")
