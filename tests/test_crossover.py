"""Small plain attentions stay on SDPA (lowering/crossover.py). The rule applies on CUDA; here the CPU is
added to its devices, so the graphs are what a GPU run gets."""

import pytest
import torch
import torch.nn.functional as F

from fa4_inductor.lowering import crossover
from helpers import Recorder, compile_and_record, recording_compile


@pytest.fixture(autouse=True)
def cpu_counts_as_cuda(monkeypatch):
    monkeypatch.setattr(crossover, "DEVICES", ("cuda", "cpu"))


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def handwritten_causal_gqa(q, k, v):
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    n = q.shape[-2]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def qkv(heads_kv=4):
    return torch.randn(2, 4, 32, 16), torch.randn(2, heads_kv, 32, 16), torch.randn(2, heads_kv, 32, 16)


def test_a_small_sdpa_call_is_kept_with_the_reason():
    q, k, v = qkv()
    rec, out = compile_and_record(sdpa_causal, q, k, v)
    torch.testing.assert_close(out, sdpa_causal(q, k, v))
    assert rec.count() == 0
    assert rec.reasons == ["a small attention (0.00026 GFLOP, under 20 at head dim 16) in a host-bound graph "
                           "(0.00052 GFLOP per attention): SDPA's C++ path has less host overhead than the fa4 op"]


def test_a_small_handwritten_attention_becomes_sdpa_on_the_repeated_kv():
    q, k, v = qkv(heads_kv=2)
    for t in (q, k, v):
        t.requires_grad_()
    rec, out = compile_and_record(handwritten_causal_gqa, q, k, v)
    expected = handwritten_causal_gqa(q, k, v)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), (q, k, v)))
    assert rec.count() == 0 and [r.rewritten for r in rec.records] == [True]
    assert rec.records[0].detail.startswith("F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)")
    sdpa_nodes = [n for g in rec.graphs for n in g.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert len(sdpa_nodes) == 1 and sdpa_nodes[0].args[1].meta["example_value"].shape[1] == 4


def test_above_the_threshold_and_with_the_option_off_the_op_takes_them(monkeypatch):
    q, k, v = qkv()
    rec, _ = compile_and_record(sdpa_causal, q, k, v, small_calls_to_sdpa=False)
    assert rec.count() == 1
    monkeypatch.setattr(crossover.kernel_crossover, "GFLOP_BELOW", ((32, 1e-4), (256, 1e-4)))
    rec, _ = compile_and_record(handwritten_causal_gqa, *qkv(heads_kv=2))
    assert rec.count() == 1


def test_hand_written_windows_go_to_the_op():
    """A hand-written window has no SDPA spelling without a mask."""
    def windowed(q, k, v):
        n = q.shape[-2]
        i = torch.arange(n)
        visible = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 8)
        s = (q @ k.transpose(-2, -1)) * 0.25
        return s.masked_fill(~visible, float("-inf")).softmax(-1) @ v

    q, k, v = qkv()
    rec, out = compile_and_record(windowed, q, k, v)
    torch.testing.assert_close(out, windowed(q, k, v))
    assert rec.count() == 1


def test_symbolic_sizes_are_decided_for_the_call_and_guarded(monkeypatch):
    """A dynamic graph keeps a small call on SDPA, guarded: a later call past the line recompiles and gets the op
    (and one back under the line reuses the first graph, no third compile)."""
    monkeypatch.setattr(crossover, "LAYER_GFLOP_HOST_BOUND", 1e6)  # this test is about the attention's own size
    rec = Recorder()
    torch._dynamo.reset()
    fn = torch.compile(sdpa_causal, backend=rec, dynamic=True)
    small = qkv()  # 2 x 4 x 32 x 16: 0.00026 GFLOP, under the head-dim-16 line of 20
    torch.testing.assert_close(fn(*small), sdpa_causal(*small))
    assert rec.count() == 0 and len(rec.graphs) == 1
    assert rec.reasons[0].endswith("decided for this call's sizes, a guard recompiles for sizes past either line")
    monkeypatch.setattr(crossover.kernel_crossover, "GFLOP_BELOW", ((32, 0.001), (256, 0.001)))
    torch._dynamo.reset()
    fn = torch.compile(sdpa_causal, backend=rec, dynamic=True)
    large = [torch.randn(2, 4, 128, 16) for _ in range(3)]  # 0.0042 GFLOP, over a line of 0.001
    fn(*small)
    assert len(rec.graphs) == 2 and rec.count() == 0
    torch.testing.assert_close(fn(*large), sdpa_causal(*large))
    assert len(rec.graphs) == 3 and rec.count() == 1
    fn(*qkv())
    assert len(rec.graphs) == 3


