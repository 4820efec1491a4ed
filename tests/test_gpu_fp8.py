"""GPU tier of `fa4::fp8_linear` (kernels/fp8_linear.py): its CUDA routes on fresh random inputs against float64,
and torchao's fp8 configs compiled with our backend against default compile (`pytest -m gpu` on an sm90 GPU).
The kernel's own numerics (every M, splits, CTA shapes, scales) are `test_gpu_w4a16.py -k fp8`."""

import pytest
import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import report
from fa4_inductor.kernels import FP8_LINEAR
from fa4_inductor.kernels import fp8_linear as op
from gpu_helpers import assert_within_pytorch_error, capture

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("without_fx_graph_cache")]


@pytest.fixture(autouse=True)
def sm90():
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"our fp8 decode GEMM is built for sm90, not sm{major}{minor}")
    torch.manual_seed(0)


def fp8_weight(n, k, rowwise=True):
    w = (torch.randn(n, k, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    return w, torch.rand(n if rowwise else 1, device="cuda") / 64 + 1e-3


def quantized_x(shape, rowwise=True):
    x = torch.randn(*shape, device="cuda")
    scale = x.abs().amax(-1 if rowwise else tuple(range(x.dim())), keepdim=True) / 448
    return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale


@pytest.mark.parametrize("n, k", [(1024, 4096), (1536, 2048), (4096, 2048)], ids=["long_k", "narrow", "short_k"])
@pytest.mark.parametrize("m", [1, 7, 16, 17, 64])
@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise", "tensorwise"])
def test_scaled_mm_order_routes(m, rowwise, n, k):
    """Up to 16 rows over a weight narrow or long in K our decode GEMM, else `torch._scaled_mm`: both within the bound
    of `_scaled_mm` itself."""
    w, w_scale = fp8_weight(n, k, rowwise)
    x_fp8, x_scale = quantized_x((m, k), rowwise)
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    x = x_fp8.to(torch.bfloat16)
    args = (x, w, w_scale, x_scale.reshape(-1), bias)
    ours = m <= op.W4A16_MAX_ROWS and op.cublas_fp8_reason(n, k) is None
    assert op.kernel_for(*args)[0] == ("w4a16_fp8" if ours else "scaled_mm")
    out = FP8_LINEAR(*args, use_fast_accum=True)
    theirs = torch._scaled_mm(x_fp8, w.t(), x_scale.reshape(-1, 1) if rowwise else x_scale.reshape(()),
                              w_scale.reshape(1, -1) if rowwise else w_scale.reshape(()), bias,
                              out_dtype=torch.bfloat16, use_fast_accum=True)
    reference = (x_fp8.double() @ w.double().T) * x_scale.double().reshape(-1, 1) * w_scale.double().reshape(1, -1) \
        + bias.double()
    assert_within_pytorch_error(f"scaled_mm order m{m}", out, reference, theirs)


@pytest.mark.parametrize("m", [1, 16, 40])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_weight_only_order_routes(m, dtype):
    n, k = 1000, 2064  # N, K not multiples of the kernel's tiles
    w, w_scale = fp8_weight(n, k)
    x = torch.randn(2, m, k, dtype=dtype, device="cuda")
    assert op.kernel_for(x, w, w_scale)[0] == ("w4a16_fp8" if 2 * m <= op.W4A16_MAX_ROWS else "dense")
    out = FP8_LINEAR(x, w, w_scale)
    wd = w.double() * w_scale.double()[:, None]
    assert_within_pytorch_error(f"weight-only m{m}", out, x.double() @ wd.T, x @ op.dequantize(w, w_scale, dtype).T)


def test_op_under_cuda_graph_replay():
    n, k, m = 4096, 2048, 4
    w, w_scale = fp8_weight(n, k)
    x_fp8, x_scale = quantized_x((m, k))
    x, xs = x_fp8.to(torch.bfloat16), x_scale.reshape(-1).contiguous()
    FP8_LINEAR(x, w, w_scale, xs)  # compiles outside the capture
    graph, out = capture(lambda: FP8_LINEAR(x, w, w_scale, xs))
    for _ in range(2):
        x_fp8, x_scale = quantized_x((m, k))
        x.copy_(x_fp8.to(torch.bfloat16))
        xs.copy_(x_scale.reshape(-1))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, FP8_LINEAR(x, w, w_scale, xs))


def compiled_pair(model, x, mode=None):
    outs = {}
    for name, backend in (("ours", fa4_inductor.backend()), ("default", "inductor")):
        torch._dynamo.reset()
        with torch.no_grad(), report.collecting() as records:
            fn = torch.compile(model, backend=backend, mode=mode)
            outs[name] = [fn(x) for _ in range(3)][-1].clone()
        if name == "ours":
            outs["records"] = [r for r in records if "fp8" in r.family]
    return outs


@pytest.mark.parametrize("m", [1, 16, 128])
@pytest.mark.parametrize("granularity", ["row", "tensor"])
def test_torchao_float8_dynamic_activation_compiled(m, granularity):
    """torchao's fp8 x fp8 config: decode-sized calls over the weight long in K (4096 inputs, 2048 outputs) rewritten
    onto our GEMM, the others keep `_scaled_mm`; the output as default compile's."""
    pytest.importorskip("torchao")
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_

    model = nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).to(torch.bfloat16).cuda()
    model.requires_grad_(False)
    quantize_(model, Float8DynamicActivationFloat8WeightConfig(
        granularity=PerRow() if granularity == "row" else PerTensor()))
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")
    outs = compiled_pair(model, x, mode="reduce-overhead")
    rewritten = [r.rewritten for r in outs["records"]]
    assert rewritten == [False, m <= op.W4A16_MAX_ROWS], outs["records"]
    scale = outs["default"].abs().max().item()
    torch.testing.assert_close(outs["ours"], outs["default"], atol=2e-2 * scale, rtol=2e-2)


@pytest.mark.parametrize("m", [1, 16])
def test_torchao_float8_weight_only_compiled(m):
    pytest.importorskip("torchao")
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    model = nn.Sequential(nn.Linear(2048, 1024)).to(torch.bfloat16).cuda().requires_grad_(False)
    quantize_(model, Float8WeightOnlyConfig())
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")
    outs = compiled_pair(model, x)
    if m > 1:  # one row: with torchao's coordinate descent tuning Inductor may have made the matmul a reduction
        assert any(r.rewritten for r in outs["records"]), outs["records"]
    w = model[0].weight
    wd = w.qdata.double() * w.scale.double().reshape(-1, 1)
    reference = x.double() @ wd.T + model[0].bias.double()
    assert_within_pytorch_error(f"torchao fp8 weight-only m{m}", outs["ours"], reference, outs["default"])
