"""GPU tier: quantized linears on CUDA (`pytest -m gpu tests/test_gpu_quant.py` on an sm90 GPU).

`fa4::int8_linear`'s CUDA routes (our W4A16 GEMM for decode-sized calls where it is measured faster, quack's
int8 GEMM up to `QUACK_MAX_ROWS` rows (`QUACK_MAX_ROWS_WIDE` over wide weights), the dense route above),
quack's NVFP4 GEMM through the adapter (`kernels/quack_w4a16.py`), `fa4::int8_int8_linear`; weights prepared
once (in the warm-up call, never during CUDA-graph capture), and the families through the backend.

Numerics: fresh random inputs against the exactly dequantized weight in float64; our max error is at most
2x that of PyTorch's own bf16 computation of the same thing (the model code run eagerly) plus 1e-5 of the
output's scale. Shapes include M = 1..16, N not a multiple of quack's 128-row tile, K not a multiple of 128.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fa4_inductor
import upstream
from fa4_inductor import nvfp4, report
from fa4_inductor.kernels import int8_int8_linear as int8_int8_op
from fa4_inductor.kernels import int8_linear as int8_linear_op
from fa4_inductor.kernels import prepared_weights, quack_w4a16
from gpu_helpers import assert_within_pytorch_error, capture
from helpers import assert_within_int8_int8_bound

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("without_fx_graph_cache")]  # conftest.py: a cache hit skips the passes

INT8_LINEAR = torch.ops.fa4.int8_linear.default
INT8_INT8_LINEAR = torch.ops.fa4.int8_int8_linear.default


@pytest.fixture(autouse=True)
def sm90():
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"quack's mixed-input GEMM is wired for sm90, not sm{major}{minor}")
    reason = quack_w4a16.limits_reason("cuda", torch.bfloat16, (major, minor), "int8", 64, 64)
    if reason is not None:
        pytest.skip(reason)
    torch.manual_seed(0)
    prepared_weights.clear()


def int8_weight(n, k, scale_dtype=torch.bfloat16, group_size=-1):
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    shape = (n,) if group_size == -1 else (n, k // group_size)
    return w, (torch.rand(shape, device="cuda") / 64 + 1e-3).to(scale_dtype)


def int8_reference(x, w, scale, bias=None, group_size=-1):
    n, k = w.shape
    group = k if group_size == -1 else group_size
    dequantized = (w.double().view(n, k // group, group) * scale.double().view(n, -1, 1)).view(n, k)
    out = x.double() @ dequantized.T
    return out if bias is None else out + bias.double()


class BuildCounter:
    """Counts the builds `prepared_weights.get` runs (per kind)."""

    def __init__(self, monkeypatch):
        self.kinds = []
        real = prepared_weights.get

        def counting(weight, kind, build):
            def counted():
                self.kinds.append(kind)
                return build()
            return real(weight, kind, counted)

        monkeypatch.setattr(prepared_weights, "get", counting)


# ------------------------------------------------------------------------------------- fa4::int8_linear

SHAPES = [(192, 320), (256, 128), (2048, 2048)]  # (N, K): 192 is not a multiple of 128, 320 not of 128
ROWS = [1, 3, 16, 17, 64, 65, 256, 257]  # ours up to 16, quack up to 256 (each tile config is a JIT compile: few)


def int8_route(m, n, k):
    """The route `fa4::int8_linear` must take for a bf16 x of m rows over an [n, k] per-channel weight."""
    if int8_linear_op.w4a16_int8_shape_reason(m, n, k) is None and k % 16 == 0:
        return "w4a16_int8"
    return "dense" if int8_linear_op.rows_reason(m, n) else "quack_int8"


@pytest.mark.parametrize("scale_after_matmul, scale_dtype, bias", [(True, torch.bfloat16, False),
                                                                   (False, torch.bfloat16, True),
                                                                   (False, torch.float32, False)],
                         ids=["gpt-fast", "dequantize-bf16-scale-bias", "dequantize-fp32-scale"])
@pytest.mark.parametrize("n, k", SHAPES, ids=str)
@pytest.mark.parametrize("m", ROWS)
def test_int8_linear_routes_and_numerics(m, n, k, scale_after_matmul, scale_dtype, bias):
    w, scale = int8_weight(n, k, scale_dtype)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, dtype=torch.bfloat16, device="cuda") if bias else None
    kwargs = dict(scale_after_matmul=scale_after_matmul)
    route, why = int8_linear_op.kernel_for(x, w, scale, b, **kwargs)
    assert route == int8_route(m, n, k), why
    out = INT8_LINEAR(x, w, scale, b, **kwargs)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16 and out.is_contiguous()
    pytorch = int8_linear_op.int8_linear(x, w, scale, b, **kwargs)  # the model code's arithmetic, eager
    assert_within_pytorch_error(f"{route} m={m}", out, int8_reference(x, w, scale, b), pytorch)


@pytest.mark.parametrize("m", [257, 1024, 4096, 4097])
def test_int8_linear_wide_weights_above_256_rows(m):
    """Weights of QUACK_WIDE_N rows take quack up to QUACK_MAX_ROWS_WIDE rows of x, then `dense`."""
    n, k = int8_linear_op.QUACK_WIDE_N, 256
    w, scale = int8_weight(n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    route, why = int8_linear_op.kernel_for(x, w, scale, scale_after_matmul=True)
    assert route == ("quack_int8" if m <= int8_linear_op.QUACK_MAX_ROWS_WIDE else "dense"), why
    out = INT8_LINEAR(x, w, scale, None, scale_after_matmul=True)
    assert_within_pytorch_error(f"{route} m={m}", out, int8_reference(x, w, scale),
                                int8_linear_op.int8_linear(x, w, scale, scale_after_matmul=True))


@pytest.mark.parametrize("x_shape", [(2, 3), (1, 1), (4, 16)], ids=str)
def test_int8_linear_3d_x_takes_its_route(x_shape):
    n, k = 256, 512
    w, scale = int8_weight(n, k)
    x = torch.randn(*x_shape, k, dtype=torch.bfloat16, device="cuda")
    rows = x.numel() // k
    assert int8_linear_op.kernel_for(x, w, scale, scale_after_matmul=True)[0] == int8_route(rows, n, k)
    out = INT8_LINEAR(x, w, scale, None, scale_after_matmul=True)
    assert out.shape == (*x_shape, n)
    assert_within_pytorch_error("3-D x", out, int8_reference(x, w, scale),
                                int8_linear_op.int8_linear(x, w, scale, scale_after_matmul=True))


@pytest.mark.parametrize("case, reason", [
    ("per-group", "quack's int8 GEMM takes per-channel scales, not groups of 64"),
    ("float16", "quack's W4A16 GEMM takes bfloat16 activations, not float16"),
    ("odd-n", "quack's int8 weights need N a multiple of 64 (its repack does not pad); N is 200"),
    ("odd-k", "quack's W4A16 GEMM needs K a multiple of 64; K is 200"),
])
def test_int8_linear_calls_quack_declines_run_dense(case, reason):
    n, k, group, dtype = 256, 512, -1, torch.bfloat16
    if case == "per-group":
        group = 64
    elif case == "float16":
        dtype = torch.float16
    elif case == "odd-n":
        n = 200
    else:
        k = 200
    w, scale = int8_weight(n, k, dtype, group)
    x = torch.randn(32, k, dtype=dtype, device="cuda")  # above our W4A16 GEMM's rows
    route, why = int8_linear_op.kernel_for(x, w, scale, group_size=group)
    assert route == "dense" and why.endswith(reason), why
    out = INT8_LINEAR(x, w, scale, None, group_size=group)
    torch.testing.assert_close(out, int8_linear_op.int8_linear(x, w, scale, group_size=group), atol=0, rtol=0)


def test_int8_weight_prepared_once_and_again_after_an_update(monkeypatch):
    counter = BuildCounter(monkeypatch)
    w, scale = int8_weight(256, 512)
    x = torch.randn(32, 512, dtype=torch.bfloat16, device="cuda")  # quack's rows
    for _ in range(3):
        INT8_LINEAR(x, w, scale, None, scale_after_matmul=True)
    assert counter.kinds == ["quack_int8"]
    w.neg_()  # an in-place update (load_state_dict does the same): the next call repacks
    out = INT8_LINEAR(x, w, scale, None, scale_after_matmul=True)
    assert counter.kinds == ["quack_int8"] * 2
    assert_within_pytorch_error("after the update", out, int8_reference(x, w, scale),
                                int8_linear_op.int8_linear(x, w, scale, scale_after_matmul=True))


@pytest.mark.parametrize("m", [1, 16, 32, 128])
def test_int8_linear_under_cuda_graph_replay(m, monkeypatch):
    counter = BuildCounter(monkeypatch)
    w, scale = int8_weight(256, 512)
    bias = torch.randn(256, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(m, 512, dtype=torch.bfloat16, device="cuda")
    graph, out = capture(lambda: INT8_LINEAR(x, w, scale, bias))  # the warm-up run prepares the weight
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert_within_pytorch_error(f"replay m={m}", out, int8_reference(x, w, scale, bias),
                                    int8_linear_op.int8_linear(x, w, scale, bias))
    assert counter.kinds == (["quack_int8"] if int8_route(m, 256, 512) == "quack_int8" else [])


# ------------------------------------------------------------------------------------------ quack nvfp4

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def nvfp4_weight(n, k):
    """Random codes (every nibble value), positive e4m3 block scales, a float32 0-d global scale."""
    w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
    block_scale = (torch.rand(n, k // 16, device="cuda") * 3 + 0.05).to(torch.float8_e4m3fn)
    global_scale = torch.tensor(0.37, device="cuda")
    return w_fp4, block_scale, global_scale


def nvfp4_dequantized(w_fp4, block_scale, global_scale, dtype=torch.float64):
    """w[n, k] = e2m1(code)[n, k] * block_scale[n, k // 16] * global_scale, element 2i in the low nibble."""
    lut = torch.tensor(E2M1, dtype=torch.float64, device=w_fp4.device)
    codes = torch.stack([w_fp4 & 0xF, w_fp4 >> 4], dim=-1).view(w_fp4.shape[0], -1).long()
    w = lut[codes] * block_scale.double().repeat_interleave(16, dim=1) * global_scale.double()
    return w.to(dtype)


@pytest.mark.parametrize("n, k", [(192, 320), (256, 128), (2048, 2048), (100, 64)], ids=str)
@pytest.mark.parametrize("m", [1, 16, 200])
def test_nvfp4_matmul_numerics(m, n, k):
    w_fp4, block_scale, global_scale = nvfp4_weight(n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    assert quack_w4a16.unsupported_reason(x, "nvfp4", n, k) is None
    out = quack_w4a16.nvfp4_matmul(x, w_fp4, block_scale, global_scale)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16 and out.is_contiguous()
    dequantized = nvfp4_dequantized(w_fp4, block_scale, global_scale)
    pytorch = F.linear(x, dequantized.to(torch.bfloat16))
    assert_within_pytorch_error(f"nvfp4 m={m}", out, x.double() @ dequantized.T, pytorch)


def test_nvfp4_prepared_once_and_captured(monkeypatch):
    counter = BuildCounter(monkeypatch)
    w_fp4, block_scale, global_scale = nvfp4_weight(256, 512)
    x = torch.randn(8, 512, dtype=torch.bfloat16, device="cuda")
    graph, out = capture(lambda: quack_w4a16.nvfp4_matmul(x, w_fp4, block_scale, global_scale))
    dequantized = nvfp4_dequantized(w_fp4, block_scale, global_scale)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert_within_pytorch_error("nvfp4 replay", out, x.double() @ dequantized.T,
                                    F.linear(x, dequantized.to(torch.bfloat16)))
    # The block scales' strip is made at every call (recorded into the graph): torchao's come out of the graph.
    assert sorted(counter.kinds) == ["quack_nvfp4_global_scale", "quack_nvfp4_weight"]
    global_scale.mul_(2)  # only the global scale changed: only it is read again
    out = quack_w4a16.nvfp4_matmul(x, w_fp4, block_scale, global_scale)
    assert counter.kinds.count("quack_nvfp4_global_scale") == 2 and len(counter.kinds) == 3
    dequantized = nvfp4_dequantized(w_fp4, block_scale, global_scale)
    assert_within_pytorch_error("nvfp4 new global scale", out, x.double() @ dequantized.T,
                                F.linear(x, dequantized.to(torch.bfloat16)))


# ----------------------------------------------------------------------------------- fa4::int8_int8_linear


def int8_int8_inputs(m, n, k):
    x_int8 = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    x_scale = torch.rand(m, 1, device="cuda") / 64 + 1e-3
    w_scale = torch.rand(n, device="cuda") / 64 + 1e-3
    return x_int8, x_scale, w_int8, w_scale, torch.randn(n, dtype=torch.bfloat16, device="cuda")


@pytest.mark.parametrize("n, k", [(2048, 2048), (200, 328)], ids=str)
@pytest.mark.parametrize("m", [1, 2, 7, 16, 17, 64, 300])
def test_int8_int8_linear_cuda_against_the_cpu_reference(m, n, k):
    """From 17 rows (and where no mixed-input kernel takes the shape: 200 x 328, padded for cuBLAS) the int32 GEMM is
    exact and the scaling the same elementwise ops: the CPU's result bit for bit. Fewer rows over 2048 x 2048 run
    int8_linear's mixed-input kernel: the same products summed in float32, the scales applied in the other order,
    so within a bf16 rounding of the scaled product plus one of the result from the exact value, as the reference."""
    args = int8_int8_inputs(m, n, k)
    out = INT8_INT8_LINEAR(*args, out_dtype=torch.bfloat16)
    expected = INT8_INT8_LINEAR(*(a.cpu() for a in args), out_dtype=torch.bfloat16)
    assert out.shape == (m, n) and out.is_contiguous()
    x_int8, x_scale, w_int8, w_scale, bias = args
    weight_only = m < 17 and int8_int8_op.weight_only_route(x_int8.to(torch.bfloat16), w_int8, w_scale) is not None
    assert weight_only == (m < 17 and n == 2048)
    if not weight_only:
        torch.testing.assert_close(out.cpu(), expected, atol=0, rtol=0)
        return
    for result in (out, expected.cuda()):
        assert_within_int8_int8_bound(result, *args)


def test_int8_int8_linear_under_cuda_graph_replay():
    args = int8_int8_inputs(4, 1024, 512)
    x_int8 = args[0]
    graph, out = capture(lambda: INT8_INT8_LINEAR(*args, out_dtype=torch.bfloat16))
    for _ in range(2):
        x_int8.copy_(torch.randint(-128, 128, x_int8.shape, dtype=torch.int8, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert_within_int8_int8_bound(out, *args)  # 4 rows: int8_linear's mixed-input kernel


@pytest.mark.parametrize("m", [1, 16])
def test_torchao_int8_dynamic_compiled_where_default_compile_fails(m):
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 512, bias=True)).to(torch.bfloat16).cuda().requires_grad_(False)
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")
    torch._dynamo.reset()
    with torch.no_grad(), report.collecting() as records:
        fn = torch.compile(model, backend=fa4_inductor.backend(int8_int8_linear=True), mode="reduce-overhead")
        out = [fn(x) for _ in range(3)][-1]
    assert [r.rewritten for r in records] == [True], list(records)
    # our W4A16 GEMM takes int8 weights of 512 rows up to 16 rows of x: lowering scales its result in the graph
    assert records[0].detail.startswith("fa4.int8_linear(x["), records[0].detail
    w = model[0].weight
    reference = (x.double() @ (w.qdata.double() * w.scale.double()).T) + model[0].bias.double()
    # per-token int8 activations: about 1/254 of each row's max, relative
    torch.testing.assert_close(out.double(), reference, atol=2e-2 * reference.abs().max().item(), rtol=2e-2)


# -------------------------------------------------------------------------------- the family, compiled


# ONE_ROW: with `coordinate_descent_tuning` on (torchao's `quantize_` turns it on for the process, so any test after
# one of torchao's in this process), Inductor decomposes a one-row mm (M = 1) into a multiply and a sum before our
# stage; the family sees the matmul again (lowering/gemv.py) and rewrites it, or leaves it to Inductor's GEMV where
# `gemv_reason` says that measured faster. Either way the output is checked.


def one_row_records(records, n, k, gemv_reason):
    """True if records are what a one-row linear over an [n, k] weight gets: rewritten, or kept with the reason."""
    reason = gemv_reason("cuda", n, k)
    decomposed = torch._inductor.config.coordinate_descent_tuning
    if decomposed and reason is not None:
        return [(r.rewritten, r.detail) for r in records] == [(False, reason)]
    return [r.rewritten for r in records] == [True]


def compiled_with(model, x, mode):
    torch._dynamo.reset()
    backend = fa4_inductor.backend(int8_linear=True)
    with torch.no_grad(), report.collecting() as records:
        fn = torch.compile(model, backend=backend, mode=mode)
        outs = [fn(x) for _ in range(3)]  # reduce-overhead: warm-up, record, replay
    return outs[-1], list(records)


@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["default", "reduce-overhead"])
def test_gpt_fast_int8_linear_compiled(m, mode):
    torch.manual_seed(0)
    linear = upstream.WeightOnlyInt8Linear.from_linear(nn.Linear(2048, 512), torch.bfloat16).cuda()
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")
    out, records = compiled_with(linear, x, mode)
    assert one_row_records(records, 512, 2048, int8_linear_op.gemv_reason) if m == 1 else \
        [r.rewritten for r in records] == [True], records  # see ONE_ROW
    assert_within_pytorch_error("gpt-fast", out, int8_reference(x, linear.weight, linear.scales), linear(x))


@pytest.mark.parametrize("m", [1, 16, 256])
def test_torchao_int8_weight_only_compiled(m):
    torchao = pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 512, bias=True)).to(torch.bfloat16).cuda().requires_grad_(False)
    quantize_(model, Int8WeightOnlyConfig())
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")
    out, records = compiled_with(model, x, "reduce-overhead")
    assert one_row_records(records, 512, 2048, int8_linear_op.gemv_reason) if m == 1 else \
        [r.rewritten for r in records] == [True], (torchao.__version__, records)  # see ONE_ROW
    with torch.no_grad():
        expected = model(x)
    w = model[0].weight
    reference = int8_reference(x, w.qdata, w.scale.reshape(-1), model[0].bias)
    assert_within_pytorch_error("torchao int8 weight-only", out, reference, expected)


