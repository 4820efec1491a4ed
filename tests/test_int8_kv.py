"""Int8 KV caches: `fa4::attention_int8kv` (kernels/attention_int8kv.py), `fa4_inductor.Int8StaticCache`
(fa4_inductor/int8_cache.py) and the fold of their dequantization into the op (lowering/int8_kv.py).

Accuracy (the bounds the README states):
- the op against float64 attention over the same dequantized K/V: float32 rounding only (2e-6 for float32 q;
  bfloat16 q adds the output's rounding);
- the op against float64 attention over the original K/V (the quantization error): at most
  max|dV| + max|V| (exp(2 d) - 1), d = scale max_j |q . dK_j|, since each score moves by at most d (so each
  softmax weight by a factor within exp(+-2d)) and each value by at most max|dV| <= amax / 254;
- a tiny HF Llama decoding through `Int8StaticCache` against the float32 `StaticCache`: logits within 2% of
  their largest magnitude (measured 0.4%).
"""

import functools

import expecttest
import pytest
import torch

from fa4_inductor import hf
from fa4_inductor.kernels import reference
from helpers import Recorder, compile_and_record, recording_compile, tiny
from kv_cache_cases import compiled_against_eager, gpt_fast_int8_cache, new_tokens

OP = torch.ops.fa4.attention_int8kv.default


def quantize(x):
    from fa4_inductor.int8_cache import quantize

    return quantize(x)


def int8_inputs(b=2, hq=4, hkv=2, sq=3, sk=9, d=16, dtype=torch.float32, generator=None):
    q = torch.randn(b, hq, sq, d, generator=generator).to(dtype)
    k, v = torch.randn(b, hkv, sk, d, generator=generator), torch.randn(b, hkv, sk, d, generator=generator)
    return q, k, v


def float64_attention(q, k, v, **flags):
    full = dict(causal=False, window_left=-1, window_right=-1, softcap=0.0, seqused_k=None, key_mask=None)
    full.update(flags)
    return reference.attention_forward(q.double(), k.double(), v.double(), **full)


def dequantized64(x, s):
    return x.double() * s.double()[..., None]


# ------------------------------------------------------------------------------------------------------ the op

FLAGS = [dict(scale=0.25), dict(scale=0.25, causal=True), dict(scale=0.3, causal=True, window_left=2),
         dict(scale=0.25, softcap=3.0)]


@pytest.mark.parametrize("flags", FLAGS, ids=str)
def test_opcheck(flags):
    q, k, v = int8_inputs()
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    torch.library.opcheck(OP, (q, k8, v8, ks, vs), flags)


def test_opcheck_with_seqused_k_and_key_mask():
    q, k, v = int8_inputs(sq=1)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    used = torch.tensor([9, 4], dtype=torch.int32)
    key_mask = torch.rand(2, 9) > 0.3
    key_mask[:, 0] = True
    torch.library.opcheck(OP, (q, k8, v8, ks, vs, used, key_mask), dict(scale=0.25, causal=True))


def test_no_autograd_formula():
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("fa4::attention_int8kv", "Autograd")


@pytest.mark.parametrize("flags", FLAGS, ids=str)
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2), (torch.float64, 1e-6)])
def test_matches_float64_over_the_dequantized_cache(flags, dtype, atol):
    q, k, v = int8_inputs(sq=4, sk=33, dtype=dtype)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    used = torch.tensor([33, 20], dtype=torch.int32)
    out, lse = OP(q, k8, v8, ks, vs, used, **flags)
    expected, expected_lse = float64_attention(q, dequantized64(k8, ks), dequantized64(v8, vs), seqused_k=used, **flags)
    assert out.dtype == dtype and lse.dtype == reference.compute_dtype(dtype)
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=0)
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d, sk", [(64, 64), (128, 1024)])
def test_quantization_error_is_within_its_bound(d, sk):
    g = torch.Generator().manual_seed(sk + d)
    q, k, v = int8_inputs(b=2, hq=8, hkv=2, sq=4, sk=sk, d=d, generator=g)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    scale = d ** -0.5
    out, _ = OP(q, k8, v8, ks, vs, scale=scale, causal=True)
    exact, _ = float64_attention(q, k, v, scale=scale, causal=True)
    dk, dv = dequantized64(k8, ks) - k.double(), dequantized64(v8, vs) - v.double()
    assert (dk.abs() <= k.double().abs().amax(-1, keepdim=True) / 254 + 1e-7).all()  # half a step per entry
    score_moves = (q.double().unflatten(1, (2, 4)) @ dk.unsqueeze(2).transpose(-1, -2)).abs().max() * scale
    bound = dv.abs().max() + v.abs().max() * torch.expm1(2 * score_moves)
    err = (out.double() - exact).abs().max()
    assert 0 < err <= bound + 1e-6, (err, bound)


