"""GPU tier of the Blackwell W4A4 NVFP4 path (`kernels/nvfp4_blackwell.py`): the quantize kernel bit for bit against
its PyTorch emulation, the FP4 `_scaled_mm` GEMM against the float64 emulation, the op's routing, fallbacks and
CUDA-graph replay. Needs an sm100 / sm120 GPU: every test here skips elsewhere (our H200 included: not run yet).

    pytest -m gpu tests/test_gpu_nvfp4_blackwell.py
"""

import pytest
import torch

from fa4_inductor.kernels import NVFP4_LINEAR
from fa4_inductor.kernels import nvfp4_blackwell as bw
from fa4_inductor.kernels import nvfp4_linear as nvfp4_op
from gpu_helpers import capture


def _blackwell() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] in bw.ARCHS


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _blackwell(), reason="needs a Blackwell GPU (sm100 / sm120); not run on Hopper")]

DTYPES = [torch.bfloat16, torch.float16]


def random_x(m, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * (torch.rand(m, 1, generator=g) * 20 + 0.01)
    if m > 1:
        x[1, : min(k, 48)] = 0  # zero blocks
    return x.to(dtype).cuda()


def random_weight(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    block = (torch.rand(n, k // 16, generator=g) * 6 + 0.01).to(torch.float8_e4m3fn)
    return w_fp4.cuda(), block.cuda(), torch.tensor(0.0021, device="cuda")


def _values(codes):
    """e2m1 codes -> float values (so -0 and +0 agree)."""
    table = torch.tensor(bw.E2M1_GRID + tuple(-v for v in bw.E2M1_GRID), device=codes.device)
    return torch.stack([table[(codes & 15).long()], table[(codes >> 4).long()]], -1)


@pytest.mark.parametrize("m, k", [(1, 32), (3, 96), (16, 4096), (130, 8192), (257, 14336)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_kernel_is_its_emulation_bit_for_bit(m, k, dtype):
    x = random_x(m, k, dtype, seed=m + k)
    codes, scales, row_scale = bw.quantize(x)
    ref = bw.quantize_emulated(x.cpu())  # CPU float32: IEEE operations, the kernel's
    assert torch.equal(row_scale.cpu(), ref.row_scale)
    assert torch.equal(scales.view(torch.uint8).cpu(), bw.to_blocked(ref.scales.view(torch.uint8)))  # padding too
    assert torch.equal(_values(codes.cpu()), _values(ref.codes))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_kernel_with_a_given_scale(dtype):
    x = random_x(5, 256, dtype, seed=7)
    given = torch.tensor(0.003, device="cuda")
    codes, scales, row_scale = bw.quantize(x, given)
    ref = bw.quantize_emulated(x.cpu(), given.cpu())
    assert torch.equal(scales.view(torch.uint8).cpu(), bw.to_blocked(ref.scales.view(torch.uint8)))
    assert torch.equal(_values(codes.cpu()), _values(ref.codes))
    assert torch.equal(row_scale.cpu(), ref.row_scale)


@pytest.mark.parametrize("m, n, k", [(1, 2048, 8192), (4, 4096, 1024), (16, 8192, 2048), (64, 1024, 4096),
                                     (300, 528, 160)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul_against_the_float64_emulation(m, n, k, dtype):
    x = random_x(m, k, dtype, seed=m * 3 + n)
    w_fp4, block, w_global = random_weight(n, k, seed=n + k)
    out = bw.matmul(x, w_fp4, block, w_global)
    assert out.dtype == dtype and out.shape == (m, n) and out.isfinite().all()
    emulated = bw.emulate(x.cpu(), w_fp4.cpu(), block.cpu(), w_global.cpu()).cuda()
    # fp32 accumulation of exact products, then one rounding to dtype
    eps = torch.finfo(dtype).eps
    tol = eps * emulated.abs() + 1e-5 * k ** 0.5 * emulated.abs().amax(-1, keepdim=True)
    assert ((out.double() - emulated).abs() <= tol).all()
    ref = x.double() @ nvfp4_op.dequantize(w_fp4, block, w_global, torch.float64).T
    assert ((out.double() - ref).norm() / ref.norm()).item() < bw.ACTIVATION_RMS_BOUND


def test_the_op_runs_w4a4_only_when_asked():
    x = random_x(3, 512, torch.bfloat16, seed=1).view(1, 3, 512)
    w_fp4, block, w_global = random_weight(256, 512, seed=2)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    assert nvfp4_op.kernel_for(x[0], w_fp4, quantize_activations=True) == ("nvfp4_blackwell", "")
    assert nvfp4_op.kernel_for(x[0], w_fp4)[0] != "nvfp4_blackwell"
    got = NVFP4_LINEAR(x, w_fp4, block, w_global, bias, quantize_activations=True)
    expected = bw.matmul(x[0], w_fp4, block, w_global) + bias
    assert got.shape == (1, 3, 256) and torch.equal(got[0], expected)
    weight_only = NVFP4_LINEAR(x, w_fp4, block, w_global, bias)
    assert not torch.equal(got, weight_only)  # the activations were quantized


def test_shapes_it_cannot_take_fall_back_with_a_reason():
    x = random_x(2, 48, torch.bfloat16, seed=3)
    w_fp4, block, w_global = random_weight(32, 48, seed=4)
    route, why = nvfp4_op.kernel_for(x, w_fp4, quantize_activations=True)
    assert route != "nvfp4_blackwell" and "K a multiple of 32" in why
    out = NVFP4_LINEAR(x, w_fp4, block, w_global, quantize_activations=True)
    torch.testing.assert_close(out, NVFP4_LINEAR(x, w_fp4, block, w_global), atol=0, rtol=0)
    x = random_x(2, 64, torch.bfloat16, seed=5)
    w_fp4, block, w_global = random_weight(40, 64, seed=6)
    assert "N a multiple of 16" in nvfp4_op.kernel_for(x, w_fp4, quantize_activations=True)[1]


def test_cuda_graph_replay_follows_new_activations():
    w_fp4, block, w_global = random_weight(1024, 2048, seed=8)
    x = random_x(4, 2048, torch.bfloat16, seed=9)
    bw.warmup(torch.bfloat16)

    def step():
        return bw.matmul(x, w_fp4, block, w_global)

    graph, out = capture(step)
    for seed in (10, 11):
        x.copy_(random_x(4, 2048, torch.bfloat16, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, bw.matmul(x, w_fp4, block, w_global))
