"""Masks built by `torch.vmap` over index functions (`lowering/vmapped_masks.py`): transformers 4.53 to 4.57 build every
mask so, transformers 5 its custom ones. Each mask here is vmapped over (batch, head, q, kv) index vectors as those
releases do, and must reach the op as the band and key mask it computes, with eager's output."""

from __future__ import annotations

import expecttest
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fa4_inductor.lowering import vmapped_masks
from fa4_inductor.lowering.passes import _fake_mode_of_graph
from helpers import Recorder, compile_and_record


def over_indices(mask_fn):
    """mask_fn(b, h, q, kv) of 0-d indices, vmapped over four index vectors: [B, 1, Sq, Sk] (kv innermost)."""
    for dims in ((None, None, None, 0), (None, None, 0, None), (None, 0, None, None), (0, None, None, None)):
        mask_fn = torch.vmap(mask_fn, in_dims=dims, out_dims=0)
    return mask_fn


def indices(batch, sq, sk, offset=0):
    kv = torch.arange(sk)
    kv += 0  # transformers 4.57 offsets its kv positions in place
    return torch.arange(batch), torch.arange(1), torch.arange(sq) + offset, kv


def causal(b, h, q, kv):
    return kv <= q


def sliding(window):
    return lambda b, h, q, kv: q.new_ones((), dtype=torch.bool) & (kv > q - window) & (kv <= q)


def padded(keep):
    """Causal and `keep[b, kv]` (transformers' boolean attention_mask, looked up per index)."""
    return lambda b, h, q, kv: (kv <= q) & keep[b, kv]


def inputs(b=2, h=4, s=8, d=16, sk=None):
    sk = sk or s
    return torch.randn(b, h, s, d), torch.randn(b, h, sk, d), torch.randn(b, h, sk, d)


class TestVmappedMasks(expecttest.TestCase):
    def check(self, fn, *args):
        torch._dynamo.reset()
        recorder, out = compile_and_record(fn, *args)
        torch.testing.assert_close(out, fn(*args), atol=1e-5, rtol=1e-5)
        return recorder

    def test_causal(self):
        def fn(q, k, v):
            mask = over_indices(causal)(*indices(q.shape[0], q.shape[2], k.shape[2]))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        self.assertExpectedInline(self.check(fn, *inputs()).summary, """\
getitem: i64[2, 1, 1, 1] = getitem(arange(2), (:, None, None, None))
getitem_1: i64[1, 1, 1, 1] = getitem(arange(1), (None, :, None, None))
fa4_attention: (f32[2, 4, 8, 16], f32[2, 4, 8]) = fa4.attention(q, k, v, scale=0.25, causal=True)
attention_out: f32[2, 4, 8, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 8, 16] = .contiguous(attention_out)""")

    def test_sliding_window_as_eager_code_adds_it(self):
        def fn(q, k, v):
            visible = over_indices(sliding(3))(*indices(q.shape[0], q.shape[2], k.shape[2]))
            scores = q @ k.transpose(-1, -2) * 0.25 + torch.where(visible, 0.0, torch.finfo(q.dtype).min)
            return torch.softmax(scores, -1) @ v

        self.assertExpectedInline(self.check(fn, *inputs()).summary, """\
getitem: i64[2, 1, 1, 1] = getitem(arange(2), (:, None, None, None))
getitem_1: i64[1, 1, 1, 1] = getitem(arange(1), (None, :, None, None))
fa4_attention: (f32[2, 4, 8, 16], f32[2, 4, 8]) = fa4.attention(q, k, v, scale=0.25, causal=True, window_left=2)
attention_out: f32[2, 4, 8, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 8, 16] = .contiguous(attention_out)""")

    def test_left_padding_is_a_key_mask(self):
        keep = torch.ones(2, 8, dtype=torch.long)
        keep[1, :3] = 0

        def fn(q, k, v, keep):
            mask = over_indices(padded(keep.bool()))(*indices(q.shape[0], q.shape[2], k.shape[2]))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        recorder = self.check(fn, *inputs(), keep)
        assert recorder.count() == 1 and not recorder.reasons, recorder.records
        assert "key_mask=padding mask" in recorder.records[0].detail and "causal=True" in recorder.records[0].detail

    def test_decode_over_a_cache(self):
        """One query at position 11 over 12 cached keys, left-padded: the causal band at the cache's offset."""
        keep = torch.ones(2, 12, dtype=torch.long)
        keep[0, :2] = 0

        def fn(q, k, v, keep):
            mask = over_indices(padded(keep.bool()))(*indices(q.shape[0], 1, k.shape[2], offset=k.shape[2] - 1))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        recorder = self.check(fn, *inputs(s=1, sk=12), keep)
        assert recorder.count() == 1 and "key_mask=padding mask" in recorder.records[0].detail, recorder.records

    def test_a_body_that_is_not_per_index_stays_as_written(self):
        """A mask function that reduces over a tensor per index is not broadcast: the vmap is kept, and the mask with
        it, with the reason."""
        table = torch.randn(8, 8)

        def fn(q, k, v, table):
            mask = over_indices(lambda b, h, i, j: (j <= i) & (table[i].sum() > -100))(
                *indices(q.shape[0], q.shape[2], k.shape[2]))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        torch._dynamo.reset()
        recorder = Recorder(run_time_masks=False)
        q, k, v = inputs()
        torch.testing.assert_close(torch.compile(fn, backend=recorder)(q, k, v, table), fn(q, k, v, table))
        assert recorder.count() == 0 and "mask not recognized" in recorder.reasons[0], recorder.reasons
        graph = recorder.graphs[0].graph
        assert any(n.target is torch._functorch.predispatch._add_batch_dim for n in graph.nodes)


COMBINE = {"or": lambda a, b: a | b, "and": lambda a, b: a & b, "xor": lambda a, b: a ^ b, "and not": lambda a, b: a & ~b}


def check_unvmapped_mask(batch, sq, sk, offset, window, combine, seed):
    """The rewritten region computes the vmap's mask, element for element, with its shape and strides."""
    keep = torch.randint(0, 2, (batch, sk), generator=torch.Generator().manual_seed(seed))

    def fn(keep):
        idx = indices(batch, sq, sk, offset)
        return COMBINE[combine](over_indices(sliding(window))(*idx), over_indices(padded(keep.bool()))(*idx))

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(vmapped_masks.unvmap(gm, _fake_mode_of_graph(gm)))
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(fn, backend=backend, fullgraph=True)(keep)
    expected = fn(keep)
    assert graphs == [2]
    assert torch.equal(got, expected) and got.stride() == expected.stride()


@pytest.mark.parametrize("combine", sorted(COMBINE))
def test_unvmapped_masks_equal_the_vmapped_ones_for_each_combination(combine):
    check_unvmapped_mask(batch=2, sq=3, sk=7, offset=2, window=3, combine=combine, seed=len(combine))


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 3), sq=st.integers(1, 6), sk=st.integers(1, 9), offset=st.integers(0, 5),
       window=st.integers(1, 5), combine=st.sampled_from(sorted(COMBINE)), seed=st.integers(0, 2 ** 16))
def test_unvmapped_masks_equal_the_vmapped_ones(batch, sq, sk, offset, window, combine, seed):
    check_unvmapped_mask(batch, sq, sk, offset, window, combine, seed)