def test_fake_matches_real_layout():
    q, k, v = int8_inputs(sq=2)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    out, lse = OP(q, k8, v8, ks, vs, scale=0.25)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = OP(*(mode.from_tensor(t) for t in (q, k8, v8, ks, vs)), scale=0.25)
    assert [t.stride() for t in fake] == [out.stride(), lse.stride()]
    assert [t.dtype for t in fake] == [out.dtype, lse.dtype]


@pytest.mark.parametrize("bad, message", [
    ("k_scale_dtype", "float32 k_scale"), ("k_dtype", "int8 k, v"), ("scale_shape", "k_scale must have shape")])
def test_bad_inputs_raise(bad, message):
    q, k, v = int8_inputs()
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    if bad == "k_scale_dtype":
        ks = ks.bfloat16()
    elif bad == "k_dtype":
        k8 = k
    else:
        ks = ks[:, :, :4]
    with pytest.raises((ValueError, RuntimeError), match=message):
        OP(q, k8, v8, ks, vs, scale=0.25)


# ------------------------------------------------------------------------------------------------------ the cache

def test_quantize_is_symmetric_per_token_with_zero_rows():
    x = torch.randn(2, 2, 5, 16)
    x[0, 1, 3] = 0
    values, scales = quantize(x)
    assert values.dtype == torch.int8 and scales.dtype == torch.float32 and scales.shape == (2, 2, 5)
    torch.testing.assert_close(scales, x.abs().amax(-1) / 127)
    assert values.abs().max() == 127 and values.min() >= -127
    assert scales[0, 1, 3] == 0 and (values[0, 1, 3] == 0).all()
    assert ((values.float() * scales[..., None] - x).abs() <= scales[..., None] / 2 + 1e-7).all()


def test_cache_writes_int8_at_the_positions_and_resets():
    model = tiny("llama", "sdpa").model
    from fa4_inductor import Int8StaticCache
    from fa4_inductor.int8_cache import Int8StaticLayer

    cache = Int8StaticCache(config=model.config, max_cache_len=16)
    assert all(type(layer) is Int8StaticLayer for layer in cache.layers) and cache.is_compileable
    k, v = torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16)
    keys, values = cache.update(k, v, 0, {"cache_position": torch.arange(3)})  # transformers 4 reads the positions
    layer = cache.layers[0]
    assert layer.keys.dtype == torch.int8 and layer.key_scales.shape == (2, 2, 16) and keys.dtype == torch.float32
    assert keys.shape == (2, 2, 16, 16) and (keys[:, :, 3:] == 0).all()
    k8, ks = quantize(k)
    assert torch.equal(layer.keys[:, :, :3], k8) and torch.equal(layer.key_scales[:, :, :3], ks)
    torch.testing.assert_close(keys[:, :, :3], k, atol=float(ks.max()) / 2 + 1e-7, rtol=0)
    cache.update(k[:, :, :1], v[:, :, :1], 0, {"cache_position": torch.tensor([3])})
    assert int(layer.get_seq_length()) == 4 and torch.equal(layer.keys[:, :, 3], k8[:, :, 0])
    cache.reset()
    assert int(layer.get_seq_length()) == 0 and not layer.keys.any() and not layer.key_scales.any()