def test_a_graph_with_enough_gpu_work_per_layer_keeps_the_op(monkeypatch):
    """Host time hides behind the GPU work of the layer: the op's kernel decides, not its host path."""
    def layer(x, w, q, k, v):
        return F.linear(x, w), sdpa_causal(q, k, v)

    x, w = torch.randn(64, 128), torch.randn(256, 128)  # 2 * 64 * 256 * 128 = 0.0042 GFLOP
    assert crossover.graph_work(torch.fx.symbolic_trace(lambda x, w: F.linear(x, w)).graph, {}) is None
    monkeypatch.setattr(crossover, "LAYER_GFLOP_HOST_BOUND", 0.004)
    rec, _ = compile_and_record(layer, x, w, *qkv())
    assert rec.count() == 1
    monkeypatch.setattr(crossover, "LAYER_GFLOP_HOST_BOUND", 0.005)
    rec, _ = compile_and_record(layer, x, w, *qkv())
    assert rec.count() == 0


@pytest.mark.parametrize("host_bound", [True, False])
def test_a_small_sdpa_call_with_a_padding_mask_is_kept(monkeypatch, host_bound):
    """Whatever the graph's GPU work: the op would run a small masked call on its SDPA fallback without reading the
    mask (a bias built, K/V repeated), slower than the call as written (the size sweep's Llama-1B shape, batch 8 x
    512 left-padded: 0.77x default compile)."""
    def padded(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])

    if not host_bound:
        monkeypatch.setattr(crossover, "LAYER_GFLOP_HOST_BOUND", 1e-9)
    q, k, v = qkv()
    keep = torch.arange(32)[None, :] >= torch.tensor([0, 5])[:, None]
    rec, out = compile_and_record(padded, q, k, v, keep)
    torch.testing.assert_close(out, padded(q, k, v, keep))
    assert rec.count() == 0
    assert rec.reasons == ["a small attention (0.00052 GFLOP, under 20 at head dim 16) with a padding mask: the op "
                           "would run it on its SDPA fallback, which builds a bias and repeats K/V, where SDPA as the "
                           "model calls it does less"]


def test_a_causal_mask_read_from_a_module_buffer_is_still_watched():
    """nanoGPT's `bias` buffer, read by value, becomes `is_causal=True`: a later change of the buffer must
    still send the graph back to its traced form (backend.BufferGuard)."""
    import fa4_inductor
    from upstream import CausalSelfAttention

    module = CausalSelfAttention(n_embd=64, n_head=4, block_size=32, flash=False).eval()
    x = torch.randn(2, 32, 64)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=fa4_inductor.fa4_inductor)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x))
        module.bias.copy_(torch.ones_like(module.bias))  # no mask any more
        torch.testing.assert_close(compiled(x), module(x))


def static_cache_decode(q, k_cache, v_cache, offset, weight):
    positions = torch.arange(q.shape[2]) + offset
    mask = torch.arange(k_cache.shape[2])[None, None, None, :] <= positions[None, None, :, None]
    k_cache.index_copy_(2, positions, q[:, :k_cache.shape[1]])
    v_cache.index_copy_(2, positions, q[:, :v_cache.shape[1]])
    out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
    return F.linear(out.transpose(1, 2).flatten(2), weight)


def generate_decode(q, k, v, keep, weight):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
    return F.linear(out.transpose(1, 2).flatten(2), weight)


def decode_inputs(kind):
    q, weight = torch.randn(2, 4, 1, 16), torch.randn(64, 64)
    k, v = torch.randn(2, 4, 32, 16), torch.randn(2, 4, 32, 16)
    if kind == "static cache":
        return static_cache_decode, (q, k, v, torch.tensor(7), weight)
    keep = torch.ones(2, 32, dtype=torch.bool)
    keep[1, :5] = False
    return generate_decode, (q, k, v, keep, weight)


