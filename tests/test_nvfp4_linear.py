"""`fa4::nvfp4_linear` (kernels/nvfp4_linear.py)."""

import types

import pytest
import torch

from fa4_inductor.kernels import NVFP4_LINEAR, nvfp4_linear_unsupported_reason
from fa4_inductor.kernels import nvfp4_linear as nvfp4_op

N, K = 48, 64


def random_nvfp4(n=N, k=K, seed=0, device="cpu"):
    """Random packed codes (every byte value likely), positive e4m3 block scales and a float32 global scale."""
    generator = torch.Generator().manual_seed(seed)
    w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=generator)
    block = (torch.rand(n, k // 16, generator=generator) * 6 + 0.01).to(torch.float8_e4m3fn)
    global_scale = (torch.rand((), generator=generator) / 100 + 1e-3).float()
    return w_fp4.to(device), block.to(device), global_scale.to(device)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def float64_dequantized(w_fp4, block, global_scale):
    """The exact weight, from the e2m1 definition (sign bit 3, magnitude table), low nibble first."""
    table = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64, device=w_fp4.device)
    codes = torch.stack((w_fp4.long() % 16, w_fp4.long() // 16), dim=-1).flatten(1)
    scale = block.double().repeat_interleave(16, dim=1) * global_scale.double()
    return table[codes] * scale


def float64_reference(x, w_fp4, block, global_scale, bias=None):
    out = x.double() @ float64_dequantized(w_fp4, block, global_scale).T
    return out if bias is None else out + bias.double()


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


# opcheck's test_schema cannot run here: its mutation check compares inputs with a multiplication that has no
# float8_e4m3fn kernel on CPU. test_the_op_mutates_and_aliases_nothing checks what it would.
OPCHECK_TESTS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype, with_bias):
    w_fp4, block, global_scale = random_nvfp4()
    bias = torch.randn(N, dtype=dtype) if with_bias else None
    for x in (torch.randn(2, 3, K, dtype=dtype), torch.randn(K, 5, dtype=dtype).t()):
        torch.library.opcheck(NVFP4_LINEAR, (x, w_fp4, block, global_scale, bias), test_utils=OPCHECK_TESTS)


def test_the_op_mutates_and_aliases_nothing():
    w_fp4, block, global_scale = random_nvfp4()
    x, bias = torch.randn(3, K), torch.randn(N)
    inputs = (x, w_fp4, block, global_scale, bias)
    before = [t.clone() for t in inputs]
    out = NVFP4_LINEAR(*inputs)
    for t, saved in zip(inputs, before):
        assert torch.equal(t.reshape(-1).view(torch.uint8), saved.reshape(-1).view(torch.uint8))
        assert out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_the_low_nibble_holds_the_even_input():
    """Byte 0x2F holds input 0 = code 0xF (-6) and input 1 = code 0x2 (1.0)."""
    w_fp4 = torch.full((1, 8), 0x2F, dtype=torch.uint8)
    block, one = torch.ones(1, 1, dtype=torch.float8_e4m3fn), torch.tensor(1.0)
    assert nvfp4_op.dequantize(w_fp4, block, one, torch.float32)[0, :4].tolist() == [-6.0, 1.0, -6.0, 1.0]


def test_decode_covers_every_code_exactly():
    w_fp4 = torch.arange(256, dtype=torch.uint8).view(16, 16)
    one = torch.tensor(1.0)
    decoded = nvfp4_op.dequantize(w_fp4, torch.ones(16, 2, dtype=torch.float8_e4m3fn), one, torch.float32)
    assert torch.equal(decoded.double(), float64_dequantized(w_fp4, torch.ones(16, 2), one))
    assert torch.signbit(decoded[0, 2 * 8]) and decoded[0, 2 * 8] == 0  # byte 8: its low code 8 is -0.0


TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}  # relative to the output's scale


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_numerics_against_float64(dtype):
    torch.manual_seed(1)
    w_fp4, block, global_scale = random_nvfp4(seed=2)
    x, bias = torch.randn(4, 7, K, dtype=dtype), torch.randn(N, dtype=dtype)
    out = NVFP4_LINEAR(x, w_fp4, block, global_scale, bias)
    assert out.dtype == dtype and out.shape == (4, 7, N) and out.is_contiguous()
    expected, tol = float64_reference(x, w_fp4, block, global_scale, bias), TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol * expected.abs().max().item(), rtol=tol)