def test_sliding_window_layers_stay_in_the_model_dtype():
    from transformers.cache_utils import StaticSlidingWindowLayer

    from fa4_inductor import Int8StaticCache
    from fa4_inductor.int8_cache import Int8StaticLayer

    model = tiny("gemma2", "eager").model
    kinds = {type(layer) for layer in Int8StaticCache(config=model.config, max_cache_len=16).layers}
    assert kinds == {Int8StaticLayer, StaticSlidingWindowLayer}


def decode(model, cache, ids, steps=3, forward=None):
    """Logits of a prefill and `steps` greedy one-token steps through `cache`."""
    forward = forward or model
    keyword = hf.cache_keyword(model)
    logits = []
    with torch.no_grad():
        out = forward(input_ids=ids, use_cache=True, **{keyword: cache})
        logits.append(out.logits)
        for _ in range(steps):
            token = out.logits[:, -1:].argmax(-1)
            out = forward(input_ids=token, use_cache=True, **{keyword: cache})
            logits.append(out.logits)
    return logits


def int8_decode_compiled_and_eager(name, impl):
    """The Recorder of a tiny HF model compiled to prefill 12 tokens and decode 2 through an `Int8StaticCache`, its
    logits checked against the uncompiled model's with the same cache."""
    from fa4_inductor import Int8StaticCache

    model = tiny(name, impl).model
    rec, compiled = recording_compile(model.forward, fullgraph=True)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    got = decode(model, Int8StaticCache(config=model.config, max_cache_len=32), ids, steps=2, forward=compiled)
    expected = decode(model, Int8StaticCache(config=model.config, max_cache_len=32), ids, steps=2)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    return rec


def test_tiny_llama_logits_against_a_float32_static_cache():
    from transformers import StaticCache

    from fa4_inductor import Int8StaticCache

    model = tiny("llama", "sdpa").model
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    got = decode(model, Int8StaticCache(config=model.config, max_cache_len=32), ids)
    expected = decode(model, StaticCache(config=model.config, max_cache_len=32), ids)
    for g, e in zip(got, expected):
        err = (g - e).abs().max()
        assert 0 < err <= 0.02 * e.abs().max(), (err, e.abs().max())


@pytest.mark.slow
def test_gpt_oss_decodes_through_the_int8_cache_with_its_sinks():
    """GPT-OSS (attention sinks, sliding and full layers) prefilling and decoding through an `Int8StaticCache`: every
    layer on the op, the full layer's on `fa4::attention_int8kv` (the sink's correction reads its lse), logits
    those of the uncompiled model with the same cache."""
    rec = int8_decode_compiled_and_eager("gpt_oss", "eager")
    calls = [len(rec.calls(g, op)) for g in rec.graphs for op in ("fa4::attention", "fa4::attention_int8kv")]
    assert calls == [1, 1, 1, 1] and not rec.reasons, (calls, rec.reasons)
    assert all("attention sink" in r.detail for r in rec.records), rec.records


def test_generate_takes_the_cache():
    from fa4_inductor import Int8StaticCache

    model = tiny("llama", "sdpa").model
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(2))
    cache = Int8StaticCache(config=model.config, max_cache_len=16)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), **{hf.cache_keyword(model): cache}, max_new_tokens=4,
                         do_sample=False, pad_token_id=0)
    assert out.shape == (1, 10) and int(cache.layers[0].get_seq_length()) == 9
    assert cache.layers[0].keys[:, :, :9].any() and not cache.layers[0].keys[:, :, 9:].any()


# ------------------------------------------------------------------------------------------------------ lowering

