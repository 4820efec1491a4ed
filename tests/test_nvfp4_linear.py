"""`fa4::nvfp4_linear` (kernels/nvfp4_linear.py) and the nvfp4_linear family, which emits it on Inductor's aten
graphs (lowering/nvfp4_linear.py), through the real backend."""

import expecttest
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fa4_inductor
from fa4_inductor import nvfp4
from helpers import PostGradCompiled, compiled_one_row_decomposed

from fa4_inductor.kernels import NVFP4_LINEAR, nvfp4_linear_unsupported_reason
from fa4_inductor.kernels import nvfp4_linear as nvfp4_op

pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # conftest.py: a cache hit skips the passes

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


def blocked(block, shape=None):
    """The scales in the 128 x 4 blocked layout (flat, or viewed as `shape`: torchao keeps [32 * ceil(N / 128),
    16 * ceil(K / 64)])."""
    flat = nvfp4_op.nvfp4_blackwell.to_blocked(block.view(torch.uint8)).view(torch.float8_e4m3fn)
    return flat if shape is None else flat.view(shape)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_opcheck_blocked_scales(with_bias):
    w_fp4, block, global_scale = random_nvfp4()
    bias = torch.randn(N) if with_bias else None
    raw = blocked(block, (32, 16))
    for x in (torch.randn(2, 3, K), torch.randn(K, 5).t()):
        torch.library.opcheck(NVFP4_LINEAR, (x, w_fp4, raw, global_scale, bias), {"scale_layout": "blocked"},
                              test_utils=OPCHECK_TESTS)


