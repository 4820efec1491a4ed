"""KV-cache attention -> `fa4::attention(q, k_cache, v_cache, seqused_k)` (lowering/kv_cache.py): the cache
position becomes seqused_k, the cache writes stay in place, K/V repetition is folded."""

import expecttest
import pytest
import torch
import torch.nn.functional as F

import upstream
from helpers import compile_and_record, recording_compile
from kv_cache_cases import B, CAPACITY, D, HKV, HQ, compiled_against_eager, gpt_fast_float_cache, new_tokens


def caches():
    return torch.randn(B, HKV, CAPACITY, D), torch.randn(B, HKV, CAPACITY, D)


class TestKvCache(expecttest.TestCase):
    def test_hf_static_cache_decode(self):
        k_cache, v_cache = caches()
        q, k, v = new_tokens(1)
        offset = torch.tensor(5)
        expected = upstream.static_cache_attention(q, k, v, k_cache.clone(), v_cache.clone(), offset.clone())
        rec, out = compile_and_record(upstream.static_cache_attention, q, k, v, k_cache, v_cache, offset)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        self.assertEqual(int(offset), 6)
        torch.testing.assert_close(k_cache[:, :, 5:6], k)  # the write happened, in place
        self.assertExpectedInline(rec.summary, """\
cache_start: i64[] = .clone(offset)
add: i64[] = add(cache_start, 1)
ge: b8[] = ge(add, 1)
le: b8[] = le(add, 16)
and_: b8[] = and_(ge, le)
all: b8[] = .all(and_)
_assert_async: NoneType = _assert_async(all, 'fa4_inductor: the query positions put a query before the first key or its band past the last one (a cache position below 0 or beyond the cache); this graph was compiled for positions inside the keys.')
to: i32[] = .to(add, int32)
expand: i32[2] = .expand(to, 2)
seqused_k: i32[2] = .contiguous(expand)
fa4_attention: (f32[2, 4, 1, 16], f32[2, 4, 1]) = fa4.attention(q, k_cache, v_cache, seqused_k, scale=0.25, causal=True)
attention_out: f32[2, 4, 1, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 1, 16] = .contiguous(attention_out)""")

    def test_hf_static_cache_chunked_prefill(self):
        """Several new tokens at a run-time offset: causal among them, bottom-right aligned at the offset."""
        k_cache, v_cache = caches()
        q, k, v = new_tokens(4)
        expected = upstream.static_cache_attention(q, k, v, k_cache.clone(), v_cache.clone(), torch.tensor(3))
        rec, out = compile_and_record(upstream.static_cache_attention, q, k, v, k_cache, v_cache, torch.tensor(3))
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        self.assertEqual(rec.count(), 1)
        detail = rec.records[0].detail
        self.assertIn("seqused_k=cache position + Sq, scale=0.25, causal=True); repeat_kv folded", detail)

    def test_gpt_fast_decode(self):
        rec, module, reference = compiled_against_eager(gpt_fast_float_cache, *new_tokens(1), torch.tensor([7]))
        torch.testing.assert_close(module.kv_cache.k_cache, reference.kv_cache.k_cache)
        self.assertExpectedInline(rec.summary, """\
cache_start: i64[] = getitem(input_pos, 0)
add: i64[] = add(cache_start, 1)
ge: b8[] = ge(add, 1)
le: b8[] = le(add, 16)
and_: b8[] = and_(ge, le)
all: b8[] = .all(and_)
_assert_async: NoneType = _assert_async(all, 'fa4_inductor: the query positions put a query before the first key or its band past the last one (a cache position below 0 or beyond the cache); this graph was compiled for positions inside the keys.')
to: i32[] = .to(add, int32)
expand: i32[2] = .expand(to, 2)
seqused_k: i32[2] = .contiguous(expand)
fa4_attention: (f32[2, 4, 1, 16], f32[2, 4, 1]) = fa4.attention(q, self.kv_cache.k_cache, self.kv_cache.v_cache, seqused_k, scale=0.25, causal=True)
attention_out: f32[2, 4, 1, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 1, 16] = .contiguous(attention_out)""")

    def test_gpt_fast_prefill_checks_positions_are_consecutive(self):
        rec, _, _ = compiled_against_eager(gpt_fast_float_cache, *new_tokens(5), torch.arange(5))
        self.assertExpectedInline(rec.summary, """\
getitem: i64[4] = getitem(input_pos, 1:)
getitem_1: i64[4] = getitem(input_pos, :-1)
sub: i64[4] = sub(getitem, getitem_1)
eq: b8[4] = eq(sub, 1)
all: b8[] = .all(eq)
_assert_async: NoneType = _assert_async(all, 'fa4_inductor: the query positions indexing the causal mask do not count up by one; this graph was compiled for consecutive cache positions.')
cache_start: i64[] = getitem(input_pos, 0)
add: i64[] = add(cache_start, 5)
ge: b8[] = ge(add, 5)
le: b8[] = le(add, 16)
and_: b8[] = and_(ge, le)
all_1: b8[] = .all(and_)
_assert_async_1: NoneType = _assert_async(all_1, 'fa4_inductor: the query positions put a query before the first key or its band past the last one (a cache position below 0 or beyond the cache); this graph was compiled for positions inside the keys.')
to: i32[] = .to(add, int32)
expand: i32[2] = .expand(to, 2)
seqused_k: i32[2] = .contiguous(expand)
fa4_attention: (f32[2, 4, 5, 16], f32[2, 4, 5]) = fa4.attention(q, self.kv_cache.k_cache, self.kv_cache.v_cache, seqused_k, scale=0.25, causal=True)
attention_out: f32[2, 4, 5, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 5, 16] = .contiguous(attention_out)""")

    def test_fallback_band_without_upper_bound_at_run_time_positions(self):
        """`kv_idx >= q_idx - 2` alone lets a query see every later cache slot: no seqused_k expresses that."""
        def fn(q, k_cache, v_cache, offset):
            q_pos = torch.arange(q.shape[2]) + offset
            kv_pos = torch.arange(k_cache.shape[2])
            mask = kv_pos[None, None, None, :] >= q_pos[None, None, :, None] - 2
            return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)

        k_cache, v_cache = torch.randn(B, HQ, CAPACITY, D), torch.randn(B, HQ, CAPACITY, D)
        q = torch.randn(B, HQ, 1, D)
        rec, out = compile_and_record(fn, q, k_cache, v_cache, torch.tensor(4))
        torch.testing.assert_close(out, fn(q, k_cache, v_cache, torch.tensor(4)))
        self.assertEqual(rec.count(), 0)
        self.assertEqual(rec.reasons, ["a band with no upper bound over a KV cache (or at run-time positions): keys "
                                       "past the last position are visible, which seqused_k cannot express"])


