"""GPU tier: int8 KV caches on CUDA, run with `pytest -m gpu` (`tests/test_int8_kv.py` is the CPU tier).

- `fa4::attention_int8kv` on its dequantizing route (`kernels/int8kv_dequantize.py`), and on whatever route the
  op picks (the int8 decode kernel where installed), judged by FlashAttention's rule against float64 attention
  over the dequantized K/V (`gpu_helpers.assert_fa_rule`: at most 2x the error of PyTorch's own attention in
  the same dtype, plus 1e-5);
- a tiny Llama (head dim 128, 4 query heads per KV head) decoding from `Int8StaticCache` with its step compiled
  by our backend under `mode="reduce-overhead"` (CUDA graphs, none skipped): one `fa4::attention_int8kv` per
  layer in the decode graph, logits within 2x bf16 eager's error (against the float32 model over the same
  int8 cache) plus 1e-3;
- HF `generate(past_key_values=Int8StaticCache(...))` compiling its decode step with our backend.
"""

import pytest
import torch

import fa4_inductor
from fa4_inductor import hf
from fa4_inductor.int8_cache import quantize
from fa4_inductor.kernels import attention_int8kv, reference, routes
from gpu_helpers import assert_fa_rule, eager
from helpers import Recorder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

OP = torch.ops.fa4.attention_int8kv.default


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.fixture
def dequantizing_route(monkeypatch):
    """Only the fallback route, whatever else is installed."""
    monkeypatch.setattr(routes, "INT8KV", (routes.DEQUANTIZE_INT8KV,))
    attention_int8kv._ROUTES.clear()
    yield
    attention_int8kv._ROUTES.clear()


def int8_case(b=2, hkv=2, group=4, sq=1, sk=1000, d=128, dtype=torch.bfloat16):
    """q as HF hands it (a transposed view of [B, S, H, D]); the int8 cache and scales as Int8StaticCache holds them."""
    q = torch.randn(b, sq, hkv * group, d, dtype=dtype, device="cuda").transpose(1, 2)
    k = torch.randn(b, hkv, sk, d, device="cuda")
    v = torch.randn(b, hkv, sk, d, device="cuda")
    return q, *quantize(k), *quantize(v)


def check(q, k8, ks, v8, vs, seqused_k=None, **flags):
    flags = {**dict(scale=q.shape[-1] ** -0.5, causal=False, window_left=-1, window_right=-1, softcap=0.0), **flags}
    out, lse = OP(q, k8, v8, ks, vs, seqused_k, **flags)
    kd, vd = (x.double() * s.double()[..., None] for x, s in ((k8, ks), (v8, vs)))
    ref_out, ref_lse = reference.attention_forward(q.double(), kd, vd, seqused_k=seqused_k, **flags)
    pt_out, _ = eager(q, kd.to(q.dtype), vd.to(q.dtype), seqused_k, **flags)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert_fa_rule("out", out, ref_out, pt_out)
    # The dequantizing route rounds K to q's dtype first: scores move by ~scale * |q| * 2^-9 * sqrt(D).
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-2)


DECODE = [dict(sq=1, sk=1000), dict(sq=1, sk=4097, d=64), dict(sq=4, sk=777, causal=True), dict(sq=1, sk=1000, hkv=8, group=1)]


