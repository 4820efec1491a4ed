"""The gpt-fast KV-cache cases test_kv_cache.py and test_int8_kv.py share: their sizes, fresh new tokens, gpt-fast's
cached attention (`upstream.GptFastCachedAttention`) over a float cache or an int8 one, and a compiled module
checked against an eager twin holding the same cache."""

import torch

import upstream
from helpers import compile_and_record

B, HQ, HKV, CAPACITY, D = 2, 4, 2, 16, 16


def new_tokens(sq, dtype=torch.float32):
    """Fresh q [B, HQ, sq, D] and k, v [B, HKV, sq, D]."""
    return (torch.randn(B, HQ, sq, D, dtype=dtype), torch.randn(B, HKV, sq, D, dtype=dtype),
            torch.randn(B, HKV, sq, D, dtype=dtype))


def gpt_fast_float_cache():
    """gpt-fast's cached attention over a `KVCache` whose every slot holds random values."""
    cache = upstream.KVCache(B, HKV, CAPACITY, D)
    for buffer in (cache.k_cache, cache.v_cache):
        buffer.copy_(torch.randn(B, HKV, CAPACITY, D))
    return upstream.GptFastCachedAttention(cache, HQ // HKV)


def gpt_fast_int8_cache(dtype=torch.float32):
    """gpt-fast's cached attention over an `Int8KVCache` with random K/V of `dtype` written at positions 0..5."""
    cache = upstream.Int8KVCache(B, HKV, CAPACITY, D)
    cache.update(torch.arange(6), torch.randn(B, HKV, 6, D, dtype=dtype), torch.randn(B, HKV, 6, D, dtype=dtype))
    return upstream.GptFastCachedAttention(cache, HQ // HKV)


def compiled_against_eager(make, q, k, v, input_pos, inductor=False, atol=1e-5, rtol=1e-5):
    """Two modules from `make()` with one state: the first compiled with a Recorder (`compile_and_record`), the
    second eager, each called once on q, k, v, input_pos; asserts their outputs agree. (recorder, compiled module,
    eager module): both caches now hold the writes."""
    module, twin = make(), make()
    twin.load_state_dict(module.state_dict())
    rec, out = compile_and_record(module, q, k, v, input_pos, inductor=inductor)
    torch.testing.assert_close(out, twin(q, k, v, input_pos), atol=atol, rtol=rtol)
    return rec, module, twin
