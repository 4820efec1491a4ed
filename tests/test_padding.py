"""Key-padding masks from a run-time `attention_mask` (lowering/padding.py): by default
`fa4::attention(..., key_mask=mask != 0)`, exact for any padding; under `checked_padding=True`, FA4's fast
paths with in-graph checks (encoders: seqused_k = mask.sum(-1), right padding asserted; decoders: the
mask dropped, asserted to hide nothing)."""

import expecttest
import pytest
import torch
import torch.nn.functional as F

import upstream
from helpers import Recorder, compile_and_record

B, H, S, D = 3, 4, 8, 16


def qkv():
    return torch.randn(B, H, S, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)


def right_padding(lengths=(8, 5, 1)):
    return (torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]).long()


def hf_padding_mask_sdpa(q, k, v, attention_mask):
    """HF masking_utils for a bidirectional encoder: `mask[batch_idx, kv_idx]` broadcast over queries."""
    mask = upstream.padding_mask(attention_mask, q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def bert_extended_mask_handwritten(q, k, v, attention_mask):
    """BERT-style `(1.0 - mask[:, None, None, :]) * finfo.min` added to hand-written scores."""
    extended = (1.0 - attention_mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + extended
    return scores.softmax(-1) @ v


def layoutlm_extended_mask_sdpa(q, k, v, attention_mask):
    """LayoutLM's extended mask: the same as BERT's, built by `unsqueeze(1).unsqueeze(2)`, handed to SDPA."""
    extended = (1.0 - attention_mask.unsqueeze(1).unsqueeze(2).to(q.dtype)) * torch.finfo(q.dtype).min
    return F.scaled_dot_product_attention(q, k, v, attn_mask=extended)


def causal_band_and_key_mask_sdpa(q, k, v, attention_mask):
    """HF decoders' SDPA mask: `causal & padding`, a causal band and a run-time key mask."""
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal & attention_mask.bool()[:, None, None, :])


def causal_band_and_key_mask_additive(q, k, v, attention_mask):
    """HF eager attention: `causal & padding` as one additive finfo.min mask on hand-written scores."""
    keep = torch.ones(S, S, dtype=torch.bool).tril() & attention_mask.bool()[:, None, None, :]
    bias = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, torch.finfo(q.dtype).min)
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + bias, dim=-1) @ v