@pytest.mark.parametrize("case", DECODE, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantizing_route(dequantizing_route, case, dtype):
    case = dict(case)
    causal = case.pop("causal", False)
    q, k8, ks, v8, vs = int8_case(dtype=dtype, **case)
    assert attention_int8kv.kernel_for(q, k8, v8, ks, vs)[0] == "dequantize"
    used = torch.tensor([k8.shape[2], k8.shape[2] // 3], dtype=torch.int32, device="cuda")
    check(q, k8, ks, v8, vs, used, causal=causal)


def test_dequantizing_route_prefill(dequantizing_route):
    q, k8, ks, v8, vs = int8_case(sq=512, sk=512, d=128)
    check(q, k8, ks, v8, vs, causal=True)


@pytest.mark.parametrize("case", DECODE, ids=str)
def test_the_op_on_its_own_route(case):
    """Whichever route the op takes (the int8 decode kernel once installed)."""
    case = dict(case)
    causal = case.pop("causal", False)
    q, k8, ks, v8, vs = int8_case(**case)
    used = torch.tensor([k8.shape[2] - 5, 17], dtype=torch.int32, device="cuda")
    check(q, k8, ks, v8, vs, used, causal=causal)


def test_key_mask_on_the_dequantizing_route(dequantizing_route):
    """A padding mask (generate's, left-padded) on top of seqused_k: through fa4::attention's key-mask handling."""
    q, k8, ks, v8, vs = int8_case(sq=1, sk=1000)
    key_mask = torch.ones(2, 1000, dtype=torch.bool, device="cuda")
    key_mask[1, :300] = False
    used = torch.tensor([1000, 700], dtype=torch.int32, device="cuda")
    flags = dict(scale=128 ** -0.5, causal=True, window_left=-1, window_right=-1, softcap=0.0)
    out, _ = OP(q, k8, v8, ks, vs, used, key_mask, **flags)
    kd, vd = (x.double() * s.double()[..., None] for x, s in ((k8, ks), (v8, vs)))
    ref_out, _ = reference.attention_forward(q.double(), kd, vd, seqused_k=used, key_mask=key_mask, **flags)
    pt_out, _ = eager(q, kd.to(q.dtype), vd.to(q.dtype), used, key_mask, **flags)
    assert_fa_rule("out", out, ref_out, pt_out)


def test_opcheck_on_cuda():
    q, k8, ks, v8, vs = int8_case(sq=2, sk=300, d=64)
    used = torch.tensor([300, 120], dtype=torch.int32, device="cuda")
    torch.library.opcheck(OP, (q, k8, v8, ks, vs, used), dict(scale=0.125, causal=True))


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=128, attn_implementation="sdpa")
    reference_model = LlamaForCausalLM(config).cuda().eval()
    model = LlamaForCausalLM(config).cuda().eval().to(torch.bfloat16)
    model.load_state_dict(reference_model.state_dict())
    return config, reference_model, model


def test_llama_decode_from_an_int8_cache_under_cuda_graphs():
    config, reference_model, model = tiny_llama()
    prompt = torch.randint(0, 512, (2, 600), device="cuda")
    steps = torch.randint(0, 512, (2, 6), device="cuda")

    def run(m, backend=None):
        cache = {hf.cache_keyword(m): fa4_inductor.Int8StaticCache(config=config, max_cache_len=1024)}

        def step(token, position):
            return m(token, position_ids=position, **cache, use_cache=True).logits[:, -1]

        fn = torch.compile(step, backend=backend, mode="reduce-overhead", fullgraph=True) if backend else step
        m(prompt, position_ids=torch.arange(600, device="cuda")[None].expand(2, -1), **cache, use_cache=True)
        logits = []
        for i in range(steps.shape[1]):
            position = torch.full((2, 1), 600 + i, device="cuda")
            logits.append(fn(steps[:, i:i + 1].clone(), position).float().clone())
        return torch.stack(logits)

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    recorder = Recorder(inductor=True)
    with torch.no_grad():
        expected = run(reference_model)
        bf16_eager = run(model)
        ours = run(model, recorder)
    assert len(recorder.graphs) == 1, [str(r) for r in recorder.records]
    assert recorder.count("fa4::attention_int8kv") == config.num_hidden_layers, [str(r) for r in recorder.records]
    assert not recorder.reasons
    assert not torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    our_error = (ours - expected).abs().max().item()
    eager_error = (bf16_eager - expected).abs().max().item()
    assert our_error <= 2 * eager_error + 1e-3, (our_error, eager_error)


def test_generate_compiles_its_decode_step_with_the_int8_cache():
    from transformers import CompileConfig

    config, reference_model, model = tiny_llama()
    ids = torch.randint(1, 512, (2, 300), device="cuda")
    recorder = Recorder(inductor=True)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=0,
                  return_dict_in_generate=True, output_scores=True)

    def generate(m, **extra):
        cache = fa4_inductor.Int8StaticCache(config=config, max_cache_len=512)
        with torch.no_grad():
            return m.generate(ids, **{hf.cache_keyword(m): cache}, **kwargs, **extra)

    torch._dynamo.reset()
    model.generation_config.compile_config = CompileConfig(backend=recorder, fullgraph=True)
    ours = generate(model)
    model.generation_config.compile_config = None
    bf16_eager = generate(model, disable_compile=True)
    expected = generate(reference_model, disable_compile=True)
    assert recorder.graphs and recorder.count("fa4::attention_int8kv") == len(recorder.graphs) * config.num_hidden_layers
    # The first two steps (greedy choices of a random model may diverge later, at near ties).
    got, bf16, ref = (torch.stack(g.scores[:2]).float() for g in (ours, bf16_eager, expected))
    assert (got - ref).abs().max() <= 2 * (bf16 - ref).abs().max() + 1e-3