def hf_sliding_window_cache_attention(q, k_cache, v_cache, q_start, kv_start):
    """HF's sliding-window cache (window 4): the cache holds positions kv_start.. (ints), a window band over them."""
    q_pos, kv_pos = torch.arange(q.shape[2]) + q_start, torch.arange(k_cache.shape[2]) + kv_start
    mask = upstream.sliding_window_mask(q_pos, kv_pos, 4)
    return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_hf_sliding_window_cache_decode(dynamic):
    """Positions as ints: burnt in (the band moves by a constant) or symbolic (a run-time shift)."""
    k_cache, v_cache = torch.randn(B, HQ, 4, D), torch.randn(B, HQ, 4, D)
    rec, compiled = recording_compile(hf_sliding_window_cache_attention, dynamic=dynamic)
    for q_start, kv_start in ((9, 6), (2, 0), (12, 9)):
        q = torch.randn(B, HQ, 1, D)
        torch.testing.assert_close(compiled(q, k_cache, v_cache, q_start, kv_start),
                                   hf_sliding_window_cache_attention(q, k_cache, v_cache, q_start, kv_start),
                                   atol=1e-5, rtol=1e-5)
    assert rec.count() == len(rec.graphs) and not rec.reasons
    assert all("causal=True, window_left=3" in r.detail for r in rec.records)


def test_gpt_fast_non_consecutive_positions_raise():
    q, k, v = new_tokens(3)
    _, compiled = recording_compile(gpt_fast_float_cache())
    compiled(q, k, v, torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="do not count up by one"):
        compiled(q, k, v, torch.tensor([0, 2, 4]))


def test_positions_outside_the_keys_are_eagers():
    """Run-time positions over keys that no cache write bounds can put a query before the first key or its band
    past the last one; seqused_k = position + Sq cannot say that, so only a written cache is rewritten."""
    def fn(q, k_cache, v_cache, offset):
        q_pos = torch.arange(q.shape[2]) + offset
        mask = torch.arange(k_cache.shape[2])[None, None, None, :] <= q_pos[None, None, :, None]
        return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)

    q, _, _ = new_tokens(2)
    k_cache, v_cache = (torch.randn(B, HQ, CAPACITY, D) for _ in range(2))
    rec, compiled = recording_compile(fn)
    for offset in (3, -1, CAPACITY - 1):
        torch.testing.assert_close(compiled(q, k_cache, v_cache, torch.tensor(offset)),
                                   fn(q, k_cache, v_cache, torch.tensor(offset)), equal_nan=True)
    assert rec.count() == 0
    assert rec.reasons == ["query positions held in a tensor over keys that are not a KV cache written in this graph "
                           "at indexed positions: positions outside the keys cannot be excluded"]


def test_positions_written_into_the_cache_are_checked():
    """Over a written cache the positions are eager's write positions; the in-graph check stays for a write and a
    mask that disagree (each HF layer advances its own offset)."""
    def fn(q, k, v, k_cache, v_cache, offset, mask_offset):
        k_cache.index_copy_(2, torch.arange(k.shape[2]) + offset, k)
        v_cache.index_copy_(2, torch.arange(v.shape[2]) + offset, v)
        q_pos = torch.arange(q.shape[2]) + mask_offset
        mask = torch.arange(k_cache.shape[2])[None, None, None, :] <= q_pos[None, None, :, None]
        return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)

    q, k, v = new_tokens(2)
    rec, compiled = recording_compile(fn)
    caches_compiled = caches()
    caches_eager = [c.clone() for c in caches_compiled]
    torch.testing.assert_close(compiled(q, k, v, *caches_compiled, torch.tensor(3), torch.tensor(3)),
                               fn(q, k, v, *caches_eager, torch.tensor(3), torch.tensor(3)))
    assert rec.count() == 1
    with pytest.raises(RuntimeError, match="query positions put a query before the first key or its band past"):
        compiled(q, k, v, *caches_compiled, torch.tensor(3), torch.tensor(CAPACITY - 1))