def test_rounding_order_scales_first_then_the_codes():
    """The weight is `(e2m1 * (global * float(block))).to(dtype)`: the two scales' product is rounded to
    float32 first. Computed in float32, the weight differs from the exact one by at most 2 ulps (two roundings)."""
    w_fp4, block, global_scale = random_nvfp4(n=256, k=256, seed=3)
    ours = nvfp4_op.dequantize(w_fp4, block, global_scale, torch.float32)
    scale = (global_scale * block.float()).repeat_interleave(16, dim=1)
    assert torch.equal(ours, nvfp4_op.decode(w_fp4) * scale)
    exact = float64_dequantized(w_fp4, block, global_scale)
    ulp = torch.finfo(torch.float32).eps * exact.abs()
    assert ((ours.double() - exact).abs() <= 2 * ulp).all()


@pytest.mark.parametrize("change, message", [
    (dict(w_fp4=torch.zeros(N, K // 2, dtype=torch.int8)), "2-D uint8 weight"),
    (dict(block=torch.ones(N, K // 16)), "float8_e4m3fn block scales, got float32"),
    (dict(global_scale=torch.ones(1)), "0-d float32 global scale, got a 1-d float32"),
    (dict(global_scale=torch.tensor(1.0, dtype=torch.float64)), "0-d float32 global scale, got a 0-d float64"),
    (dict(x=torch.randn(3, K, dtype=torch.float64)), "x dtype float64 is not supported"),
    (dict(x=torch.randn(3, K + 2)), "x has 66 features, the weight 64"),
    (dict(block=torch.ones(N, 2, dtype=torch.float8_e4m3fn)), r"w_block_scale has shape \[48, 2\], wants \[48, 4\]"),
    (dict(bias=torch.zeros(N, dtype=torch.bfloat16)), "bias of x's dtype float32"),
    (dict(w_fp4=torch.zeros(N, 12, dtype=torch.uint8), x=torch.randn(3, 24),
          block=torch.ones(N, 1, dtype=torch.float8_e4m3fn)), "24 input features are not a multiple of the 16"),
])
def test_inputs_the_op_cannot_take_are_errors(change, message):
    w_fp4, block, global_scale = random_nvfp4()
    args = dict(x=torch.randn(3, K), w_fp4=w_fp4, block=block, global_scale=global_scale, bias=None) | change
    with pytest.raises((ValueError, RuntimeError), match=message):
        NVFP4_LINEAR(args["x"], args["w_fp4"], args["block"], args["global_scale"], args["bias"])


def test_unsupported_reason():
    assert nvfp4_linear_unsupported_reason("cuda", torch.bfloat16, K) is None
    assert nvfp4_linear_unsupported_reason("cpu", torch.float32, K) is None
    assert nvfp4_linear_unsupported_reason("mps", torch.bfloat16, K) == "device mps has no fa4 nvfp4_linear kernel"
    assert nvfp4_linear_unsupported_reason("cuda", torch.float64, K) == \
        "x dtype float64 is not supported (takes float16, bfloat16, float32)"
    assert nvfp4_linear_unsupported_reason("cuda", torch.bfloat16, 40) == \
        "40 input features are not a multiple of the 16-input scale block"


def test_cuda_routes_small_m_to_quack_where_it_says_it_can(monkeypatch):
    """`kernel_for` (the CUDA dispatch's choice), with a stand-in for the quack adapter."""
    w_fp4 = torch.zeros(N, K // 2, dtype=torch.uint8)
    calls = []

    def unsupported_reason(x, wformat, n, k):
        calls.append((tuple(x.shape), wformat, n, k))
        return None if x.dtype == torch.bfloat16 else "stand-in: bf16 only"

    monkeypatch.setattr(nvfp4_op, "_quack", lambda: types.SimpleNamespace(unsupported_reason=unsupported_reason))
    bf16 = torch.bfloat16
    assert nvfp4_op.kernel_for(torch.zeros(1, K, dtype=bf16), w_fp4) == ("quack", "")
    assert nvfp4_op.kernel_for(torch.zeros(nvfp4_op.QUACK_MAX_M, K, dtype=bf16), w_fp4) == ("quack", "")
    assert nvfp4_op.kernel_for(torch.zeros(65, K, dtype=bf16), w_fp4) == \
        ("dequantize", "65 rows of x, outside quack's 1..64")
    assert nvfp4_op.kernel_for(torch.zeros(0, K, dtype=bf16), w_fp4)[0] == "dequantize"
    assert nvfp4_op.kernel_for(torch.zeros(4, K, dtype=torch.float16), w_fp4) == ("dequantize", "stand-in: bf16 only")
    assert calls[0] == ((1, K), "nvfp4", N, K)
    monkeypatch.setattr(nvfp4_op, "_quack", lambda: None)
    assert nvfp4_op.kernel_for(torch.zeros(1, K, dtype=bf16), w_fp4) == \
        ("dequantize", "no quack_w4a16 module in this install")