# N, K: one row tile padded (48 of 128 rows), several row tiles with a padded one (130), K / 16 groups that do not
# fill a 4-column tile (K = 96: 6 groups), several column tiles
@pytest.mark.parametrize("n, k", [(N, K), (130, 96), (256, 128), (16, 16)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_blocked_scales_give_the_row_major_results_bit_for_bit(dtype, n, k):
    w_fp4, block, global_scale = random_nvfp4(n, k, seed=n + k)
    x, bias = torch.randn(3, k, dtype=dtype), torch.randn(n, dtype=dtype)
    expected = NVFP4_LINEAR(x, w_fp4, block, global_scale, bias)
    torchao_shape = (32 * -(-n // 128), 16 * -(-k // 64))
    column_major = blocked(block, torchao_shape).t().contiguous().t()  # the same elements, other strides
    for raw in (blocked(block), blocked(block, torchao_shape), column_major):
        assert torch.equal(NVFP4_LINEAR(x, w_fp4, raw, global_scale, bias, scale_layout="blocked"), expected)
    assert torch.equal(nvfp4_op.unblocked(blocked(block), n, k // 16).view(torch.uint8), block.view(torch.uint8))


def test_blocked_scales_are_unblocked_once_per_tensor():
    """The CUDA path's `unblocked_once` (prepared_weights; on CPU too): one row-major copy per blocked tensor,
    made again when the tensor changes in place."""
    from fa4_inductor.kernels import prepared_weights

    _, block, _ = random_nvfp4()
    raw = blocked(block, (32, 16))
    first = nvfp4_op.unblocked_once(raw, N, K // 16)
    assert first.is_contiguous() and first.shape == (N, K // 16)
    assert torch.equal(first.view(torch.uint8), block.view(torch.uint8))
    assert nvfp4_op.unblocked_once(raw, N, K // 16) is first
    assert prepared_weights.holds(raw, nvfp4_op.UNBLOCKED_KIND)
    _, other, _ = random_nvfp4(seed=7)
    raw.copy_(blocked(other, (32, 16)))
    again = nvfp4_op.unblocked_once(raw, N, K // 16)
    assert again is not first and torch.equal(again.view(torch.uint8), other.view(torch.uint8))


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
    (dict(scale_layout="blocked"), r"blocked w_block_scale has 192 elements, wants 512 \(\[48, 4\] scales padded to "
                                   r"\[128, 4\]\)"),
    (dict(scale_layout="swizzled"), "scale_layout 'swizzled' is not one of"),
    (dict(w_fp4=torch.zeros(N, 12, dtype=torch.uint8), x=torch.randn(3, 24),
          block=torch.ones(N, 1, dtype=torch.float8_e4m3fn)), "24 input features are not a multiple of the 16"),
])
def test_inputs_the_op_cannot_take_are_errors(change, message):
    w_fp4, block, global_scale = random_nvfp4()
    args = dict(x=torch.randn(3, K), w_fp4=w_fp4, block=block, global_scale=global_scale, bias=None,
                scale_layout="rowmajor") | change
    with pytest.raises((ValueError, RuntimeError), match=message):
        NVFP4_LINEAR(args["x"], args["w_fp4"], args["block"], args["global_scale"], args["bias"],
                     scale_layout=args["scale_layout"])


def test_unsupported_reason():
    assert nvfp4_linear_unsupported_reason("cuda", torch.bfloat16, K) is None
    assert nvfp4_linear_unsupported_reason("cpu", torch.float32, K) is None
    assert nvfp4_linear_unsupported_reason("mps", torch.bfloat16, K) == "device mps has no fa4 nvfp4_linear kernel"
    assert nvfp4_linear_unsupported_reason("cuda", torch.float64, K) == \
        "x dtype float64 is not supported (takes float16, bfloat16, float32)"
    assert nvfp4_linear_unsupported_reason("cuda", torch.bfloat16, 40) == \
        "40 input features are not a multiple of the 16-input scale block"


def test_cuda_routes_small_m_to_our_gemm_then_quack_where_they_say_they_can(monkeypatch):
    """`kernel_for` (the CUDA dispatch's choice), with stand-ins for the two adapters' checks: our W4A16
    decode GEMM up to W4A16_MAX_M rows, quack up to QUACK_MAX_M, the dequantized weight above."""
    w_fp4 = torch.zeros(N, K // 2, dtype=torch.uint8)
    calls = []

    def unsupported_reason(x, wformat, n, k):
        calls.append((tuple(x.shape), wformat, n, k))
        return None if x.dtype == torch.bfloat16 else "stand-in: bf16 only"

    def ours_unsupported_reason(x, wformat, n, k):
        return None if x.shape[0] % 2 == 0 else "stand-in: even M only"

    monkeypatch.setattr(nvfp4_op.quack_w4a16, "unsupported_reason", unsupported_reason)
    monkeypatch.setattr(nvfp4_op.w4a16_decode, "unsupported_reason", ours_unsupported_reason)
    monkeypatch.setattr(nvfp4_op, "QUACK_ROUTE", False)
    assert nvfp4_op.kernel_for(torch.zeros(17, K, dtype=torch.bfloat16), w_fp4) == \
        ("dequantize", "17 rows of x, outside our W4A16 GEMM's 1..16")
    assert nvfp4_op.kernel_for(torch.zeros(3, K, dtype=torch.bfloat16), w_fp4) == \
        ("dequantize", "stand-in: even M only")
    monkeypatch.setattr(nvfp4_op, "QUACK_ROUTE", True)
    bf16 = torch.bfloat16
    assert nvfp4_op.kernel_for(torch.zeros(2, K, dtype=bf16), w_fp4) == ("w4a16", "")
    assert nvfp4_op.kernel_for(torch.zeros(nvfp4_op.W4A16_MAX_M, K, dtype=bf16), w_fp4) == ("w4a16", "")
    assert nvfp4_op.kernel_for(torch.zeros(nvfp4_op.W4A16_MAX_M + 2, K, dtype=bf16), w_fp4) == ("quack", "")
    assert nvfp4_op.kernel_for(torch.zeros(1, K, dtype=bf16), w_fp4) == ("quack", "")
    assert nvfp4_op.kernel_for(torch.zeros(nvfp4_op.QUACK_MAX_M, K, dtype=bf16), w_fp4) == ("quack", "")
    assert nvfp4_op.kernel_for(torch.zeros(257, K, dtype=bf16), w_fp4) == \
        ("dequantize", "257 rows of x, outside quack's 1..256")
    assert nvfp4_op.kernel_for(torch.zeros(0, K, dtype=bf16), w_fp4)[0] == "dequantize"
    assert nvfp4_op.kernel_for(torch.zeros(5, K, dtype=torch.float16), w_fp4) == ("dequantize", "stand-in: bf16 only")
    assert calls[1] == ((1, K), "nvfp4", N, K)


# -------------------------------------------------------------------------------------- the family, compiled

OP_CALL = "torch.ops.fa4.nvfp4_linear.default("
BACKEND = fa4_inductor.backend(nvfp4_linear=True)


def compile_with_nvfp4(fn, *args, backend=BACKEND) -> PostGradCompiled:
    with torch.no_grad():
        return PostGradCompiled(fn, *args, backend=backend)


def dims(*sizes) -> str:
    return "x".join(map(str, sizes))


def nvfp4_linear_module(dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    return nvfp4.NVFP4Linear.from_linear(nn.Linear(K, N, bias=bias).to(dtype))


def module_reference(layer, x):
    """float64: x times the exact dequantization of the layer's buffers (its decode scale taken as it is)."""
    w = float64_dequantized(layer.weight_packed, layer.weight_scale, layer.weight_decode_scale)
    out = x.double() @ w.T
    return out if layer.bias is None else out + layer.bias.double()


@pytest.mark.parametrize("x_shape", [(5, K), (2, 3, K)], ids=["x-2d", "x-3d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nvfp4_linear_module(dtype, x_shape):
    layer = nvfp4_linear_module(dtype)
    x = torch.randn(x_shape, dtype=dtype)
    compiled = compile_with_nvfp4(layer, x)
    assert OP_CALL in compiled.code
    with torch.no_grad():
        torch.testing.assert_close(compiled.out, layer(x), atol=0, rtol=0)  # the same arithmetic, in the same order
    expected, tol = module_reference(layer, x), TOLERANCES[dtype]
    torch.testing.assert_close(compiled.out.double(), expected, atol=tol * expected.abs().max().item(), rtol=tol)
    m = x_shape[0] * (x_shape[1] if len(x_shape) == 3 else 1)
    assert compiled.details == [(True, f"fa4.nvfp4_linear(x[{dims(m, K)}] {str(dtype)[6:]}, w[{dims(N, K // 2)}] "
                                       f"uint8, block_scale[{dims(N, K // 16)}] e4m3, global scale, bias[{N}])")]


def test_nvfp4_linear_with_a_dynamic_batch():
    layer = nvfp4_linear_module(torch.bfloat16, bias=False)
    x = torch.randn(4, 3, K, dtype=torch.bfloat16)
    torch._dynamo.mark_dynamic(x, 0)
    compiled = compile_with_nvfp4(layer, x)
    assert OP_CALL in compiled.code
    with torch.no_grad():
        torch.testing.assert_close(compiled.out, layer(x), atol=0, rtol=0)
    assert [rewritten for rewritten, _ in compiled.details] == [True]


def test_a_one_row_matmul_inductor_decomposed_is_rewritten():
    """Inductor's one-row matmul as a multiply and a sum (lowering/gemv.py) is an NVFP4 linear all the same."""
    layer = nvfp4_linear_module(torch.bfloat16, bias=False)  # (addmm, with a bias, is not decomposed)
    x = torch.randn(1, 1, K, dtype=torch.bfloat16)
    compiled, expected = compiled_one_row_decomposed(layer, x, fa4_inductor.backend(nvfp4_linear=True),
                                                     fa4_inductor.backend(nvfp4_linear=False), OP_CALL)
    assert compiled.details == [(True, f"fa4.nvfp4_linear(x[{dims(1, K)}] bfloat16, w[{dims(N, K // 2)}] uint8, "
                                       f"block_scale[{dims(N, K // 16)}] e4m3, global scale)")]
    torch.testing.assert_close(compiled.out, expected, atol=0, rtol=0)
    reference, tol = module_reference(layer, x), TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(compiled.out.double(), reference, atol=tol * reference.abs().max().item(), rtol=tol)


class PackedLinear(nn.Module):
    """User code: NVFP4 buffers, `weight(packed, block, global)` written out in the forward, then `F.linear`."""

    def __init__(self, weight, global_scale=True):
        super().__init__()
        w_fp4, block, scale = random_nvfp4(seed=5)
        self.register_buffer("w_fp4", w_fp4)
        self.register_buffer("block", block)
        self.register_buffer("scale", scale if global_scale else None)
        self.weight = weight

    def forward(self, x):
        return F.linear(x, self.weight(self.w_fp4, self.block, self.scale).to(x.dtype))


def stacked(w):
    return torch.stack((w & 15, w >> 4), dim=-1).view(N, K)


def catted(w):
    return torch.cat(((w % 16).unsqueeze(-1), (w // 16).unsqueeze(-1)), dim=-1).reshape(N, K)


def scaled(decoded, block, scale):
    """(decoded * (scale * float(block))[..., None]) per 16 inputs, in float32: the op's order."""
    return (decoded.view(N, K // 16, 16) * (scale * block.float())[..., None]).view(N, K)


def table_decode(codes):
    return torch.tensor(nvfp4_op.E2M1_VALUES, device=codes.device)[codes.long()]


def bits_decode(codes):
    """e2m1 -> float32 bits: sign << 31 | (exponent + 126) << 23 | mantissa << 22, subnormals and zeros apart."""
    codes = codes.int()
    magnitude = codes & 7
    bits = ((magnitude >> 1) + 126) << 23 | (magnitude & 1) << 22
    bits = torch.where(magnitude == 1, 0x3F000000, torch.where(magnitude == 0, 0, bits))
    return (bits | (codes >> 3) << 31).view(torch.float32)


SPELLINGS = {
    "stack, arithmetic decode": lambda w, b, s: scaled(nvfp4.e2m1_values(stacked(w)), b, s),
    "cat of % and //, table in the forward": lambda w, b, s: scaled(table_decode(catted(w)), b, s),
    "stack, float32 bits": lambda w, b, s: scaled(bits_decode(stacked(w)), b, s),
    "global scale cast from float64": lambda w, b, s: scaled(nvfp4.e2m1_values(stacked(w)), b, s.double().float()),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_dequantize_then_linear_spellings(spelling):
    layer = PackedLinear(SPELLINGS[spelling])
    x = torch.randn(2, 3, K, dtype=torch.bfloat16)
    compiled = compile_with_nvfp4(layer, x)
    assert OP_CALL in compiled.code, compiled.details
    with torch.no_grad():
        torch.testing.assert_close(compiled.out, layer(x), atol=0, rtol=0)
    assert [rewritten for rewritten, _ in compiled.details] == [True]


@pytest.mark.slow
def test_no_global_scale_gets_a_one():
    layer = PackedLinear(lambda w, b, s: (nvfp4.e2m1_values(stacked(w)).view(N, K // 16, 16)
                                          * b.float().unsqueeze(-1)).view(N, K), global_scale=False)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    compiled = compile_with_nvfp4(layer, x)
    with torch.no_grad():
        torch.testing.assert_close(compiled.out, layer(x), atol=0, rtol=0)
    assert compiled.details == [(True, f"fa4.nvfp4_linear(x[5x{K}] bfloat16, w[{dims(N, K // 2)}] uint8, "
                                       f"block_scale[{dims(N, K // 16)}] e4m3, no global scale)")]


def int4_decode(codes):
    return codes.float() - 8


KEPT = {
    "high nibble first": (
        lambda w, b, s: scaled(nvfp4.e2m1_values(torch.stack((w >> 4, w & 15), dim=-1).view(N, K)), b, s),
        "the high nibble holds the even input; the op takes input 2i from the low nibble"),
    "int4 codes, not e2m1": (
        lambda w, b, s: scaled(int4_decode(stacked(w)), b, s),
        "the decode maps codes 0..15 to [-8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, "
        "5.0, 6.0, 7.0], not the e2m1 values"),
    "global scale after the block scales": (
        lambda w, b, s: (nvfp4.e2m1_values(stacked(w)).view(N, K // 16, 16) * b.float()[..., None]).view(N, K) * s,
        "the global scale multiplies the weight after the block scales, which rounds once; the op rounds the "
        "scales' product first"),
    "compressed-tensors' division": (
        lambda w, b, s: (nvfp4.e2m1_values(stacked(w)).view(N, K // 16, 16) * (b.float() / s)[..., None]).view(N, K),
        "the block scales are divided by the global scale (compressed-tensors' dequantization), which rounds "
        "differently from the op's product"),
    "dequantized in bfloat16": (
        lambda w, b, s: (nvfp4.e2m1_values(stacked(w)).bfloat16().view(N, K // 16, 16)
                         * (s * b.float()).bfloat16()[..., None]).view(N, K),
        "the weight is dequantized in bfloat16; the op dequantizes in float32"),
    "a decode that reads a buffer": (
        None, "the decode looks values up in arg3_1, not a constant 1-d table, a graph input: its values are "
              "unknown when compiling"),
}


class TableBufferLinear(PackedLinear):
    def __init__(self):
        super().__init__(lambda w, b, s: scaled(self.table[stacked(w).long()], b, s))
        self.register_buffer("table", torch.tensor(nvfp4_op.E2M1_VALUES))


@pytest.mark.parametrize("case", [case if case == "high nibble first"
                                  else pytest.param(case, marks=pytest.mark.slow) for case in KEPT])
def test_what_stays_as_written(case):
    weight, reason = KEPT[case]
    layer = TableBufferLinear() if weight is None else PackedLinear(weight)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    compiled = compile_with_nvfp4(layer, x)
    assert OP_CALL not in compiled.code
    assert compiled.details == [(False, reason)]
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.equal(compiled.out, torch.compile(layer, backend="inductor")(x))  # what Inductor alone gives


@pytest.mark.slow
@pytest.mark.parametrize("recompute", [True, False, None])
def test_training_rewrites_unless_the_dequantized_weight_is_saved(recompute):
    """As the int8 family's test, but NVFP4's dequantized weight is saved by default (its recomputation measured
    slower than default compile): with `recompute_dequantized_weights=True` the backward dequantizes again and the
    forward's linear is rewritten; by default and with False it stays as written, with the reason."""
    layer = nvfp4_linear_module(torch.float32)
    x = torch.randn(2, 3, K, requires_grad=True)
    backend = fa4_inductor.backend(nvfp4_linear=True, recompute_dequantized_weights=recompute)
    compiled = PostGradCompiled(layer, x, backend=backend)
    assert len(compiled.details) == 1 and compiled.details[0][0] == bool(recompute), compiled.details
    assert (OP_CALL in compiled.code) == bool(recompute)
    if not recompute:
        assert "a graph output (a training forward saves it for the backward)" in compiled.details[0][1]
    expected = layer(x)
    torch.testing.assert_close(compiled.out, expected)
    torch.testing.assert_close(torch.autograd.grad(compiled.out.sum(), x), torch.autograd.grad(expected.sum(), x))


def test_the_family_is_on_by_default_and_off_when_asked():
    layer = nvfp4_linear_module(torch.bfloat16)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    compiled = compile_with_nvfp4(layer, x, backend=fa4_inductor.backend(nvfp4_linear=False))
    assert OP_CALL not in compiled.code and compiled.records == []
    assert OP_CALL in compile_with_nvfp4(layer, x, backend=fa4_inductor.fa4_inductor).code


FAST_TORCHAO = {(torch.bfloat16, True, True), (torch.float32, False, False)}  # the other combinations: slow tier


def torchao_model(dtype, bias, per_tensor_scale=True):
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig
    from torchao.quantization import quantize_

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(K, N, bias=bias)).to(dtype).requires_grad_(False)
    quantize_(model, NVFP4WeightOnlyConfig(use_dynamic_per_tensor_scale=per_tensor_scale))
    return model


def torchao_reference(model, x, n=N, k=K):
    """float64: x times the exact dequantization of the NVFP4Tensor's codes and (un-swizzled) scales."""
    from torchao.prototype.mx_formats.utils import from_blocked

    weight, bias = model[0].weight, model[0].bias
    block = from_blocked(weight.scale, n, k // 16) if weight.is_swizzled_scales else weight.scale
    scale = weight.per_tensor_scale if weight.per_tensor_scale is not None else torch.tensor(1.0, device=x.device)
    out = x.double() @ float64_dequantized(weight.qdata, block, scale).T
    return out if bias is None else out + bias.double()


TORCHAO_CASES = [pytest.param(dtype, x_shape, bias, per_tensor_scale, id=f"{str(dtype)[6:]}-x-{len(x_shape)}d-"
                              f"{'bias' if bias else 'no-bias'}-{'global' if per_tensor_scale else 'no-global'}",
                              marks=() if (dtype, bias, per_tensor_scale) in FAST_TORCHAO else pytest.mark.slow)
                 for dtype in (torch.float32, torch.bfloat16) for x_shape in ((5, K), (2, 3, K))
                 for bias in (True, False) for per_tensor_scale in (True, False)]


@pytest.mark.parametrize("dtype, x_shape, bias, per_tensor_scale", TORCHAO_CASES)
def test_torchao_nvfp4_weight_only_config(dtype, x_shape, bias, per_tensor_scale):
    """torchao's `NVFP4WeightOnlyConfig` (an `NVFP4Tensor` weight, scales swizzled): the op takes the codes, the
    un-swizzled scales and the per-tensor scale; eager's results bit for bit."""
    model = torchao_model(dtype, bias, per_tensor_scale)
    x = torch.randn(x_shape, dtype=dtype)
    compiled = compile_with_nvfp4(model, x)
    assert OP_CALL in compiled.code
    with torch.no_grad():
        torch.testing.assert_close(compiled.out, model(x), atol=0, rtol=0)
    expected, tol = torchao_reference(model, x), TOLERANCES[dtype]
    torch.testing.assert_close(compiled.out.double(), expected, atol=tol * expected.abs().max().item(), rtol=tol)
    assert [rewritten for rewritten, _ in compiled.details] == [True]
    assert "scale_layout='blocked'" in compiled.code  # the stored scales, un-blocked once by the op
    assert "blocked layout)" in compiled.details[0][1]


def torchao_from_blocked(raw):
    from torchao.prototype.mx_formats.utils import from_blocked

    return from_blocked(raw, N, K // 16)


# How user code may store and un-swizzle the block scales: (the stored tensor from the [N, K / 16] scales, the
# un-swizzle in the forward, whether the op reads the stored tensor in the blocked layout)
UNSWIZZLES = {
    "torchao's from_blocked": (lambda b: blocked(b, (32, 16)), torchao_from_blocked, True),
    "our from_blocked, flat": (blocked, lambda r: nvfp4_op.nvfp4_blackwell.from_blocked(r, N, K // 16), True),
    "blocked, then other rows": (lambda b: blocked(torch.cat((b[:16], b)), (32, 16)),
                                 lambda r: nvfp4_op.nvfp4_blackwell.from_blocked(r.flatten(), N + 16, K // 16)[16:],
                                 False),
    "a row-major view of blocked-sized storage": (
        lambda b: torch.cat((b.view(torch.uint8), torch.zeros(128 - N, K // 16, dtype=torch.uint8)))
        .view(torch.float8_e4m3fn).view(32, 16),
        lambda r: r.view(128, 4)[:N], False),
    "stored transposed": (lambda b: b.t().contiguous(), lambda r: r.t(), False),
}


class StoredScalesLinear(nn.Module):
    """User code: the block scales stored in some layout (a buffer), un-swizzled in the forward."""

    def __init__(self, store, unswizzle):
        super().__init__()
        w_fp4, block, scale = random_nvfp4(seed=5)
        self.register_buffer("w_fp4", w_fp4)
        self.register_buffer("stored", store(block))
        self.register_buffer("scale", scale)
        self.unswizzle = unswizzle

    def forward(self, x):
        return F.linear(x, scaled(nvfp4.e2m1_values(stacked(self.w_fp4)), self.unswizzle(self.stored), self.scale)
                        .to(x.dtype))


@pytest.mark.parametrize("case", UNSWIZZLES)
def test_the_op_reads_stored_scales_only_when_the_chain_is_exactly_the_unblocking(case):
    """A chain of layout ops from a graph input goes to the op as `scale_layout="blocked"` only when it reads every
    scale where the blocked layout keeps it; any other chain (other rows, a plain view, a transpose) feeds the
    op as before, computed in the graph. Eager's results bit for bit either way."""
    store, unswizzle, is_blocked = UNSWIZZLES[case]
    if unswizzle is torchao_from_blocked:
        pytest.importorskip("torchao")
    layer = StoredScalesLinear(store, unswizzle)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    compiled = compile_with_nvfp4(layer, x)
    assert OP_CALL in compiled.code and [rewritten for rewritten, _ in compiled.details] == [True]
    assert ("scale_layout='blocked'" in compiled.code) == is_blocked
    assert ("blocked layout)" in compiled.details[0][1]) == is_blocked
    with torch.no_grad():
        torch.testing.assert_close(compiled.out, layer(x), atol=0, rtol=0)
    op_line = next(line for line in compiled.graphs[0].splitlines() if "fa4.nvfp4_linear(" in line)
    scales = op_line.split("fa4.nvfp4_linear(")[1].split(", ")[2]
    assert scales.startswith("arg") == is_blocked, op_line  # the stored buffer itself, or the chain's last node


class TestRewrittenGraphs(expecttest.TestCase):
    def test_torchao_x_3d_with_bias(self):
        compiled = compile_with_nvfp4(torchao_model(torch.bfloat16, bias=True), torch.randn(2, 3, K,
                                                                                             dtype=torch.bfloat16))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
view: bf16[6, 64] = aten.reshape(arg4_1, (6, 64))
nvfp4_linear_default: bf16[6, 48] = fa4.nvfp4_linear(view, arg0_1, arg1_1, arg2_1, arg3_1, scale_layout='blocked')
view_12: bf16[2, 3, 48] = aten.reshape(nvfp4_linear_default, (2, 3, 48))""")

    def test_torchao_no_per_tensor_scale(self):
        compiled = compile_with_nvfp4(torchao_model(torch.float32, bias=False, per_tensor_scale=False),
                                      torch.randn(5, K))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
full_default_2: f32[] = aten.full((), 1, dtype=float32, device=device(type='cpu'))
nvfp4_linear_default: f32[5, 48] = fa4.nvfp4_linear(arg2_1, arg0_1, arg1_1, full_default_2, None, scale_layout='blocked')""")

    def test_a_chain_that_is_not_the_unblocking_stays(self):
        store, unswizzle, _ = UNSWIZZLES["blocked, then other rows"]
        compiled = compile_with_nvfp4(StoredScalesLinear(store, unswizzle), torch.randn(5, K, dtype=torch.bfloat16))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
view_1: torch.float8_e4m3fn[512] = aten.reshape(arg1_1, (512))
view_2: torch.float8_e4m3fn[1, 1, 32, 4, 4] = aten.reshape(view_1, (1, 1, 32, 4, 4))
permute: torch.float8_e4m3fn[1, 4, 32, 1, 4] = aten.permute(view_2, (0, 3, 2, 1, 4))
clone: torch.float8_e4m3fn[1, 4, 32, 1, 4] = aten.clone(permute, memory_format=torch.contiguous_format)
view_3: torch.float8_e4m3fn[128, 4] = aten.reshape(clone, (128, 4))
slice_1: torch.float8_e4m3fn[64, 4] = aten.slice(view_3, 0, 0, 64)
slice_2: torch.float8_e4m3fn[48, 4] = aten.slice(slice_1, 0, 16, 9223372036854775807)
nvfp4_linear_default: bf16[5, 48] = fa4.nvfp4_linear(arg3_1, arg0_1, slice_2, arg2_1, None)""")

    def test_nvfp4_linear_module(self):
        compiled = compile_with_nvfp4(nvfp4_linear_module(torch.bfloat16, bias=False),
                                      torch.randn(2, 3, K, dtype=torch.bfloat16))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
view_3: bf16[6, 64] = aten.reshape(arg3_1, (6, 64))
nvfp4_linear_default: bf16[6, 48] = fa4.nvfp4_linear(view_3, arg2_1, arg1_1, arg0_1, None)
view_4: bf16[2, 3, 48] = aten.reshape(nvfp4_linear_default, (2, 3, 48))""")


def test_lowering_keeps_cuda_matmuls_the_op_would_make_slower(monkeypatch):
    """On CUDA (sm90) the op beats default compile through our W4A16 GEMM for static M <= W4A16_MAX_M, and through
    quack's GEMM up to QUACK_MAX_M rows of a weight of at least QUACK_MIN_WEIGHTS."""
    from torch._subclasses import FakeTensorMode

    capability = [(9, 0)]
    monkeypatch.setattr(nvfp4_op.switches, "capability", lambda index: capability[0])
    quack_calls = []
    monkeypatch.setattr(nvfp4_op.quack_w4a16, "unsupported_reason",
                        lambda x, fmt, n, k: quack_calls.append((tuple(x.shape), fmt, n, k)))
    with FakeTensorMode(allow_non_fake_inputs=True):
        decode = torch.empty(1, 1, K, device="cuda", dtype=torch.bfloat16)
        batch = torch.empty(2, nvfp4_op.W4A16_MAX_M // 2, K, device="cuda", dtype=torch.bfloat16)
        larger = torch.empty(2, nvfp4_op.W4A16_MAX_M, 4096, device="cuda", dtype=torch.bfloat16)
        prefill = torch.empty(1, nvfp4_op.QUACK_MAX_M + 1, 4096, device="cuda", dtype=torch.bfloat16)
        cpu = torch.empty(4096, K, dtype=torch.bfloat16)
    assert nvfp4_op.rows_reason(decode, N, K) is None
    assert nvfp4_op.rows_reason(batch, N, K) is None
    assert nvfp4_op.rows_reason(larger, 2048, 4096) == (
        "32 rows of x over a 2048 x 4096 weight: above 16 rows the op (quack's GEMM) beats default compile only from "
        "16777216 weights")
    assert quack_calls == []
    assert nvfp4_op.rows_reason(larger, 4096, 4096) is None
    assert quack_calls == [((2, 16, 4096), "nvfp4", 4096, 4096)]
    monkeypatch.setattr(nvfp4_op, "QUACK_ROUTE", False)
    assert nvfp4_op.rows_reason(larger, 4096, 4096) == (
        "32 rows of x: above 16 rows the op beats default compile only through quack's GEMM, turned off (QUACK_ROUTE)")
    assert nvfp4_op.rows_reason(prefill, 4096, 4096) == (
        "257 rows of x: on CUDA the op beats default compile only up to 256 rows (measured slower above)")
    assert nvfp4_op.rows_reason(prefill, 4096, 4096, quantize_activations=True) is None
    assert nvfp4_op.rows_reason(cpu, N, K) is None
    capability[0] = (10, 0)
    assert nvfp4_op.rows_reason(decode, N, K) == ("our W4A16 GEMM is built for sm90; on sm100 the op is not faster "
                                                 "than default compile")


def test_a_symbolic_row_count_is_answered_for_its_hint_under_a_guard(monkeypatch):
    """A dynamic graph's row count: the op for a hint of 8 rows, guarded to 16 rows or fewer (a later call of more
    recompiles); default compile's path for 300 rows, guarded to more than 256."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    monkeypatch.setattr(nvfp4_op.switches, "capability", lambda index: (9, 0))
    for hint, expected in ((8, None), (300, "rows of x: on CUDA the op beats default compile only up to 256 rows")):
        env = ShapeEnv()
        rows = env.create_symintnode(env.create_symbol(hint, ConstantSource("m"), dynamic_dim=DimDynamic.DYNAMIC),
                                     hint=hint)
        with FakeTensorMode(shape_env=env, allow_non_fake_inputs=True):
            x = torch.empty(rows, K, device="cuda", dtype=torch.bfloat16)
        reason = nvfp4_op.rows_reason(x, N, K)
        assert reason is None if expected is None else expected in reason
        assert env.var_to_range[rows.node.expr] == (ValueRanges(2, 16) if hint == 8 else ValueRanges(257, int_oo))
