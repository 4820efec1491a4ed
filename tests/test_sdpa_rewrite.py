"""`F.scaled_dot_product_attention` calls -> `fa4::attention` (graph capture + numerics + fallbacks)."""

import expecttest
import torch
import torch.nn.functional as F

import upstream
from helpers import compile_and_record


def inputs(hq=4, hkv=4, s=6, d=8, dtype=torch.float32):
    return torch.randn(2, hq, s, d, dtype=dtype), torch.randn(2, hkv, s, d, dtype=dtype), torch.randn(2, hkv, s, d, dtype=dtype)


class TestSdpaRewrite(expecttest.TestCase):
    def check(self, fn, *args, **options):
        rec, out = compile_and_record(fn, *args, **options)
        torch.testing.assert_close(out, fn(*args), atol=1e-5, rtol=1e-5)
        return rec

    def test_plain(self):
        rec = self.check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *inputs())
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 4, 6, 8], f32[2, 4, 6]) = fa4.attention(q, k, v, scale=0.353553)
attention_out: f32[2, 4, 6, 8] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 6, 8] = .contiguous(attention_out)""")

    def test_is_causal_and_scale(self):
        rec = self.check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3), *inputs())
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 4, 6, 8], f32[2, 4, 6]) = fa4.attention(q, k, v, scale=0.3, causal=True)
attention_out: f32[2, 4, 6, 8] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 6, 8] = .contiguous(attention_out)""")

    def test_enable_gqa(self):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
        rec = self.check(fn, *inputs(hq=8, hkv=2))
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 8, 6, 8], f32[2, 8, 6]) = fa4.attention(q, k, v, scale=0.353553, causal=True)
attention_out: f32[2, 8, 6, 8] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 8, 6, 8] = .contiguous(attention_out)""")

    def test_boolean_tril_mask_becomes_causal(self):
        def fn(q, k, v):
            s = q.shape[-2]
            mask = torch.ones(s, s, dtype=torch.bool).tril()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        rec = self.check(fn, *inputs())
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 4, 6, 8], f32[2, 4, 6]) = fa4.attention(q, k, v, scale=0.353553, causal=True)
attention_out: f32[2, 4, 6, 8] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 6, 8] = .contiguous(attention_out)""")

    def test_additive_sliding_window_mask(self):
        def fn(q, k, v):
            s = q.shape[-2]
            band = torch.ones(s, s).tril().triu(-2)
            additive = torch.zeros(s, s).masked_fill(band == 0, float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=additive)

        rec = self.check(fn, *inputs())
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 4, 6, 8], f32[2, 4, 6]) = fa4.attention(q, k, v, scale=0.353553, causal=True, window_left=2)
attention_out: f32[2, 4, 6, 8] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 6, 8] = .contiguous(attention_out)""")

    def test_hf_sliding_window_mask(self):
        """HF masking_utils: `new_ones(()) & (kv_idx > q_idx - W) & (kv_idx <= q_idx)` over arange positions."""
        def fn(q, k, v):
            mask = upstream.sliding_window_mask(torch.arange(q.shape[2]) + 0, torch.arange(k.shape[2]) + 0, 3)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(q.shape[0], -1, -1, -1))

        rec = self.check(fn, *inputs())
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 4, 6, 8], f32[2, 4, 6]) = fa4.attention(q, k, v, scale=0.353553, causal=True, window_left=2)
attention_out: f32[2, 4, 6, 8] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 6, 8] = .contiguous(attention_out)""")

    def test_autocast_region_casts_q_k_v_as_autocast_does(self):
        """Inside `torch.autocast`, SDPA runs in autocast's dtype whatever its inputs' (HF's RoPE hands float32 q, k
        next to a bfloat16 v): the op gets them cast to it; its output is SDPA's, bfloat16."""
        def fn(q, k, v):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        q, k, v = inputs(s=16, d=16)
        v = v.bfloat16()
        rec, out = compile_and_record(fn, q, k, v)
        expected = fn(q, k, v)
        assert out.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
        self.assertExpectedInline(rec.summary, """\
q_autocast: bf16[2, 4, 16, 16] = .to(q, bfloat16)
k_autocast: bf16[2, 4, 16, 16] = .to(k, bfloat16)
fa4_attention: (bf16[2, 4, 16, 16], f32[2, 4, 16]) = fa4.attention(q_autocast, k_autocast, v, scale=0.25, causal=True)
attention_out: bf16[2, 4, 16, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: bf16[2, 4, 16, 16] = .contiguous(attention_out)""")
        self.assertIn("q, k, v cast to bfloat16 as autocast does", rec.records[0].detail)

        def outside(q, k, v):  # autocast around the compiled call: the state Dynamo compiled (and guards) under
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        with torch.autocast("cpu", dtype=torch.bfloat16):
            rec, out = compile_and_record(outside, q, k, v)
            expected = outside(q, k, v)
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
        self.assertEqual(rec.count(), 1)

        def disabled(q, k, v):  # autocast turned off inside: float32 q, k against a bfloat16 v is an error in eager
            with torch.autocast("cpu", enabled=False):
                return F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v, is_causal=True)

        with torch.autocast("cpu", dtype=torch.bfloat16):
            rec, out = compile_and_record(disabled, q, k, v)
        self.assertEqual(rec.count(), 1)
        self.assertNotIn("autocast", rec.records[0].detail)

    def test_mask_built_outside_a_checkpoint_region(self):
        """A mask built before a `torch.utils.checkpoint` region enters its subgraph as an input: proven in the
        enclosing graph when it is pure structure, not when it was updated in place there first."""
        from torch.utils.checkpoint import checkpoint

        def attend(q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

        def clean(q, k, v):
            m = torch.ones(6, 6, dtype=torch.bool).tril()
            return checkpoint(attend, q, k, v, m, use_reentrant=False)

        def updated(q, k, v):
            m = torch.ones(6, 6, dtype=torch.bool).tril()
            m[0, 3] = True  # no longer a band
            return checkpoint(attend, q, k, v, m, use_reentrant=False)

        rec = self.check(clean, *inputs())
        self.assertEqual([r.detail for r in rec.records], ["fa4.attention(q[2x4x6x8], k[2x4x6x8], v[2x4x6x8], "
                                                           "scale=0.353553, causal=True)"])
        rec = self.check(updated, *inputs())
        self.assertEqual(rec.count(), 0)
        self.assertIn("the graph input", rec.reasons[0])

    def test_fallback_dropout(self):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)  # noqa: E731
        rec, _ = compile_and_record(fn, *inputs())
        self.assertEqual(rec.count(), 0)
        self.assertEqual(rec.reasons, ["dropout_p=0.1 (dropout is not supported)"])

    def test_fallback_mask_from_input(self):
        fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
        rec = self.check(fn, *inputs(), torch.randn(6, 6))
        self.assertEqual(rec.count(), 0)
        self.assertEqual(rec.reasons, ["mask not recognized: the mask is the graph input l_m_; its values are unknown when "
                                       "compiling (only a boolean [B, 1, Sq or 1, Sk] input is read, as a key mask)"])

    def test_fallback_head_dim(self):
        rec = self.check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *inputs(d=12))
        self.assertEqual(rec.count(), 0)
        self.assertEqual(rec.reasons, ["head_dim 12 is not a multiple of 8 in 8..256"])

    def test_fallback_causal_not_square(self):
        q, k, v = inputs()
        rec = self.check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q[:, :, :3], k, v)
        self.assertEqual(rec.count(), 0)
        self.assertIn("is_causal needs seqlen_q == seqlen_k (3 vs 6)", rec.reasons[0])

    def test_option_off(self):
        rec = self.check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *inputs(), sdpa=False)
        self.assertEqual((rec.count(), rec.records), (0, []))