@pytest.mark.parametrize("kind", ["static cache", "generate's mask"])
def test_a_decode_step_in_a_host_bound_graph_stays_on_sdpa(kind):
    """A decode step's SDPA call (a static cache's seqused_k, or generate's padding mask over the cache) in a graph
    that moves little per attention (`crossover.small_decode`) is kept as the model makes it."""
    fn, args = decode_inputs(kind)
    rec, out = compile_and_record(fn, *[a.clone() for a in args])
    torch.testing.assert_close(out, fn(*[a.clone() for a in args]))
    assert rec.count() == 0
    k_and_v, weight = 2 * 2 * 4 * 32 * 16 * 4, 64 * 64 * 4
    assert rec.reasons == [f"a decode step in a host-bound graph ({(k_and_v + weight) / 2 ** 20:.2g} MiB of weights "
                           "and K/V per attention, under 64): SDPA's C++ path has less host overhead than the fa4 op"]


@pytest.mark.parametrize("code", ["sdpa", "hand-written"])
def test_a_decode_step_at_a_head_dim_the_decode_kernel_lacks_stays_as_written(monkeypatch, code):
    """On sm90 (`on_the_decode_kernels_arch`, made true here) a decode step whose head dim the split-KV decode kernel
    does not take would run on FA4, which splits no KV there: Phi-3's head dim 96 ran 0.87x default compile. It stays
    as written, SDPA's or eager code's (`crossover.unsplit_decode`); head dim 128 and other archs go to the op."""
    monkeypatch.setattr(crossover, "DECODE_MIB_HOST_BOUND", 0.0)  # not host-bound here: `small_decode` stays out

    def handwritten(q, k_cache, v_cache, offset, weight):
        positions = torch.arange(q.shape[2]) + offset
        k_cache.index_copy_(2, positions, q[:, :k_cache.shape[1]])
        v_cache.index_copy_(2, positions, q[:, :v_cache.shape[1]])
        s = (q @ k_cache.transpose(-2, -1)) * q.shape[-1] ** -0.5
        mask = torch.arange(k_cache.shape[2])[None, None, None, :] <= positions[None, None, :, None]
        out = s.masked_fill(~mask, float("-inf")).softmax(-1) @ v_cache
        return F.linear(out.transpose(1, 2).flatten(2), weight)

    fn = static_cache_decode if code == "sdpa" else handwritten
    for d, arch, taken in ((96, True, 0), (128, True, 1), (96, False, 1)):
        monkeypatch.setattr(crossover, "on_the_decode_kernels_arch", lambda device, arch=arch: arch)
        args = (torch.randn(2, 4, 1, d), torch.randn(2, 4, 32, d), torch.randn(2, 4, 32, d), torch.tensor(7),
                torch.randn(64, 4 * d))
        rec, out = compile_and_record(fn, *[a.clone() for a in args])
        torch.testing.assert_close(out, fn(*[a.clone() for a in args]), atol=1e-5, rtol=1e-5)
        assert rec.count() == taken, (d, arch, rec.reasons)
        if not taken:
            assert rec.reasons == [f"a decode step at head dim {d}, which the split-KV decode kernel does not take: "
                                   "FA4 on sm90 splits no KV (a CTA a head over the whole cache), slower than the "
                                   "attention as written"]


def _fp8_projection():
    from fa4_inductor.fp8 import Fp8Linear

    project = Fp8Linear(64, 256, bias=False, activation="row", dtype=torch.float32)
    project.weight.copy_(torch.randn(256, 64).to(torch.float8_e4m3fn))
    project.weight_scale.uniform_(0.5, 1.5)
    return project, 4  # as the float32 weight it stands for


def _conv1d_projection():  # HF GPT-2's Conv1D: addmm(bias, x, weight [in, out])
    weight, bias = torch.randn(64, 256), torch.randn(256)
    return lambda x: torch.addmm(bias, x.reshape(-1, 64), weight).reshape(*x.shape[:-1], 256), 4


def _mm_projection():
    weight = torch.randn(64, 256)
    return lambda x: x.reshape(-1, 64).mm(weight), 4


@pytest.mark.parametrize("projection", [_fp8_projection, _conv1d_projection, _mm_projection],
                         ids=["fp8", "addmm", "mm"])