class TestInt8KvLowering(expecttest.TestCase):
    def test_gpt_fast_int8_decode(self):
        rec, module, reference_module = compiled_against_eager(gpt_fast_int8_cache, *new_tokens(1), torch.tensor([6]))
        for name in ("k_cache", "k_scales", "v_cache", "v_scales"):  # the writes happened, in place
            assert torch.equal(getattr(module.kv_cache, name), getattr(reference_module.kv_cache, name)), name
        self.assertIn("int8 K/V dequantization folded (float32 product)", rec.records[0].detail)
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
fa4_attention_int8kv: (f32[2, 4, 1, 16], f32[2, 4, 1]) = fa4.attention_int8kv(q, self.kv_cache.k_cache, self.kv_cache.v_cache, self.kv_cache.k_scales, self.kv_cache.v_scales, seqused_k, scale=0.25, causal=True)
attention_out: f32[2, 4, 1, 16] = getitem(fa4_attention_int8kv, 0)
attention_out_contiguous: f32[2, 4, 1, 16] = .contiguous(attention_out)""")

    def test_gpt_fast_int8_prefill(self):
        """Five tokens at positions 6..10 (a chunked prefill): seqused_k = 11, checked to count up by one."""
        rec, _, _ = compiled_against_eager(gpt_fast_int8_cache, *new_tokens(5), torch.arange(6, 11))
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
fa4_attention_int8kv: (f32[2, 4, 5, 16], f32[2, 4, 5]) = fa4.attention_int8kv(q, self.kv_cache.k_cache, self.kv_cache.v_cache, self.kv_cache.k_scales, self.kv_cache.v_scales, seqused_k, scale=0.25, causal=True)
attention_out: f32[2, 4, 5, 16] = getitem(fa4_attention_int8kv, 0)
attention_out_contiguous: f32[2, 4, 5, 16] = .contiguous(attention_out)""")

    def test_hf_llama_int8_static_cache_prefill_and_decode(self):
        rec = int8_decode_compiled_and_eager("llama", "sdpa")
        keyword = hf.cache_keyword(tiny("llama", "sdpa").model)
        self.assertEqual(len(rec.graphs), 2)  # the prefill, and one decode graph for both steps
        calls = [len(rec.calls(g, op)) for g in rec.graphs for op in ("fa4::attention", "fa4::attention_int8kv")]
        self.assertEqual(calls, [0, 2, 0, 2])
        self.assertEqual(rec.reasons, [])
        # The cache keyword is `cache` in transformers 5.24, `past_key_values` in 5.17.
        prefill, decode_step = rec.summary.replace(f"kwargs['{keyword}']", "kwargs[cache]").split("\n\n")
        # The prefill (the cache's buffers are allocated in the graph): transformers 5.17 reads the whole cache with
        # seqused_k = 12; 5.24's sdpa code slices the dequantized cache to the prompt's 12 slots, and so the op
        # reads those slots of the int8 cache.
        first = prefill.split("\n")[0]
        if first.startswith("seqused_k"):
            self.assertExpectedInline("\n".join(prefill.split("\n")[:2]), """\
seqused_k: i32[2] = full((2), 12, dtype=int32, device=device(type='cpu'))
fa4_attention_int8kv: (f32[2, 4, 12, 16], f32[2, 4, 12]) = fa4.attention_int8kv(add(mul(.transpose(..., 1, 2), .unsqueeze(..., 1)), mul(cat((..., ...), dim=-1), .unsqueeze(..., 1))), zeros((2, 2, 32, 16), dtype=int8, device=device(type='cpu')), zeros((2, 2, 32, 16), dtype=int8, device=device(type='cpu')), zeros((2, 2, 32), dtype=float32, device=device(type='cpu')), zeros((2, 2, 32), dtype=float32, device=device(type='cpu')), seqused_k, scale=0.25, causal=True)""")
        else:
            self.assertExpectedInline("\n".join(prefill.split("\n")[:5]), """\
int8_keys: torch.int8[2, 2, 12, 16] = getitem(zeros((2, 2, 32, 16), dtype=int8, device=device(type='cpu')), (:, :, :12, :))
int8_values: torch.int8[2, 2, 12, 16] = getitem(zeros((2, 2, 32, 16), dtype=int8, device=device(type='cpu')), (:, :, :12, :))
key_scales: f32[2, 2, 12] = getitem(zeros((2, 2, 32), dtype=float32, device=device(type='cpu')), (:, :, :12))
value_scales: f32[2, 2, 12] = getitem(zeros((2, 2, 32), dtype=float32, device=device(type='cpu')), (:, :, :12))
fa4_attention_int8kv: (f32[2, 4, 12, 16], f32[2, 4, 12]) = fa4.attention_int8kv(add(mul(.transpose(..., 1, 2), .unsqueeze(..., 1)), mul(cat((..., ...), dim=-1), .unsqueeze(..., 1))), int8_keys, int8_values, key_scales, value_scales, scale=0.25, causal=True)""")
        self.assertExpectedInline(decode_step, """\
cache_start: i64[] = .clone(.to(kwargs[cache].layers[0].cumulative_length, device(type='cpu')))
add: i64[] = add(cache_start, 1)
ge: b8[] = ge(add, 1)
le: b8[] = le(add, 32)
and_: b8[] = and_(ge, le)
all: b8[] = .all(and_)
_assert_async: NoneType = _assert_async(all, 'fa4_inductor: the query positions put a query before the first key or its band past the last one (a cache position below 0 or beyond the cache); this graph was compiled for positions inside the keys.')
to: i32[] = .to(add, int32)
expand: i32[2] = .expand(to, 2)
seqused_k: i32[2] = .contiguous(expand)
fa4_attention_int8kv: (f32[2, 4, 1, 16], f32[2, 4, 1]) = fa4.attention_int8kv(add(mul(.transpose(..., 1, 2), .unsqueeze(..., 1)), mul(cat((..., ...), dim=-1), .unsqueeze(..., 1))), kwargs[cache].layers[0].keys, kwargs[cache].layers[0].values, kwargs[cache].layers[0].key_scales, kwargs[cache].layers[0].value_scales, seqused_k, scale=0.25, causal=True)
attention_out: f32[2, 4, 1, 16] = getitem(fa4_attention_int8kv, 0)
fa4_attention_int8kv_1: (f32[2, 4, 1, 16], f32[2, 4, 1]) = fa4.attention_int8kv(add(mul(.transpose(..., 1, 2), .unsqueeze(..., 1)), mul(cat((..., ...), dim=-1), .unsqueeze(..., 1))), kwargs[cache].layers[1].keys, kwargs[cache].layers[1].values, kwargs[cache].layers[1].key_scales, kwargs[cache].layers[1].value_scales, seqused_k, scale=0.25, causal=True)
attention_out_1: f32[2, 4, 1, 16] = getitem(fa4_attention_int8kv_1, 0)""")