class TestPadding(expecttest.TestCase):
    def check(self, fn, mask, **options):
        q, k, v = qkv()
        rec, out = compile_and_record(fn, q, k, v, mask, **options)
        torch.testing.assert_close(out, fn(q, k, v, mask), atol=1e-5, rtol=1e-5)  # every row, padded ones too
        return rec

    def test_hf_padding_mask(self):
        rec = self.check(hf_padding_mask_sdpa, right_padding())
        self.assertExpectedInline(rec.summary, """\
narrow: b8[3, 8] = narrow(.to(attention_mask, bool), 1, 0, 8)
key_mask: b8[3, 8] = fa4.key_mask(narrow)
fa4_attention: (f32[3, 4, 8, 16], f32[3, 4, 8]) = fa4.attention(q, k, v, None, key_mask, scale=0.25)
attention_out: f32[3, 4, 8, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[3, 4, 8, 16] = .contiguous(attention_out)""")

    def test_encoder_masks_of_any_padding_match_eager(self):
        """Left padding, holes and an all-padding sequence (zeros for SDPA's boolean mask, the mean of V for
        BERT's finfo.min mask: what eager gives rows that see no key)."""
        q, k, v = qkv()
        left, empty_row = right_padding().flip(-1), right_padding((8, 5, 0))
        holes = (torch.rand(B, S, generator=torch.Generator().manual_seed(1)) > 0.4).long()
        for fn in (hf_padding_mask_sdpa, bert_extended_mask_handwritten, layoutlm_extended_mask_sdpa):
            torch._dynamo.reset()
            recorder = Recorder()
            compiled = torch.compile(fn, backend=recorder)
            for mask in (right_padding(), left, empty_row, holes):
                torch.testing.assert_close(compiled(q, k, v, mask), fn(q, k, v, mask), atol=1e-5, rtol=1e-5)
            assert recorder.count() == 1 and len(recorder.graphs) == 1

    def test_hf_padding_mask_checked(self):
        rec = self.check(hf_padding_mask_sdpa, right_padding(), checked_padding=True)
        self.assertExpectedInline(rec.summary, """\
eq: b8[3, 8] = eq(.to(attention_mask, bool), 0)
eq_1: b8[3, 8] = eq(.to(attention_mask, bool), 1)
or_: b8[3, 8] = or_(eq, eq_1)
all: b8[] = .all(or_)
getitem: b8[3, 7] = getitem(.to(attention_mask, bool), (:, 1:))
getitem_1: b8[3, 7] = getitem(.to(attention_mask, bool), (:, :-1))
le: b8[3, 7] = le(getitem, getitem_1)
all_1: b8[] = .all(le)
getitem_2: b8[3] = getitem(.to(attention_mask, bool), (:, 0))
eq_2: b8[3] = eq(getitem_2, 1)
all_2: b8[] = .all(eq_2)
and_: b8[] = and_(all, all_1)
and__1: b8[] = and_(and_, all_2)
_assert_async: NoneType = _assert_async(and__1, 'fa4_inductor: the attention mask is not right padding (1...1 0...0 per row, first key visible); this graph was compiled for right-padded masks. Compile without fa4_inductor.backend(checked_padding=True) for other masks.')
ne: b8[3, 8] = ne(.to(attention_mask, bool), 0)
seqused_k: i32[3] = .sum(ne, -1, dtype=int32)
fa4_attention: (f32[3, 4, 8, 16], f32[3, 4, 8]) = fa4.attention(q, k, v, seqused_k, scale=0.25)
attention_out: f32[3, 4, 8, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[3, 4, 8, 16] = .contiguous(attention_out)""")

    def test_bert_extended_mask(self):
        rec = self.check(bert_extended_mask_handwritten, right_padding())
        self.assertEqual(rec.count(), 1)
        self.assertIn("key_mask=padding mask, rows that see no key: mean of V, scale=0.25)", rec.records[0].detail)
        rec = self.check(bert_extended_mask_handwritten, right_padding(), checked_padding=True)
        self.assertIn("seqused_k=padding mask sum, scale=0.25)", rec.records[0].detail)

    def test_a_key_mask_unsqueezed_in_steps(self):
        rec = self.check(layoutlm_extended_mask_sdpa, right_padding())
        self.assertEqual(rec.count(), 1)
        self.assertIn("key_mask=padding mask", rec.records[0].detail)

    def test_masks_that_are_not_right_padding_raise_under_checked_padding(self):
        q, k, v = qkv()
        left, empty_row, not_binary = right_padding().flip(-1), right_padding((8, 5, 0)), right_padding() * 2
        for fn, bad_masks in ((hf_padding_mask_sdpa, (left, empty_row)),
                              (bert_extended_mask_handwritten, (left, empty_row, not_binary))):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=Recorder(checked_padding=True))
            compiled(q, k, v, right_padding())
            for bad in bad_masks:
                with pytest.raises(RuntimeError, match="not right padding"):
                    compiled(q, k, v, bad)

    def test_causal_band_and_padding_become_causal_with_a_key_mask(self):
        """`causal & padding` (HF decoders), by default: the op takes the mask; left padding, right padding and
        holes all match eager, left-padded rows (no visible key) included: zeros, as SDPA's safe softmax gives."""
        rec = self.check(causal_band_and_key_mask_sdpa, right_padding())
        self.assertExpectedInline(rec.summary, """\
narrow: b8[3, 8] = narrow(.bool(attention_mask), 1, 0, 8)
key_mask: b8[3, 8] = fa4.key_mask(narrow)
fa4_attention: (f32[3, 4, 8, 16], f32[3, 4, 8]) = fa4.attention(q, k, v, None, key_mask, scale=0.25, causal=True)
attention_out: f32[3, 4, 8, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[3, 4, 8, 16] = .contiguous(attention_out)""")
        q, k, v = qkv()
        compiled = torch.compile(causal_band_and_key_mask_sdpa, backend=Recorder())
        holes = (torch.rand(B, S, generator=torch.Generator().manual_seed(0)) > 0.4).long()
        for mask in (right_padding().flip(-1), right_padding(), holes):
            torch.testing.assert_close(compiled(q, k, v, mask), causal_band_and_key_mask_sdpa(q, k, v, mask))

    def test_hf_eager_key_mask_rows_that_see_no_key_get_the_mean_of_v(self):
        """HF's eager attention: one additive finfo.min mask; a left-padded query row sees no key, and eager's
        softmax over equal scores gives the mean of V over all keys, which the rewrite reproduces."""
        rec = self.check(causal_band_and_key_mask_additive, right_padding().flip(-1))
        self.assertEqual(rec.count(), 1)
        self.assertIn("key_mask=padding mask, rows that see no key: mean of V", rec.records[0].detail)

    def test_minus_inf_key_mask_in_a_handwritten_softmax_keeps_its_mask(self):
        def fn(q, k, v, attention_mask):
            keep = torch.ones(S, S, dtype=torch.bool).tril() & attention_mask.bool()[:, None, None, :]
            return (q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf")).softmax(-1) @ v

        rec = self.check(fn, right_padding())
        self.assertEqual(rec.count(), 0)
        self.assertIn("NaN, or weighted over part of the keys or by its scores, in eager", rec.reasons[0])

    def test_checked_padding_causal_band_with_an_unpadded_mask(self):
        """`backend(checked_padding=True)`: FA4's fast path, exact when the mask hides nothing, which a run-time
        check asserts."""
        fn = causal_band_and_key_mask_sdpa
        rec = self.check(fn, torch.ones(B, S, dtype=torch.long), checked_padding=True)
        self.assertExpectedInline(rec.summary, """\
ne: b8[3, 8] = ne(.bool(attention_mask), 0)
all: b8[] = .all(ne)
_assert_async: NoneType = _assert_async(all, 'fa4_inductor: the attention mask hides keys that the causal mask shows (a padded batch); this graph was compiled for unpadded input. Compile without fa4_inductor.backend(checked_padding=True) for padded batches.')
fa4_attention: (f32[3, 4, 8, 16], f32[3, 4, 8]) = fa4.attention(q, k, v, scale=0.25, causal=True)
attention_out: f32[3, 4, 8, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[3, 4, 8, 16] = .contiguous(attention_out)""")
        compiled = torch.compile(fn, backend=Recorder(checked_padding=True))
        with pytest.raises(RuntimeError, match="hides keys that the causal mask shows"):
            compiled(*qkv(), right_padding())

    def test_fallback_padding_option_off(self):
        rec = self.check(hf_padding_mask_sdpa, right_padding(), padding=False)
        self.assertEqual(rec.reasons, ["a run-time key-padding mask, and the padding option is off"])

    def test_boolean_mask_input_broadcast_over_queries_is_a_key_mask(self):
        """HF `generate` with a static cache hands decode steps a boolean [B, 1, 1, Sk] mask as an input."""
        def fn(q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        q, k, v = qkv()
        q = q[:, :, :1]
        mask = torch.rand(B, 1, 1, S, generator=torch.Generator().manual_seed(2)) > 0.3
        mask[-1] = False  # a sequence that sees no key: zeros, as SDPA gives
        rec, out = compile_and_record(fn, q, k, v, mask)
        torch.testing.assert_close(out, fn(q, k, v, mask))
        self.assertExpectedInline(rec.summary, """\
getitem: b8[3, 8] = getitem(mask, (:, 0, 0))
narrow: b8[3, 8] = narrow(getitem, 1, 0, 8)
key_mask: b8[3, 8] = fa4.key_mask(narrow)
fa4_attention: (f32[3, 4, 1, 16], f32[3, 4, 1]) = fa4.attention(q, k, v, None, key_mask, scale=0.25)
attention_out: f32[3, 4, 1, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[3, 4, 1, 16] = .contiguous(attention_out)""")
        float_mask = torch.zeros(B, 1, 1, S).masked_fill(~mask, -1e4)  # values unknown when compiling: kept
        rec, _ = compile_and_record(fn, q, k, v, float_mask)
        self.assertEqual(rec.count(), 0)
        self.assertIn("only a boolean [B, 1, Sq or 1, Sk] input is read", rec.reasons[0])

    def test_boolean_mask_input_per_query_row_is_a_3d_key_mask(self):
        """HF `generate` with a static cache hands a padded batch's prefill a boolean [B, 1, Sq, Sk] mask input
        (built outside the forward): it reaches the op as its [B, Sq, Sk] key_mask, exact for any contents."""
        def fn(q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        q, k, v = qkv()
        q = q[:, :, :5]
        mask = torch.rand(B, 1, 5, S, generator=torch.Generator().manual_seed(3)) > 0.4
        mask[0, 0, 1] = False  # a row that sees no key: zeros, as SDPA gives
        rec, out = compile_and_record(fn, q, k, v, mask)
        torch.testing.assert_close(out, fn(q, k, v, mask))
        self.assertExpectedInline(rec.summary, """\
getitem: b8[3, 5, 8] = getitem(mask, (:, 0))
key_mask: b8[3, 5, 8] = fa4.key_mask(getitem)
fa4_attention: (f32[3, 4, 5, 16], f32[3, 4, 5]) = fa4.attention(q, k, v, None, key_mask, scale=0.25)
attention_out: f32[3, 4, 5, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[3, 4, 5, 16] = .contiguous(attention_out)""")
        self.assertIn("key_mask=mask per query row", rec.records[0].detail)

        one = mask[:1]  # one mask for the whole batch: expanded
        rec, out = compile_and_record(fn, q, k, v, one)
        torch.testing.assert_close(out, fn(q, k, v, one))
        self.assertExpectedInline(rec.summary, """\
getitem: b8[1, 5, 8] = getitem(mask, (:, 0))
expand: b8[3, 5, 8] = .expand(getitem, 3, 5, 8)
key_mask: b8[3, 5, 8] = fa4.key_mask(expand)
fa4_attention: (f32[3, 4, 5, 16], f32[3, 4, 5]) = fa4.attention(q, k, v, None, key_mask, scale=0.25)
attention_out: f32[3, 4, 5, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[3, 4, 5, 16] = .contiguous(attention_out)""")

        column = mask[:, :, :, :1]  # one column for every key: declined, with the reason
        rec, out = compile_and_record(fn, q, k, v, column)
        torch.testing.assert_close(out, fn(q, k, v, column))
        self.assertEqual(rec.reasons, ["a boolean mask input of shape [3, 1, 5, 1] for 5 queries over 8 keys (its rows "
                                       "or columns broadcast)"])


@pytest.mark.parametrize("mask_rows", ["key", "per query"])
def test_every_layer_gets_the_same_key_mask_tensor(monkeypatch, mask_rows):
    """The op reads a key mask's form on the host once and remembers it by the tensor's identity
    (kernels/attention.py, `key_mask_form`): every layer must be handed one tensor, made by `fa4::key_mask`, not a
    view Inductor recreates per layer or a buffer it recomputes per layer (and may reuse for other contents)."""
    from fa4_inductor.kernels import reference

    seen = []
    forward = reference.forward

    def recording(q, k, v, seqused_k=None, key_mask=None, **flags):
        seen.append(key_mask)
        return forward(q, k, v, seqused_k, key_mask, **flags)

    monkeypatch.setattr(reference, "forward", recording)

    def layers(q, k, v, mask):
        for _ in range(3):
            q = F.scaled_dot_product_attention(q, k, v, attn_mask=mask) + q
        return q

    q, k, v = qkv()
    mask = right_padding()[:, None, None, :].bool()
    if mask_rows == "per query":
        mask = mask & torch.ones(S, S, dtype=torch.bool).tril()
    rec, out = compile_and_record(layers, q, k, v, mask, inductor=True)
    torch.testing.assert_close(out, layers(q, k, v, mask))
    assert rec.count() == 3 and len(seen) == 3
    assert all(m is seen[0] for m in seen), [id(m) for m in seen]