def test_a_decode_step_counts_the_weights_of_every_matmul_spelling(projection):
    """A decode step's weights count toward the bytes it moves however the model's linears spell their matmul, a
    quantized one as the unquantized weight it stands for (elements at the output's size): float8 linears as plain
    buffers (`fp8.Fp8Linear`, `torch._scaled_mm`; a Llama-1B-shaped fp8 step counted only its K/V and lm_head and
    stayed on SDPA, 0.53 ms of cuDNN attention a step on an H100, session 51), HF GPT-2's `Conv1D` (`addmm`), `mm`."""
    torch.manual_seed(0)
    project, weight_bytes = projection()

    def decode(q, k_cache, v_cache, offset):
        positions = torch.arange(q.shape[2]) + offset
        mask = torch.arange(k_cache.shape[2])[None, None, None, :] <= positions[None, None, :, None]
        out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        return project(out.transpose(1, 2).flatten(2))

    args = torch.randn(2, 4, 1, 16), torch.randn(2, 4, 32, 16), torch.randn(2, 4, 32, 16), torch.tensor(7)
    rec, out = compile_and_record(decode, *args)
    torch.testing.assert_close(out, decode(*args))
    k_and_v, weight = 2 * 2 * 4 * 32 * 16 * 4, 256 * 64 * weight_bytes
    assert rec.count() == 0 and rec.reasons == [
        f"a decode step in a host-bound graph ({(k_and_v + weight) / 2 ** 20:.2g} MiB of weights and K/V per "
        "attention, under 64): SDPA's C++ path has less host overhead than the fa4 op"]