def test_gpt_fast_int8_decode_in_bfloat16_under_inductor():
    """The product in bfloat16 (`k_cache.to(bf16) * k_scales[..., None].to(bf16)`): the op takes it in float32,
    within bfloat16's rounding of K/V of eager."""
    rec, _, _ = compiled_against_eager(functools.partial(gpt_fast_int8_cache, torch.bfloat16),
                                       *new_tokens(1, torch.bfloat16), torch.tensor([6]), inductor=True, atol=2e-2, rtol=0)
    assert rec.count("fa4::attention_int8kv") == 1, rec.records
    assert "int8 K/V dequantization folded (product in bfloat16)" in rec.records[0].detail


def int8_sdpa(q, k8, ks, v8, vs):
    dk = (k8.float() * ks[..., None]).to(q.dtype)
    dv = (v8.float() * vs[..., None]).to(q.dtype)
    return torch.nn.functional.scaled_dot_product_attention(q, dk, dv, is_causal=True)


@pytest.mark.parametrize("case, reason", [
    ("v float", "only k is dequantized from int8"),
    ("scale bf16", "its scale is torch.bfloat16, and the int8-KV op takes float32 scales"),
    ("grad", "q, k or v requires a gradient, and the int8-KV op is forward only")])
def test_unfoldable_dequantizations_stay_on_fa4_attention(case, reason):
    q, k, v = int8_inputs(hq=2, sq=5, sk=5)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    if case == "v float":
        def fn(q, k8, ks, v, vs):
            return torch.nn.functional.scaled_dot_product_attention(q, (k8.float() * ks[..., None]), v, is_causal=True)
        args = (q, k8, ks, v, vs)
    elif case == "scale bf16":
        fn, args = int8_sdpa, (q, k8, ks, v8, vs.bfloat16())
    else:
        fn, args = int8_sdpa, (q.requires_grad_(), k8, ks, v8, vs)
    rec, out = compile_and_record(fn, *args)
    torch.testing.assert_close(out, fn(*args))
    assert rec.count("fa4::attention") == 1 and rec.count("fa4::attention_int8kv") == 0
    assert rec.records[0].detail.endswith(f"int8 K/V kept dequantized: {reason}"), rec.records[0].detail