def one_row_linear(fmt, n, k):
    torch.manual_seed(0)
    linear = nn.Linear(k, n, bias=False, dtype=torch.bfloat16, device="cuda")
    if fmt == "int8":
        return upstream.WeightOnlyInt8Linear.from_linear(linear, torch.bfloat16).cuda()
    model = nn.Sequential(linear).requires_grad_(False)
    nvfp4.quantize(model)
    return model


def one_row_reference(fmt, module, x):
    if fmt == "int8":
        return int8_reference(x, module.weight, module.scales)
    layer = module[0]
    w = nvfp4_dequantized(layer.weight_packed, layer.weight_scale, layer.weight_decode_scale)
    return x.double() @ w.T


@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["default", "reduce-overhead"])
@pytest.mark.parametrize("fmt, n, k", [("int8", 512, 2048), ("int8", 2048, 8192), ("nvfp4", 2048, 2048),
                                       ("nvfp4", 8192, 2048)], ids=str)
def test_one_row_linears_inductor_decomposed_run_the_op(fmt, n, k, mode):
    """`coordinate_descent_tuning` on: Inductor's one-row mm is a multiply and a sum before our stage; with
    `inductor_gemvs=False` every one runs the op (our W4A16 GEMM), within the FA rule of the float64 reference."""
    module = one_row_linear(fmt, n, k)
    x = torch.randn(1, 1, k, dtype=torch.bfloat16, device="cuda")
    torch._dynamo.reset()
    with torch._inductor.config.patch(coordinate_descent_tuning=True), torch.no_grad(), \
            report.collecting() as records:
        fn = torch.compile(module, backend=fa4_inductor.backend(inductor_gemvs=False), mode=mode)
        out = [fn(x) for _ in range(3)][-1]
        expected = module(x)
    assert [(r.family, r.rewritten) for r in records] == [(f"{fmt}_linear", True)], list(records)
    assert_within_pytorch_error(f"one-row {fmt}", out, one_row_reference(fmt, module, x), expected)