def test_gpt_fast_int4_weights_count_as_the_weight_they_stand_for():
    """gpt-fast's int4 linears (`_weight_int4pack_mm`, CUDA only: traced here, not run) count N x K elements at the
    output's size, and 2 x M x N x K FLOP."""
    x, q = torch.randn(2, 256, dtype=torch.bfloat16), torch.randn(1, 4, 8, 16)
    packed = torch.randint(0, 2 ** 31 - 1, (64 // 8, 256 // 64, 32, 4 // 2), dtype=torch.int32)  # N 64, K 256
    scales_and_zeros = torch.randn(256 // 32, 64, 2, dtype=torch.bfloat16)

    def layer(x, packed, scales_and_zeros, q, k, v):
        out = torch.ops.aten._weight_int4pack_mm(x, packed, 32, scales_and_zeros)
        return out, F.scaled_dot_product_attention(q, k, v)

    graph = torch._dynamo.export(layer)(x, packed, scales_and_zeros, q, q.clone(), q.clone()).graph_module.graph
    work = crossover.graph_work(graph, {})
    kv = 2 * q.numel() * 4
    assert work == (2 * 2 * 64 * 256 + 4 * q.numel() * 8, 64 * 256 * 2 + kv, 1)


@pytest.mark.parametrize("kind", ["static cache", "generate's mask"])
def test_a_decode_step_that_moves_more_goes_to_the_op(kind, monkeypatch):
    """The op reads K/V un-repeated (our decode kernel): a graph over the line keeps the op."""
    monkeypatch.setattr(crossover, "DECODE_MIB_HOST_BOUND", 0.01)
    fn, args = decode_inputs(kind)
    rec, out = compile_and_record(fn, *[a.clone() for a in args])
    torch.testing.assert_close(out, fn(*[a.clone() for a in args]))
    assert rec.count() == 1


def test_the_op_sends_small_unmasked_attentions_to_cudnn_sdpa(monkeypatch):
    """What lowering cannot decide on symbolic sizes the op decides per call (`sdpa_cudnn.small_reason`, the same
    `kernels/crossover.small`): here on CPU tensors with the CUDA checks passed as an H200 would."""
    from fa4_inductor.kernels import sdpa_cudnn, switches

    monkeypatch.setattr(switches, "gate", lambda kernel, switch, q, dtypes: None)
    monkeypatch.setattr(switches, "capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    flags = dict(scale=0.125, causal=True, window_left=-1, window_right=-1, softcap=0.0)

    def reason(b, sq, sk, d=64, hq=4, hkv=1, **extra):  # the size sweep's hidden-256 Llama
        q = torch.randn(b, sq, hq, d).transpose(1, 2)
        k, v = (torch.randn(b, sk, hkv, d).transpose(1, 2) for _ in range(2))
        return sdpa_cudnn.small_reason(q, k, v, **{**flags, **extra})

    assert reason(8, 128, 128) is None and reason(8, 2048, 2048) is None  # 1.1 and 17 GFLOP at head dim 64
    assert reason(8, 8192, 8192) == "not a small attention (crossover.py): FA4's host path is worth it"
    assert reason(2, 128, 256).startswith("causal with several query tokens over more keys")
    assert reason(2, 128, 256, causal=False) is None
    assert reason(2, 128, 128, seqused_k=torch.full((2,), 100)).startswith("per-sequence cache lengths")
    assert reason(2, 128, 128, window_left=16).startswith("softcap or a local window")


@pytest.mark.parametrize("sq, causal", [(1, True), (64, True), (64, False)])
def test_the_cudnn_adapter_passes_causal_through(monkeypatch, sq, causal):
    """`sdpa_cudnn.forward` against the float64 reference, with cuDNN's kernel replaced by PyTorch's math SDPA of the
    same arguments (top-left causal): a dropped causal flag changes every output row but the last."""
    from fa4_inductor.kernels import reference, sdpa_cudnn

    def cudnn(q, k, v, bias, lse, dropout, is_causal, debug, scale=None):
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        s = (q @ k.transpose(-2, -1)) * scale
        if is_causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1) @ v, s.logsumexp(-1)

    monkeypatch.setattr(sdpa_cudnn, "_CUDNN", cudnn)
    flags = dict(scale=0.25, causal=causal, window_left=-1, window_right=-1, softcap=0.0)
    q = torch.randn(2, sq, 4, 16, dtype=torch.float64).transpose(1, 2)
    k, v = (torch.randn(2, 64, 2, 16, dtype=torch.float64).transpose(1, 2) for _ in range(2))
    out, lse = sdpa_cudnn.forward(q, k, v, **flags)
    ref_out, ref_lse = reference.attention_forward(q, k, v, seqused_k=None, **flags)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-6, rtol=0)


def test_a_small_sdpa_call_with_a_causal_mask_drops_the_mask():
    """HF passes an unpadded batch's causal band as a mask, which default compile builds and reads at every layer:
    a small call becomes SDPA with `is_causal` and no mask (`enable_gqa` kept), the band's nodes dead."""
    def masked(q, k, v):
        n = q.shape[-2]
        band = torch.ones(n, n, dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=band[None, None], enable_gqa=True)

    q, k, v = qkv(heads_kv=2)
    rec, out = compile_and_record(masked, q, k, v)
    torch.testing.assert_close(out, masked(q, k, v))
    assert rec.count() == 0
    assert rec.records[0].detail.startswith("F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25): "
                                            "a small attention")
    (node,) = [n for g in rec.graphs for n in g.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert node.kwargs["is_causal"] is True and node.kwargs["enable_gqa"] is True and len(node.args) == 3
    assert not any(n.target in (torch.ones, "tril") for g in rec.graphs for n in g.graph.nodes)


@pytest.mark.slow  # 8 s a code: the fast tier's 5 minutes
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_small_hf_llama_in_a_dynamic_graph_runs_sdpa_without_its_mask(attention):
    """The size sweep's case: HF Llama, `use_cache=False`, an unpadded batch of 2, compiled with `dynamic=True`:
    each layer's attention (an SDPA call, or eager code's softmax) becomes SDPA without the causal mask HF builds,
    the graph is guarded for the sizes, and the logits match eager's. With a padded batch, SDPA code keeps its
    masked calls as written; eager code's become SDPA with HF's additive mask (the padded rows' logits, where a
    query sees no key, included)."""
    from fa4_inductor.bench import models

    model = models.llama(attention, "cpu", torch.float32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    tokens = torch.randint(1, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    rec = Recorder()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=rec, dynamic=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens, use_cache=False).logits, model(tokens, use_cache=False).logits)
    assert rec.count() == 0
    assert [r.detail.split(":")[0] for r in rec.records if r.rewritten] == [
        "F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)"] * 2
    assert all(r.detail.endswith("a guard recompiles for sizes past either line") for r in rec.records if r.rewritten)
    mask = torch.ones_like(tokens)
    mask[1, :5] = 0
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens, attention_mask=mask, use_cache=False).logits,
                                   model(tokens, attention_mask=mask, use_cache=False).logits)
    padded = rec.records[2:]
    assert len(padded) == 2 and rec.count() == 0
    if attention == "sdpa":
        assert not any(r.rewritten for r in padded) and all(r.detail.startswith("a small attention") for r in padded)
    else:  # HF's additive mask is the last step before the softmax: SDPA takes it as it is
        assert all(r.rewritten and r.detail.startswith(
            "F.scaled_dot_product_attention(q, k, v, attn_mask=the additive mask, scale=0.25): a small") for r in padded)


def handwritten_padded(scale_last: bool, fill: float):
    def attend(q, k, v, attention_mask):
        n = q.shape[-2]
        keep = torch.ones(n, n, dtype=torch.bool).tril()[None, None] & attention_mask[:, None, None, :].bool()
        bias = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, fill)
        s = q @ k.transpose(-2, -1)
        s = (s + bias) * 0.25 if scale_last else s * 0.25 + bias
        return s.softmax(-1) @ v
    return attend