def test_option_off_keeps_the_dequantization():
    q, k, v = int8_inputs(hq=2, sq=5, sk=5)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    rec, out = compile_and_record(int8_sdpa, q, k8, ks, v8, vs, int8_kv=False)
    torch.testing.assert_close(out, int8_sdpa(q, k8, ks, v8, vs))
    assert rec.count("fa4::attention") == 1 and rec.count("fa4::attention_int8kv") == 0


# ------------------------------------------------------------------------------------------------------ CUDA routes

def test_route_table_calls_adapters_with_the_scales(monkeypatch):
    """The convention `routes.INT8KV`'s adapters follow (the int8 decode kernel's module, `decode_int8kv`):
    `unsupported_reason(q, k, v, *, k_scale, v_scale, seqused_k, key_mask, **flags)` and
    `forward(q, k, v, k_scale, v_scale, seqused_k, key_mask, **flags)`; a declining route's reason reaches
    `kernel_for`'s why. Run through the op's CUDA body with CPU tensors."""
    import types

    from fa4_inductor.kernels import attention_int8kv, routes

    seen = []

    def declines(q, k, v, *, k_scale, v_scale, seqused_k=None, key_mask=None, **flags):
        seen.append(("declines", k_scale, v_scale, seqused_k, flags["causal"]))
        return "the fake kernel takes nothing"

    def takes(q, k, v, *, k_scale, v_scale, seqused_k=None, key_mask=None, **flags):
        return None

    def forward(q, k, v, k_scale, v_scale, seqused_k=None, key_mask=None, **flags):
        seen.append(("forward", k_scale, v_scale, seqused_k, flags))
        return attention_int8kv.attention_int8kv(q, k, v, k_scale, v_scale, seqused_k, key_mask, **flags)

    adapter = types.SimpleNamespace(forward=forward)
    table = (routes.Route("declining", declines, adapter, "never"), routes.Route("fake", takes, adapter, "it takes it"))
    monkeypatch.setattr(routes, "INT8KV", table)
    monkeypatch.setattr(attention_int8kv._ROUTES, "get", lambda key: None)
    q, k, v = int8_inputs(sq=1)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    used = torch.tensor([9, 3], dtype=torch.int32)
    out, _ = attention_int8kv._attention_int8kv_cuda(q, k8, v8, ks, vs, used, scale=0.25, causal=True)
    assert [s[0] for s in seen] == ["declines", "forward"]
    assert all(s[1] is ks and s[2] is vs and s[3] is used for s in seen)
    assert seen[1][4] == dict(scale=0.25, causal=True, window_left=-1, window_right=-1, softcap=0.0)
    torch.testing.assert_close(out, OP(q, k8, v8, ks, vs, used, scale=0.25, causal=True)[0])
    assert attention_int8kv.kernel_for(q, k8, v8, ks, vs) == ("reference", "cpu runs the reference")
    assert routes.why(table[1], ["the fake kernel takes nothing"]) == "it takes it (the fake kernel takes nothing)"