def test_a_weight_first_met_during_capture_is_refused():
    """Preparing during capture would record the repack into the graph: prepared_weights refuses (the last
    test of the file, as a failed capture may leave the stream in a state later tests should not inherit)."""
    w, scale = int8_weight(256, 512)
    x = torch.randn(32, 512, dtype=torch.bfloat16, device="cuda")  # quack's rows
    INT8_LINEAR(x, w.clone(), scale, None)  # quack's kernel compiled and its buffers made, for another weight
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="would be prepared for 'quack_int8' during CUDA-graph capture"):
        with torch.cuda.graph(graph):
            INT8_LINEAR(x, w, scale, None)


@pytest.mark.parametrize("m", [64, 256])
@pytest.mark.parametrize("n, k", [(14336, 4096), (4096, 14336)], ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "int8"])
def test_quack_first_call_on_a_large_weight(fmt, n, k, m):
    """quack's first call per geometry runs in `prepared_weights.outside_graph_pools`' helper thread; on Llama-8B
    weights at 64 rows it picks a persistent GEMM, whose host side asks the driver for the cluster occupancy and
    needs the thread's CUDA context (once failed with CUDA_ERROR_INVALID_CONTEXT)."""
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    if fmt == "nvfp4":
        w_fp4, block_scale, global_scale = nvfp4_weight(n, k)
        out = quack_w4a16.nvfp4_matmul(x, w_fp4, block_scale, global_scale)
        reference = x.double() @ nvfp4_dequantized(w_fp4, block_scale, global_scale).T
    else:
        w, scale = int8_weight(n, k, torch.bfloat16)
        out = quack_w4a16.int8_matmul(x, w, scale)
        reference = x.double() @ (w.double() * scale.double()[:, None]).T
    assert out.shape == (m, n)
    assert (out.double() - reference).abs().max() <= 2e-2 * reference.abs().max()
