"""GPU tier: `fa4::nvfp4_linear` on CUDA (kernels/nvfp4_linear.py), run with `pytest -m gpu` on the H200.

Numerics against the float64 exact dequantization (tests/test_nvfp4_linear.py): our max abs error is at most
2x the error of PyTorch's own computation (the weight dequantized to x's dtype, then cuBLAS), plus 1e-5 of
the output's scale. Calls of at most `QUACK_MAX_M` rows go to quack's W4A16 GEMM where the adapter takes them,
the rest to the dequantize-then-cuBLAS path; each test says which it ran.
"""

import pytest
import torch
import torch.nn.functional as F

from fa4_inductor.kernels import NVFP4_LINEAR
from fa4_inductor.kernels import nvfp4_linear as nvfp4_op
from gpu_helpers import capture
from test_nvfp4_linear import float64_dequantized, float64_reference, random_nvfp4

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("without_fx_graph_cache")]  # conftest.py: a cache hit skips the passes


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def check(m, n, k, dtype, with_bias=True, seed=0):
    w_fp4, block, global_scale = random_nvfp4(n, k, seed=seed, device="cuda")
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    bias = torch.randn(n, dtype=dtype, device="cuda") if with_bias else None
    kernel, why = nvfp4_op.kernel_for(x, w_fp4)
    out = NVFP4_LINEAR(x, w_fp4, block, global_scale, bias)
    assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()
    assert out.isfinite().all(), f"{kernel} gives non-finite values"
    ref = float64_reference(x, w_fp4, block, global_scale, bias)
    pytorch = F.linear(x, nvfp4_op.dequantize(w_fp4, block, global_scale, dtype), bias)
    err, pt_err = (out.double() - ref).abs().max().item(), (pytorch.double() - ref).abs().max().item()
    bound = 2 * pt_err + 1e-5 * ref.abs().max().item()
    assert err <= bound, f"{kernel} ({why or 'taken'}): error {err:.3g} > 2 x PyTorch's {pt_err:.3g} + 1e-5 of the scale"
    return kernel, why


@pytest.mark.parametrize("m", [*range(1, 17), 64, 65, 256, 2048])
def test_bf16_llama_projection(m):
    check(m, 2048, 4096, torch.bfloat16)


@pytest.mark.parametrize("m", [1, 16, 64, 300])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_other_dtypes_and_a_small_weight(dtype, m):
    check(m, 256, 512, dtype, with_bias=False)


def test_3d_x_and_a_transposed_2d_x():
    w_fp4, block, global_scale = random_nvfp4(512, 1024, device="cuda")
    for x in (torch.randn(2, 3, 1024, dtype=torch.bfloat16, device="cuda"),
              torch.randn(1024, 5, dtype=torch.bfloat16, device="cuda").t()):
        out = NVFP4_LINEAR(x, w_fp4, block, global_scale)
        ref = float64_reference(x, w_fp4, block, global_scale)
        torch.testing.assert_close(out.double(), ref, atol=2e-2 * ref.abs().max().item(), rtol=2e-2)


def test_small_m_bf16_runs_on_our_gemm_then_the_next_route():
    kernel, why = check(1, 2048, 4096, torch.bfloat16)
    assert kernel == "w4a16", why
    kernel, why = check(nvfp4_op.W4A16_MAX_M + 1, 2048, 4096, torch.bfloat16)
    assert kernel == ("quack" if nvfp4_op.QUACK_ROUTE else "dequantize"), why


@pytest.mark.parametrize("m", [1, 8, 256])
def test_cuda_graph_capture_and_replay(m):
    n, k = 1024, 2048
    w_fp4, block, global_scale = random_nvfp4(n, k, device="cuda")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    graph, out = capture(lambda: NVFP4_LINEAR(x, w_fp4, block, global_scale, bias))
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        ref = float64_reference(x, w_fp4, block, global_scale, bias)
        torch.testing.assert_close(out.double(), ref, atol=2e-2 * ref.abs().max().item(), rtol=2e-2)
        assert torch.equal(out, NVFP4_LINEAR(x, w_fp4, block, global_scale, bias)) or \
            nvfp4_op.kernel_for(x, w_fp4)[0] == "quack"  # quack may split K (summation order varies)