def test_the_dequantizing_route_is_last_and_takes_everything():
    from fa4_inductor.kernels import int8kv_dequantize, routes

    assert routes.INT8KV[-1] is routes.DEQUANTIZE_INT8KV and routes.DEQUANTIZE_INT8KV.adapter is int8kv_dequantize
    q, k, v = int8_inputs(sq=2, dtype=torch.bfloat16)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    assert int8kv_dequantize.unsupported_reason(q, k8, v8, k_scale=ks, v_scale=vs) is None
    out, lse = int8kv_dequantize.forward(q, k8, v8, ks, vs, scale=0.25, causal=True)
    expected, _ = float64_attention(q, (k8.float() * ks[..., None]).bfloat16(), (v8.float() * vs[..., None]).bfloat16(),
                                    scale=0.25, causal=True)
    torch.testing.assert_close(out.double(), expected, atol=1e-2, rtol=0)


@pytest.mark.slow
def test_default_torch_compile_fullgraph_runs_the_cache():
    """`Int8StaticCache` under plain `torch.compile(fullgraph=True)` (Inductor, no fa4 backend): eager's logits."""
    from fa4_inductor import Int8StaticCache

    model = tiny("llama", "sdpa").model
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(4))
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, fullgraph=True)
    got = decode(model, Int8StaticCache(config=model.config, max_cache_len=16), ids, steps=2, forward=compiled)
    expected = decode(model, Int8StaticCache(config=model.config, max_cache_len=16), ids, steps=2)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_symbolic_shapes_under_inductor():
    """`dynamic=True`: one graph for every batch and length, the op's fake outputs symbolic (then a batch of 1
    specializes)."""
    rec, compiled = recording_compile(int8_sdpa, inductor=True, dynamic=True)
    for b, s in ((2, 9), (3, 17)):
        q, k, v = int8_inputs(b=b, hq=4, hkv=4, sq=s, sk=s)
        (k8, ks), (v8, vs) = quantize(k), quantize(v)
        torch.testing.assert_close(compiled(q, k8, ks, v8, vs), int8_sdpa(q, k8, ks, v8, vs), atol=1e-5, rtol=1e-5)
    assert len(rec.graphs) == 1 and rec.count("fa4::attention_int8kv") == 1 and not rec.reasons
    assert "f32[s" in rec.summary.split("\n")[0], rec.summary


def test_generate_compiles_the_int8_decode_step_with_a_left_padded_batch():
    """HF `generate` compiling its decode step (`CompileConfig(backend=...)`) over `Int8StaticCache`, a left-padded
    batch: every decode layer reads the int8 cache with generate's mask as its key_mask; the same tokens and scores
    as uncompiled generate over the same kind of cache."""
    from transformers import CompileConfig

    from fa4_inductor import Int8StaticCache

    model = tiny("llama", "sdpa").model
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    recorder = Recorder()
    config = CompileConfig(backend=recorder, fullgraph=True)
    config._compile_all_devices = True  # HF compiles on GPUs only by default
    kwargs = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
                  output_scores=True)
    torch._dynamo.reset()
    with torch.no_grad():
        model.generation_config.compile_config = config
        got = model.generate(ids, **{hf.cache_keyword(model): Int8StaticCache(config=model.config, max_cache_len=16)},
                             **kwargs)
        model.generation_config.compile_config = None
        expected = model.generate(ids, **{hf.cache_keyword(model): Int8StaticCache(config=model.config, max_cache_len=16)},
                                  disable_compile=True, **kwargs)
    layers = model.config.num_hidden_layers
    assert recorder.graphs and recorder.count("fa4::attention_int8kv") == len(recorder.graphs) * layers, recorder.records
    assert all("key_mask=padding mask" in r.detail and "int8 K/V dequantization folded" in r.detail
               for r in recorder.records), recorder.records
    assert torch.equal(got.sequences, expected.sequences)
    for g, e in zip(got.scores, expected.scores):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_compiled_forward_generating_a_left_padded_batch_over_the_int8_cache():
    """The whole forward compiled, `generate` over `Int8StaticCache` with a left-padded batch: the prefill's boolean
    [B, 1, Sq, Sk] mask (built outside the forward) reaches `fa4::attention_int8kv` as its [B, Sq, Sk] key mask, the
    decode steps' as [B, Sk] ones; the same tokens as uncompiled generate over the same kind of cache."""
    from fa4_inductor import Int8StaticCache

    model = tiny("llama", "sdpa").model
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    forward = model.forward
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        expected = model.generate(ids, **{hf.cache_keyword(model): Int8StaticCache(config=model.config, max_cache_len=16)},
                                  **kwargs)
        model.forward = torch.compile(forward, backend=recorder)
        got = model.generate(ids, **{hf.cache_keyword(model): Int8StaticCache(config=model.config, max_cache_len=16)},
                             **kwargs)
    model.forward = forward
    assert torch.equal(got, expected)
    layers = model.config.num_hidden_layers
    assert recorder.count("fa4::attention_int8kv") == 2 * layers and not recorder.reasons, recorder.records
    assert sum("key_mask=mask per query row" in r.detail for r in recorder.records) == layers, recorder.records