@pytest.mark.parametrize("scale_last, fill, outcome", [(False, torch.finfo(torch.float32).min, "sdpa"),
                                                       (True, torch.finfo(torch.float32).min, "op"),
                                                       (False, float("-inf"), "kept")],
                         ids=["mask-last", "scaled-after-the-mask", "minus-inf"])
def test_a_small_padded_handwritten_attention_passes_its_additive_mask_to_sdpa(scale_last, fill, outcome):
    """SDPA computes softmax(q k^T * scale + mask): the mask goes as it is only when it is added last, with a finite
    fill (a query that sees no key averages V in both); scaled after, the op takes the call; an -inf fill (NaN rows
    in eager) stays as written."""
    q, k, v = qkv()
    attention_mask = torch.ones(2, 32, dtype=torch.long)
    attention_mask[1, :7] = 0
    fn = handwritten_padded(scale_last, fill)
    rec, out = compile_and_record(fn, q, k, v, attention_mask)
    expected = fn(q, k, v, attention_mask)
    torch.testing.assert_close(out, expected, equal_nan=True)
    assert rec.count() == (outcome == "op")
    assert rec.records[0].rewritten == (outcome != "kept")
    assert rec.records[0].detail.startswith("F.scaled_dot_product_attention(q, k, v, attn_mask=the additive mask, "
                                            "scale=0.25): a small attention") == (outcome == "sdpa")


@pytest.mark.parametrize("min_keys, option", [(16, True), (None, True), (None, False)])
def test_in_training_a_padded_handwritten_attention_goes_to_the_op_from_a_key_count(monkeypatch, min_keys, option):
    """A query row that sees no key still passes eager's softmax gradient to q and k, which SDPA's backward over
    the same mask does not give: in training the call is not SDPA's but the op's, whose rows that see no key get
    eager's gradient (`blind_rows_as_eagers`), from `PADDED_TRAINING_MIN_KEYS` keys; under it, as written, unless
    `small_calls_to_sdpa` is off."""
    if min_keys is not None:
        monkeypatch.setattr(crossover, "PADDED_TRAINING_MIN_KEYS", min_keys)
    q, k, v = (t.requires_grad_() for t in qkv())
    attention_mask = torch.ones(2, 32, dtype=torch.long)
    attention_mask[1, :7] = 0
    fn = handwritten_padded(False, torch.finfo(torch.float32).min)
    rec, out = compile_and_record(fn, q, k, v, attention_mask, small_calls_to_sdpa=option)
    expected = fn(q, k, v, attention_mask)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), (q, k, v)))
    if min_keys is not None or not option:
        assert rec.count() == 1 and "rows that see no key: mean of V" in rec.records[0].detail, rec.records
    else:
        assert rec.count() == 0
        assert rec.records[0].detail == ("a short attention in padded training (32 keys, under 2048): eager's is "
                                         "cheap there, and the op with eager's gradient for rows that see no key "
                                         "ran slower than default compile"), rec.records


def test_a_small_decode_step_over_an_int8_cache_keeps_the_int8_op():
    """An int8 cache is read as int8 by `fa4::attention_int8kv`; SDPA would read it dequantized (K/V repeated for GQA
    by HF's sdpa code before the call: the dequantization is found behind the repetition)."""
    from transformers import StaticCache

    from fa4_inductor import Int8StaticCache, hf
    from helpers import tiny

    model = tiny("llama", "sdpa").model
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(2))
    for cache_class, op in ((Int8StaticCache, "fa4::attention_int8kv"), (StaticCache, None)):
        cache = cache_class(config=model.config, max_cache_len=32)
        torch._dynamo.reset()
        rec = Recorder()
        with torch.no_grad():
            model(input_ids=ids, use_cache=True, **{hf.cache_keyword(model): cache})
            torch.compile(model, backend=rec)(input_ids=ids[:, :1], use_cache=True, **{hf.cache_keyword(model): cache})
        if op:
            assert rec.count(op) == model.config.num_hidden_layers, [str(r) for r in rec.records]
        else:
            assert rec.count() == 0 and all(r.startswith("a decode step") for r in rec.reasons), rec.reasons