@pytest.mark.parametrize("m", [1, 8, 32, 256])
def test_blocked_scales_give_the_row_major_results(m):
    """`scale_layout="blocked"` on every route: the scales un-blocked once per tensor, then the row-major call."""
    from fa4_inductor.kernels import prepared_weights
    from test_nvfp4_linear import blocked

    n, k = 1024, 2048
    w_fp4, block, global_scale = random_nvfp4(n, k, device="cuda")
    raw = blocked(block, (32 * n // 128, 16 * k // 64))
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    expected = NVFP4_LINEAR(x, w_fp4, block, global_scale)
    got = NVFP4_LINEAR(x, w_fp4, raw, global_scale, scale_layout="blocked")
    assert prepared_weights.holds(raw, nvfp4_op.UNBLOCKED_KIND)
    if nvfp4_op.kernel_for(x, w_fp4)[0] == "quack":  # quack may split K (summation order varies)
        torch.testing.assert_close(got, expected, atol=1e-2 * expected.abs().max().item(), rtol=1e-2)
    else:
        assert torch.equal(got, expected)


@pytest.mark.parametrize("warm", [True, False], ids=["prepared-before-capture", "first-met-in-capture"])
def test_blocked_scales_under_cuda_graph_capture(warm):
    """Scales un-blocked in an eager call before capture are read as prepared; scales first met during capture
    are un-blocked inside the graph (a recorded copy): either way every replay is the row-major call's result."""
    from fa4_inductor.kernels import prepared_weights
    from test_nvfp4_linear import blocked

    n, k = 1024, 2048
    w_fp4, block, global_scale = random_nvfp4(n, k, device="cuda")
    raw = blocked(block, (32 * n // 128, 16 * k // 64))
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    def step():
        return NVFP4_LINEAR(x, w_fp4, raw, global_scale, scale_layout="blocked")

    if warm:
        graph, out = capture(step)  # its warm-up call prepares the scales
    else:
        NVFP4_LINEAR(x, w_fp4, raw.clone(), global_scale, scale_layout="blocked")  # kernels compiled, other scales
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            out = step()
        assert not prepared_weights.holds(raw, nvfp4_op.UNBLOCKED_KIND)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, NVFP4_LINEAR(x, w_fp4, block, global_scale))


# ---------------------------------------------------------------------------------- a compiled model on CUDA


def nvfp4_llama():
    """A small Llama (hidden 512, 2 layers) in bf16 on CUDA, every linear quantized to NVFP4Linear, and its float64
    twin holding the exact dequantized weights."""
    import copy

    import transformers

    from fa4_inductor import nvfp4

    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    quantized = nvfp4.quantize(model)
    reference = copy.deepcopy(model).double()
    for name in quantized:
        layer = model.get_submodule(name)
        exact = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None).double()
        exact.weight.data = float64_dequantized(layer.weight_packed, layer.weight_scale, layer.weight_decode_scale)
        parent, _, child = name.rpartition(".")
        setattr(reference.get_submodule(parent) if parent else reference, child, exact)
    return model.to(device="cuda", dtype=torch.bfloat16), reference.cuda(), quantized


def assert_within_twice_eager(name, got, eager, ref):
    err, eager_err = (got.double() - ref).abs().max().item(), (eager.double() - ref).abs().max().item()
    assert err <= 2 * eager_err + 1e-5 * ref.abs().max().item(), f"{name}: error {err:.3g}, eager bf16's {eager_err:.3g}"


def test_compiled_llama_runs_every_linear_on_the_op():
    """A decode-shaped call (1 row) runs every quantized linear through the op (our W4A16 GEMM); a prefill (2 x 64
    tokens: 128 rows, where default compile is faster) keeps every one as written, with the reason. Both within 2x
    the error of the eager bf16 NVFP4 model against the float64 model."""
    import fa4_inductor

    model, reference, quantized = nvfp4_llama()
    for shape, rewritten in (((1, 1), True), ((2, 64), False)):
        torch._dynamo.reset()
        compiled = torch.compile(lambda ids: model(ids).logits, backend=fa4_inductor.backend(nvfp4_linear=True))
        ids = torch.randint(0, 1024, shape, device="cuda")
        with torch.no_grad(), fa4_inductor.report.collecting() as records:
            assert_within_twice_eager(f"ids {shape}", compiled(ids), model(ids).logits, reference(ids).logits)
        nvfp4_records = [r for r in records if r.family == "nvfp4_linear"]
        assert nvfp4_records and all(r.rewritten == rewritten for r in nvfp4_records), [str(r) for r in nvfp4_records]
        if not rewritten:
            assert all("128 rows of x" in r.detail for r in nvfp4_records), [str(r) for r in nvfp4_records]
        assert all(any(r.module.endswith(name) for r in nvfp4_records) for name in quantized), \
            sorted({r.module for r in nvfp4_records})


def test_reduce_overhead_decode_replays_cuda_graphs_with_the_op():
    from torch._dynamo.utils import counters

    import fa4_inductor

    model, reference, _ = nvfp4_llama()
    counters.clear()
    torch._dynamo.reset()
    compiled = torch.compile(lambda ids: model(ids).logits, backend=fa4_inductor.backend(nvfp4_linear=True),
                             mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):  # warm-up run, recording, replay
            ids = torch.randint(0, 1024, (1, 1), device="cuda")
            assert_within_twice_eager("decode", compiled(ids).clone(), model(ids).logits, reference(ids).logits)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.parametrize("m, n, rewritten", [(1, 2048, True), (16, 2048, True), (256, 2048, False),
                                             (256, 4096, True)])
def test_torchao_nvfp4_weight_only_on_cuda(m, n, rewritten):
    """torchao's `NVFP4WeightOnlyConfig` on CUDA (its dequantization is the CPU one, read from source): the op takes
    it up to 16 rows (our W4A16 GEMM), and up to 256 rows of a weight of 16M weights or more (quack's GEMM); it leaves
    256 rows of a smaller weight to default compile (kernels/nvfp4_linear.rows_reason). Within 2x eager torchao's
    error against the float64 exact dequantization."""
    pytest.importorskip("torchao")
    import fa4_inductor
    from test_nvfp4_linear import torchao_reference
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig
    from torchao.quantization import quantize_

    k = 4096
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(k, n)).to(device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    quantize_(model, NVFP4WeightOnlyConfig())
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    torch._dynamo.reset()
    with torch.no_grad(), fa4_inductor.report.collecting() as records:
        got = torch.compile(model, backend=fa4_inductor.backend(nvfp4_linear=True))(x)
        eager = model(x)
    assert [r.rewritten for r in records if r.family == "nvfp4_linear"] == [rewritten], [str(r) for r in records]
    assert_within_twice_eager(f"torchao m={m}", got, eager, torchao_reference(model, x, n, k))


def test_torchao_blocked_scales_are_unblocked_once_under_cuda_graphs():
    """torchao's `NVFP4WeightOnlyConfig`, decode-sized, reduce-overhead: the op reads the stored swizzled scales
    (`scale_layout="blocked"`), un-blocked once in the warm-up call (`prepared_weights`), so the compiled code has
    no un-swizzle kernel; the recorded graph's replays stay within 2x eager torchao's error."""
    pytest.importorskip("torchao")
    import re

    import fa4_inductor
    from test_nvfp4_linear import torchao_reference
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig
    from torchao.quantization import quantize_

    from fa4_inductor.kernels import prepared_weights

    n, k = 2048, 4096
    model = torch.nn.Sequential(torch.nn.Linear(k, n)).to(device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    quantize_(model, NVFP4WeightOnlyConfig())
    counters.clear()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=fa4_inductor.backend(nvfp4_linear=True), mode="reduce-overhead")
    with torch.no_grad():
        for step in range(4):  # warm-up run, recording, replays
            x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
            if step == 0:
                got, codes = run_and_get_code(compiled, x)
            else:
                got = compiled(x)
            assert_within_twice_eager(f"torchao step {step}", got.clone(), model(x), torchao_reference(model, x, n, k))
    assert "scale_layout='blocked'" in codes[0]
    assert not re.search(r"def triton_\w*permute", codes[0]), "an un-swizzle kernel is still in the compiled code"
    assert prepared_weights.holds(model[0].weight.scale, nvfp4_op.UNBLOCKED_KIND)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