def test_a_dequantization_used_elsewhere_is_still_folded():
    """The attention reads the int8 cache; the other use keeps its own dequantized K."""
    def fn(q, k8, ks, v8, vs):
        dk = (k8.float() * ks[..., None]).to(q.dtype)
        dv = (v8.float() * vs[..., None]).to(q.dtype)
        return torch.nn.functional.scaled_dot_product_attention(q, dk, dv, is_causal=True), dk.sum()

    q, k, v = int8_inputs(hq=2, sq=5, sk=5)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    rec, (out, total) = compile_and_record(fn, q, k8, ks, v8, vs)
    expected, expected_total = fn(q, k8, ks, v8, vs)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(total, expected_total)
    assert rec.count("fa4::attention_int8kv") == 1, rec.records


@pytest.mark.parametrize("v_keys", [slice(2, 9), slice(1, 8)], ids=["same-slice", "other-slice"])
def test_a_sliced_dequantization_slices_the_int8_cache(v_keys):
    """`dequantized[:, :, a:b]` reads `int8[:, :, a:b]` and `scale[:, :, a:b]`; K and V sliced differently stay
    dequantized, with the reason."""
    def fn(q, k8, ks, v8, vs):
        dk = (k8.float() * ks[..., None]).to(q.dtype)[:, :, 2:9]
        dv = (v8.float() * vs[..., None]).to(q.dtype)[:, :, v_keys]
        return torch.nn.functional.scaled_dot_product_attention(q, dk, dv)

    q, k, v = int8_inputs(hq=2, sq=3, sk=12)
    (k8, ks), (v8, vs) = quantize(k), quantize(v)
    rec, out = compile_and_record(fn, q, k8, ks, v8, vs)
    torch.testing.assert_close(out, fn(q, k8, ks, v8, vs))
    if v_keys == slice(2, 9):
        assert rec.count("fa4::attention_int8kv") == 1, rec.records
        assert "k[2x2x12x16][:, :, 2:9] int8" in rec.records[0].detail, rec.records[0].detail
    else:
        assert rec.count("fa4::attention") == 1
        assert rec.records[0].detail.endswith("int8 K/V kept dequantized: k and v are sliced differently "
                                              "(slice(2, 9, None), slice(1, 8, None))"), rec.records[0].detail


def test_k_and_v_taken_from_a_split_are_not_read_as_a_cache_slice():
    """K and V that are items of a split's tuple (GPT-NeoX's fused qkv) are not indexed 4-D tensors: the int8-KV
    check passes them by (it used to read the tuple's shape)."""
    import torch.nn.functional as F

    from helpers import compile_and_record

    def attend(qkv):
        q, k, v = qkv.split(16, dim=-1)
        s = (q @ k.transpose(-1, -2)) * 0.25
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        return F.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v

    qkv = torch.randn(2, 4, 8, 48)
    rec, out = compile_and_record(attend, qkv)
    assert rec.count() == 1
    torch.testing.assert_close(out, attend(qkv))