def test_a_decode_step_over_a_growing_cache_is_decided_under_a_guard(monkeypatch):
    """A DynamicCache's length is symbolic: the line is decided for the call being compiled, and a cache grown past
    it recompiles once and goes to the op."""
    q, weight = torch.randn(2, 4, 1, 16), torch.randn(64, 64)

    def inputs(sk):
        keep = torch.ones(2, sk, dtype=torch.bool)
        keep[1, :5] = False
        return q, torch.randn(2, 4, sk, 16), torch.randn(2, 4, sk, 16), keep, weight

    weight_bytes, kv_bytes_per_key = 64 * 64 * 4, 2 * 2 * 4 * 16 * 4
    monkeypatch.setattr(crossover, "DECODE_MIB_HOST_BOUND", (weight_bytes + 48 * kv_bytes_per_key) / 2 ** 20)
    rec, compiled = recording_compile(generate_decode, dynamic=True)
    for sk in (32, 40, 64, 80):
        args = inputs(sk)
        torch.testing.assert_close(compiled(*args), generate_decode(*args))
    assert len(rec.graphs) == 2 and rec.count() == 1, [str(r) for r in rec.records]
    assert rec.reasons == ["a decode step in a host-bound graph (0.047 MiB of weights and K/V per attention, under "
                           "0.0625): SDPA's C++ path has less host overhead than the fa4 op; decided for this call's "
                           "sizes, a guard recompiles for sizes past either line"]


def test_a_small_chunk_over_a_cache_is_kept_as_written():
    """Four queries at the end of 32 cached keys under a causal band aligned to the last key: the SDPA call is kept as
    the model wrote it (an `is_causal` SDPA call would align the band to the first key)."""
    def chunk(q, k, v, weight):
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.arange(sk)[None, :] <= (torch.arange(sq) + (sk - sq))[:, None]
        return F.linear(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2), weight)

    args = torch.randn(2, 4, 4, 16), torch.randn(2, 4, 32, 16), torch.randn(2, 4, 32, 16), torch.randn(64, 64)
    rec, out = compile_and_record(chunk, *args)
    torch.testing.assert_close(out, chunk(*args))
    assert rec.count() == 0 and len(rec.reasons) == 1 and rec.reasons[0].startswith("a decode step")
    assert not [n for g in rec.graphs for n in g.graph.nodes if n.name.startswith("sdpa_small")]


def test_few_queries_over_many_keys_in_training_go_to_the_op():
    """`small_decode` is for inference: with gradients (cross-attention to a short target) the op takes the call."""
    fn, args = decode_inputs("generate's mask")
    q, k, v, keep, weight = (a.clone() for a in args)
    for t in (q, k, v):
        t.requires_grad_()
    rec, out = compile_and_record(fn, q, k, v, keep, weight)
    expected = fn(q, k, v, keep, weight)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(expected.sum(), (q, k, v)))
    assert rec.count() == 1


@pytest.mark.parametrize("option", [True, False])
def test_a_small_attention_with_a_run_time_mask_in_training_is_kept(monkeypatch, option):
    """A float mask input (eager code's run-time mask: packed sequences) in training: the op would read no form of a
    small attention's mask on CUDA and run its reference backward, so it is kept as written, with the reason, unless
    `small_calls_to_sdpa` is off; gradients eager's either way."""
    def fn(q, k, v, mask):
        return torch.softmax(q @ k.mT * 0.25 + mask, -1) @ v

    q, k, v = (t.requires_grad_() for t in qkv(heads_kv=4))
    packed = torch.block_diag(torch.ones(12, 12), torch.ones(20, 20)).bool() & torch.ones(32, 32).tril().bool()
    mask = torch.zeros(2, 1, 32, 32).masked_fill(~packed, torch.finfo(torch.float32).min)
    rec, out = compile_and_record(fn, q, k, v, mask, small_calls_to_sdpa=option)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    torch.testing.assert_close(grads, torch.autograd.grad(fn(q, k, v, mask).sum(), (q, k, v)))
    if option:
        assert rec.count() == 0 and "in training with a mask known at run time only" in rec.reasons[0], rec.reasons
    else:
        assert rec.count() == 1, rec.reasons
