"""`fa4::fp8_linear` (kernels/fp8_linear.py) and the fp8_linear family, which emits it for torchao's float8
configs and user code on Inductor's aten graphs (lowering/fp8_linear.py), through the real backend."""

import re
import types

import expecttest
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fa4_inductor
from fa4_inductor import report
from fa4_inductor import fp8
from fa4_inductor.fp8 import Fp8Linear
from fa4_inductor.kernels import FP8_LINEAR, fp8_linear_scaled_mm_kept_reason, fp8_linear_unsupported_reason
from fa4_inductor.kernels import fp8_linear as op
from helpers import PostGradCompiled, compiled_one_row_decomposed, from_torchao_hints

pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # conftest.py: a cache hit skips the passes


@pytest.fixture(autouse=True)
def seeded():
    """Each test's random x the same, whichever tests ran before it in the process."""
    torch.manual_seed(0)


M, N, K = 5, 48, 64
E4M3 = torch.float8_e4m3fn
OP_CALL = "torch.ops.fa4.fp8_linear.default("
BACKEND = fa4_inductor.backend(fp8_linear=True)


def fp8_weight(per_row=True, seed=0, dtype=E4M3):
    """A random float8 weight [N, K] (codes over most of e4m3's range) and its positive float32 scale, [N] or [1]."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=g) * 64).clamp(-448, 448).to(dtype)
    return w, torch.rand(N if per_row else 1, generator=g) / 100 + 1e-3


def fp8_activation(shape, dtype, per_row=True, seed=1):
    """x: fp8 codes cast (exactly) to `dtype`, of `shape` [..., K]; x_scale float32 [M] or [1]."""
    g = torch.Generator().manual_seed(seed)
    codes = (torch.randn(shape, generator=g) * 64).clamp(-448, 448).to(E4M3)
    rows = codes.numel() // K
    return codes.to(dtype), torch.rand(rows if per_row else 1, generator=g) / 10 + 1e-2


# ------------------------------------------------------------------------------------------------------ the op

# opcheck's test_schema cannot run here: its mutation check compares inputs with a multiplication that has no
# float8_e4m3fn kernel on CPU. test_the_op_mutates_and_aliases_nothing checks what it would.
OPCHECK_TESTS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
SCALES = [  # (w_scale per row, x_scale per row; None: weight-only)
    pytest.param(True, None, id="weight-only-per-row"), pytest.param(False, None, id="weight-only-per-tensor"),
    pytest.param(True, True, id="x-per-row-w-per-row"), pytest.param(False, False, id="x-per-tensor-w-per-tensor"),
    pytest.param(True, False, id="x-per-tensor-w-per-row"), pytest.param(False, True, id="x-per-row-w-per-tensor")]
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("w_per_row, x_per_row", SCALES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype, w_per_row, x_per_row, with_bias):
    w, w_scale = fp8_weight(w_per_row)
    bias = torch.randn(N, dtype=dtype) if with_bias else None
    for x_shape in ((M, K), (2, 3, K)):
        x, x_scale = fp8_activation(x_shape, dtype, bool(x_per_row))
        args = (x, w, w_scale, None if x_per_row is None else x_scale, bias)
        torch.library.opcheck(FP8_LINEAR, args, {"use_fast_accum": x_per_row is not None}, test_utils=OPCHECK_TESTS)


def test_the_op_mutates_and_aliases_nothing():
    w, w_scale = fp8_weight()
    x, x_scale = fp8_activation((M, K), torch.bfloat16)
    inputs = (x, w, w_scale, x_scale, torch.randn(N, dtype=torch.bfloat16))
    before = [t.clone() for t in inputs]
    out = FP8_LINEAR(*inputs)
    for t, saved in zip(inputs, before):
        assert torch.equal(t.reshape(-1).view(torch.uint8), saved.reshape(-1).view(torch.uint8))
        assert out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def float64_reference(x, w, w_scale, x_scale, bias):
    out = x.double() @ (w.double() * w_scale.double().reshape(-1, 1)).T
    if x_scale is not None:
        out = out * (x_scale.double() if x_scale.numel() == 1 else x_scale.double().reshape(*x.shape[:-1], 1))
    return out if bias is None else out + bias.double()


TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}  # relative to the output's scale


@pytest.mark.parametrize("w_per_row, x_per_row", SCALES)
@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32], ids=str)
def test_numerics_against_float64(dtype, w_per_row, x_per_row):
    w, w_scale = fp8_weight(w_per_row, seed=2)
    x, x_scale = fp8_activation((4, 7, K), dtype, bool(x_per_row), seed=3)
    x_scale = None if x_per_row is None else x_scale
    bias = torch.randn(N, dtype=dtype)
    out = FP8_LINEAR(x, w, w_scale, x_scale, bias)
    assert out.dtype == dtype and out.shape == (4, 7, N) and out.is_contiguous()
    expected, tol = float64_reference(x, w, w_scale, x_scale, bias), TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol * expected.abs().max().item(), rtol=tol)


@pytest.mark.parametrize("w_per_row", [True, False], ids=["per-row", "per-tensor"])
@pytest.mark.parametrize("x_shape", [(M, K), (2, 3, K)], ids=["x-2d", "x-3d"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weight_only_is_eagers_linear_bit_for_bit(dtype, x_shape, w_per_row):
    w, w_scale = fp8_weight(w_per_row, seed=4)
    x, bias = torch.randn(x_shape, dtype=dtype), torch.randn(N, dtype=dtype)
    expected = F.linear(x, (w.float() * w_scale[:, None]).to(dtype), bias)
    assert torch.equal(FP8_LINEAR(x, w, w_scale, None, bias), expected)


def within_a_rounding(out, expected):
    """out within a rounding of its dtype of `expected` (and float32 noise of its scale): the same arithmetic up to the
    order of the float32 sums (oneDNN's `torch._scaled_mm` and torch.matmul sum in different orders)."""
    torch.testing.assert_close(out.float(), expected.float(), atol=1e-4 * expected.abs().max().item(), rtol=2 ** -7)


@pytest.mark.parametrize("per_row", [True, False], ids=["per-row", "per-tensor"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_scaled_order_is_cpu_scaled_mms_arithmetic(with_bias, per_row):
    """The reference computes what torch._scaled_mm computes on the CPU, up to the order of the float32 sums."""
    w, w_scale = fp8_weight(per_row, seed=5)
    x, x_scale = fp8_activation((M, K), torch.bfloat16, per_row, seed=6)
    bias = torch.randn(N, dtype=torch.bfloat16) if with_bias else None
    expected = torch._scaled_mm(x.to(E4M3), w.t(), x_scale.reshape(-1, 1), w_scale.reshape(1, -1), bias=bias,
                                out_dtype=torch.bfloat16, use_fast_accum=True)
    within_a_rounding(FP8_LINEAR(x, w, w_scale, x_scale, bias, use_fast_accum=True), expected)


@pytest.mark.parametrize("change, message", [
    (dict(w=fp8_weight(dtype=torch.float8_e5m2)[0]), "weight dtype float8_e5m2 is not supported"),
    (dict(w=fp8_weight()[0][None]), "2-D weight"),
    (dict(x=torch.randn(M, K, dtype=torch.float64)), "x dtype float64 is not supported"),
    (dict(w_scale=torch.rand(N, dtype=torch.bfloat16)), "float32 w_scale"),
    (dict(w_scale=torch.rand(N, 1)), r"w_scale has shape \[48, 1\], wants \[48\] or \[1\]"),
    (dict(x_scale=torch.rand(M + 1)), r"x_scale has shape \[6\], wants \[5\] or \[1\]"),
    (dict(bias=torch.randn(N)), "bias of x's dtype bfloat16, got float32"),
    (dict(x=torch.randn(M, K + 16, dtype=torch.bfloat16)), "x has 80 features, the weight 64"),
])
def test_inputs_the_op_cannot_take_are_errors(change, message):
    w, w_scale = fp8_weight()
    x, x_scale = fp8_activation((M, K), torch.bfloat16)
    args = dict(x=x, w=w, w_scale=w_scale, x_scale=x_scale, bias=None) | change
    with pytest.raises((ValueError, RuntimeError), match=message):
        FP8_LINEAR(args["x"], args["w"], args["w_scale"], args["x_scale"], args["bias"])


def test_unsupported_and_rows_reasons():
    assert fp8_linear_unsupported_reason("cuda", torch.bfloat16) is None
    assert fp8_linear_unsupported_reason("cpu", torch.float32, E4M3) is None
    assert fp8_linear_unsupported_reason("cuda", torch.bfloat16, torch.float8_e5m2) == \
        "weight dtype float8_e5m2 is not supported (takes float8_e4m3fn)"
    assert fp8_linear_unsupported_reason("mps", torch.bfloat16) == "device mps has no fa4 fp8_linear kernel"
    long_k = (2048, 8192)
    assert fp8_linear_scaled_mm_kept_reason("cuda", torch.bfloat16, 17, *long_k) == \
        "17 rows > 16, outside our fp8 decode GEMM (W4A16_MAX_ROWS): the op would only call torch._scaled_mm again"
    assert fp8_linear_scaled_mm_kept_reason("cuda", torch.float32, 1, *long_k) == \
        "our fp8 decode GEMM takes bf16 / fp16 x, not float32: the op would only call torch._scaled_mm again"
    assert fp8_linear_scaled_mm_kept_reason("cuda", torch.bfloat16, 1, 8192, 8192) == \
        "N 8192 > 2048 and K 8192 < 2 x N: torch._scaled_mm is measured as fast as our fp8 decode GEMM or faster " \
        "over such weights (SCALED_MM_NARROW_N, SCALED_MM_SLOW_K): the op would only call torch._scaled_mm again"
    for args in (("cuda", torch.float16, 16, *long_k), ("cuda", torch.bfloat16, None, 4096, 14336),
                 ("cuda", torch.bfloat16, 1, 2048, 2048), ("cpu", torch.bfloat16, 4096, 8192, 8192)):
        assert fp8_linear_scaled_mm_kept_reason(*args) is None


@pytest.fixture
def routes_as_on_an_h100(monkeypatch):
    """The CUDA route table run on CPU tensors: an sm90 device, and a stand-in for our decode GEMM's `fp8_matmul`
    that computes as it does (exact products summed in float32, the scales and bias, one rounding) and records its
    calls. Its [48, 64] weights are narrow (N <= SCALED_MM_NARROW_N): cuBLAS's fp8 GEMM is slow there."""
    calls = []

    def fp8_matmul(x2d, w, w_scale, x_scale, bias):
        calls.append((tuple(x2d.shape), x_scale is not None))
        out = (x2d.float() @ w.float().T) * w_scale.reshape(1, -1)
        out = out if x_scale is None else out * x_scale.reshape(-1, 1)
        return (out if bias is None else out + bias.float()).to(x2d.dtype)

    monkeypatch.setattr(op, "w4a16_decode", types.SimpleNamespace(
        unsupported_reason=lambda x2d, fmt, n, k: None if fmt == "fp8" else f"format {fmt}", fp8_matmul=fp8_matmul))
    monkeypatch.setattr(op.switches, "capability", lambda index: (9, 0))
    return calls


@pytest.mark.parametrize("w_per_row, x_per_row", SCALES)
def test_cuda_routes(routes_as_on_an_h100, w_per_row, x_per_row):
    """Up to 16 rows go to our decode GEMM (both orders, within a bf16 rounding of float64); more rows with an x_scale
    to torch._scaled_mm, the graph's call (a [1] scale expanded where the other is per row or column; the CPU's
    `_scaled_mm` here, within a rounding of the reference); more rows weight-only to the reference."""
    w, w_scale = fp8_weight(w_per_row, seed=7)
    bias = torch.randn(N, dtype=torch.bfloat16)
    for shape, route in (((2, 8, K), "w4a16_fp8"), ((3, 7, K), "scaled_mm" if x_per_row is not None else "dense")):
        x, x_scale = fp8_activation(shape, torch.bfloat16, bool(x_per_row), seed=8)
        x_scale = None if x_per_row is None else x_scale
        assert op.kernel_for(x, w, w_scale, x_scale, bias)[0] == route
        out = op.fp8_linear_cuda(x, w, w_scale, x_scale, bias, use_fast_accum=True)
        assert out.shape == (*shape[:-1], N) and out.dtype == torch.bfloat16 and out.is_contiguous()
        if route == "w4a16_fp8":
            assert routes_as_on_an_h100.pop() == ((16, K), x_scale is not None)
            expected = float64_reference(x, w, w_scale, x_scale, bias)
            torch.testing.assert_close(out.double(), expected, atol=1e-2 * expected.abs().max().item(), rtol=1e-2)
        elif route == "scaled_mm":
            within_a_rounding(out, op.fp8_linear(x, w, w_scale, x_scale, bias))
        else:
            assert torch.equal(out, op.fp8_linear(x, w, w_scale, x_scale, bias))
    assert routes_as_on_an_h100 == []


def test_scaled_mm_stays_over_weights_short_in_k(routes_as_on_an_h100, monkeypatch):
    """With an x_scale, a weight of more than SCALED_MM_NARROW_N rows whose K is under SCALED_MM_SLOW_K x N stays on
    torch._scaled_mm at any row count (measured as fast there); weight-only calls still take our decode GEMM, whose
    alternative is a bf16 GEMM."""
    monkeypatch.setattr(op, "SCALED_MM_NARROW_N", 32)  # N = 48, K = 64: as a wide weight short in K
    w, w_scale = fp8_weight()
    x, x_scale = fp8_activation((4, K), torch.bfloat16)
    assert op.kernel_for(x, w, w_scale, x_scale) == (
        "scaled_mm", "an fp8 activation with its scale: torch._scaled_mm, the call the model made (N 48 > 32 and K 64 "
                     "< 2 x N: torch._scaled_mm is measured as fast as our fp8 decode GEMM or faster over such weights "
                     "(SCALED_MM_NARROW_N, SCALED_MM_SLOW_K))")
    assert op.kernel_for(x, w, w_scale)[0] == "w4a16_fp8"


def test_kernel_for_says_why(routes_as_on_an_h100):
    w, w_scale = fp8_weight()
    x, x_scale = fp8_activation((17, K), torch.float16)
    assert op.kernel_for(x, w, w_scale, x_scale) == (
        "dense", "17 rows > 16, outside our fp8 decode GEMM (W4A16_MAX_ROWS); torch._scaled_mm's row-wise scaling "
                 "outputs bfloat16 only, x is float16")
    assert op.kernel_for(x[:16], w, w_scale, x_scale[:16]) == (
        "w4a16_fp8", "at most 16 rows: our decode GEMM reads the fp8 weight in place")


# -------------------------------------------------------------------------------------- the family, compiled


def dynamic_fp8_linear(per_row=True, bias=True, seed=0):
    """torchao's `Float8DynamicActivationFloat8WeightConfig` linear as plain buffers (`fa4_inductor.fp8.Fp8Linear`,
    torchao 0.18's `Float8Tensor` forward bit for bit): x quantized per row (or per tensor) with the scale amax / 448,
    the weight per row (per tensor), then `torch._scaled_mm` with fast accumulation."""
    w, w_scale = fp8_weight(per_row, seed)
    layer = Fp8Linear(K, N, bias=bias, activation="row" if per_row else "tensor", per_channel=per_row,
                      dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.weight_scale.copy_(w_scale.reshape(-1, 1))
        if bias:
            layer.bias.copy_(torch.randn(N, dtype=torch.bfloat16))
    return layer


class WeightOnlyFp8Linear(nn.Module):
    """User code: `F.linear(x, (w.float() * scale[:, None]).to(x.dtype), bias)` over an fp8 weight buffer."""

    def __init__(self, bias=True, seed=0, weight_dtype=E4M3):
        super().__init__()
        w, w_scale = fp8_weight(True, seed, weight_dtype)
        self.register_buffer("weight", w)
        self.register_buffer("weight_scale", w_scale)
        self.bias = nn.Parameter(torch.randn(N, dtype=torch.bfloat16), requires_grad=False) if bias else None

    def forward(self, x):
        return F.linear(x, (self.weight.float() * self.weight_scale[:, None]).to(x.dtype), self.bias)


def as_close_to_eager_as_default_compile(out, plain, expected):
    """Inductor quantizes x in its own arithmetic, where a rounding may land an element on the next e4m3 code (1/16
    apart relatively): default compile's output (`plain`) is a few percent of the output's scale off eager's here.
    Ours is no further off, up to a rounding of the output."""
    scale = expected.abs().max().item()
    ours, theirs = ((t.float() - expected.float()).abs().max().item() for t in (out, plain))
    assert ours <= theirs + 2 ** -6 * scale, (ours, theirs, scale)


def from_the_fp8_cast(graph: str) -> str:
    """The rewritten graph from the activation's cast to e4m3 on (the quantizing chain before it stays)."""
    lines = graph.splitlines()
    return "\n".join(lines[next(i for i, line in enumerate(lines) if "= prims.convert_element_type(" in line
                                and line.split(":")[1].strip().startswith("torch.float8_e4m3fn[")):])


def compiled_with_and_without(model, x, **compile_options):
    """model(x) compiled with BACKEND, and with the family off, and its eager output."""
    with torch.no_grad():
        compiled = PostGradCompiled(model, x, backend=BACKEND, **compile_options)
        plain = PostGradCompiled(model, x, backend=fa4_inductor.backend(fp8_linear=False), **compile_options)
        return compiled, plain, model(x)


def describe_scaled(m, per_row, bias=True):
    return (f"fa4.fp8_linear(x[{m}x{K}] float8_e4m3fn as bfloat16, w[{N}x{K}] float8_e4m3fn, "
            f"w_scale[{N if per_row else 1}] float32, x_scale[{m if per_row else 1}] float32"
            + (f", bias[{N}] bfloat16" if bias else "") + ", use_fast_accum=True)")


@pytest.mark.parametrize("bias", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["bias", "no-bias"])
@pytest.mark.parametrize("per_row", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["per-row", "per-tensor"])
@pytest.mark.parametrize("x_shape", [(1, K), pytest.param((2, 3, K), marks=pytest.mark.slow)], ids=["x-1-row", "x-3d"])
def test_dynamic_activation_module(x_shape, per_row, bias):
    """The op in `_scaled_mm`'s place: within a rounding of default compile's `_scaled_mm` (Inductor quantizes x alike
    in both), close to eager's."""
    model = dynamic_fp8_linear(per_row, bias)
    x = torch.randn(x_shape, dtype=torch.bfloat16)
    compiled, plain, expected = compiled_with_and_without(model, x)
    assert compiled.code.count(OP_CALL) == 1 and "aten._scaled_mm" not in compiled.graphs[0]
    m = x.numel() // K
    assert compiled.details == [(True, describe_scaled(m, per_row, bias))]
    assert compiled.out.shape == expected.shape
    within_a_rounding(compiled.out, plain.out)
    as_close_to_eager_as_default_compile(compiled.out, plain.out, expected)


@pytest.mark.slow
def test_dynamic_activation_under_dynamic_shapes():
    """`dynamic=True`: a symbolic row count becomes the op (on CUDA its routes decide per call); other batch sizes run
    the same graph."""
    model = dynamic_fp8_linear(per_row=True)
    x = torch.randn(2, 3, K, dtype=torch.bfloat16)
    compiled, plain, expected = compiled_with_and_without(model, x, dynamic=True)
    assert compiled.code.count(OP_CALL) == 1
    assert [(r, re.sub(r"\bs\d+", "s", detail)) for r, detail in compiled.details] == [
        (True, f"fa4.fp8_linear(x[s*sx{K}] float8_e4m3fn as bfloat16, w[{N}x{K}] float8_e4m3fn, w_scale[{N}] float32, "
               f"x_scale[s*s] float32, bias[{N}] bfloat16, use_fast_accum=True)")]
    within_a_rounding(compiled.out, plain.out)
    as_close_to_eager_as_default_compile(compiled.out, plain.out, expected)
    torch._dynamo.reset()
    with report.collecting() as records, torch.no_grad():
        fn = torch.compile(model, backend=BACKEND, dynamic=True)
        default = torch.compile(model, backend=fa4_inductor.backend(fp8_linear=False), dynamic=True)
        for batch in (2, 5, 7):
            x = torch.randn(batch, 3, K, dtype=torch.bfloat16)
            within_a_rounding(fn(x), default(x))
    assert [r.rewritten for r in records] == [True]


class TwoLayers(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.first, self.second = make(seed=1), make(seed=2)

    def forward(self, x):
        return self.second(F.pad(self.first(x), (0, K - N)))


@pytest.mark.slow
@pytest.mark.parametrize("make", [dynamic_fp8_linear, WeightOnlyFp8Linear], ids=["dynamic-activation", "weight-only"])
def test_every_linear_of_a_model_becomes_the_op(make):
    model = TwoLayers(make)
    x = torch.randn(2, 3, K, dtype=torch.bfloat16)
    compiled, plain, expected = compiled_with_and_without(model, x)
    assert compiled.code.count(OP_CALL) == 2 and [r for r, _ in compiled.details] == [True, True]
    as_close_to_eager_as_default_compile(compiled.out, plain.out, expected)


@pytest.mark.parametrize("x_shape", [(M, K), (2, 3, K)], ids=["x-2d", "x-3d"])
def test_weight_only_user_code(x_shape):
    model = WeightOnlyFp8Linear()
    x = torch.randn(x_shape, dtype=torch.bfloat16)
    compiled, _, expected = compiled_with_and_without(model, x)
    assert compiled.code.count(OP_CALL) == 1
    assert compiled.details == [(True, f"fa4.fp8_linear(x[{x.numel() // K}x{K}] bfloat16, w[{N}x{K}] float8_e4m3fn, "
                                       f"w_scale[{N}] float32, bias[{N}] bfloat16)")]
    torch.testing.assert_close(compiled.out, expected, atol=0, rtol=0)  # eager's roundings, in eager's order


def torchao_model(config, bias=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(K, N, bias=bias)).to(torch.bfloat16).requires_grad_(False)
    from torchao.quantization import quantize_

    quantize_(model, config)
    return model


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("x_shape", [(M, K), (2, 3, K)], ids=["x-2d", "x-3d"])
def test_torchao_float8_weight_only_config(x_shape, bias):
    """torchao's `Float8WeightOnlyConfig`: the weight dequantized in float32 and rounded to x's dtype, then the
    matmul; its bias, added after, stays as written. Eager's output bit for bit."""
    pytest.importorskip("torchao")
    from torchao.quantization import Float8WeightOnlyConfig

    model = torchao_model(Float8WeightOnlyConfig(set_inductor_config=False), bias)
    x = torch.randn(x_shape, dtype=torch.bfloat16)
    compiled, _, expected = compiled_with_and_without(model, x)
    assert compiled.code.count(OP_CALL) == 1
    assert compiled.details == [(True, f"fa4.fp8_linear(x[{x.numel() // K}x{K}] bfloat16, w[{N}x{K}] float8_e4m3fn, "
                                       f"w_scale[{N}] float32)")]
    torch.testing.assert_close(compiled.out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("granularity", ["PerRow", pytest.param("PerTensor", marks=pytest.mark.slow)])
def test_torchao_float8_dynamic_activation_config(monkeypatch, granularity):
    """torchao's `Float8DynamicActivationFloat8WeightConfig` itself, built on the CPU: its hardware check (CUDA sm89+,
    `torchao.float8.inference._check_hardware_support`, imported into quant_api) is the only thing that refuses it
    here."""
    pytest.importorskip("torchao")
    import torchao.quantization as quantization
    from torchao.quantization import quant_api

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    config = quantization.Float8DynamicActivationFloat8WeightConfig(
        granularity=getattr(quantization, granularity)(), set_inductor_config=False)
    model = torchao_model(config)
    x = torch.randn(2, 3, K, dtype=torch.bfloat16)
    compiled, plain, expected = compiled_with_and_without(model, x)
    assert compiled.code.count(OP_CALL) == 1 and "aten._scaled_mm" in plain.graphs[0]
    assert compiled.details == [(True, describe_scaled(6, granularity == "PerRow"))]
    within_a_rounding(compiled.out, plain.out)
    as_close_to_eager_as_default_compile(compiled.out, plain.out, expected)


def torchao_fp8_configs(monkeypatch):
    """torchao's three fp8 configs that `fp8.from_torchao` takes, the dynamic-activation ones past their hardware
    check (`test_torchao_float8_dynamic_activation_config`)."""
    import torchao.quantization as quantization
    from torchao.quantization import quant_api

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    dynamic = quantization.Float8DynamicActivationFloat8WeightConfig
    return {"per-row": dynamic(granularity=quantization.PerRow(), set_inductor_config=False),
            "per-tensor": dynamic(granularity=quantization.PerTensor(), set_inductor_config=False),
            "weight-only": quantization.Float8WeightOnlyConfig(set_inductor_config=False)}


@pytest.mark.parametrize("bias", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["bias", "no-bias"])
@pytest.mark.parametrize("config", ["per-row", pytest.param("per-tensor", marks=pytest.mark.slow),
                                    pytest.param("weight-only", marks=pytest.mark.slow)])
def test_from_torchao_keeps_torchaos_outputs_bit_for_bit(monkeypatch, config, bias):
    """`fp8.from_torchao` turns each torchao fp8 weight into an `Fp8Linear` over the same codes and scales: the same
    outputs bit for bit (torchao's PyTorch kernels), 2-D and 3-D x; compiled, each becomes the op as torchao's did."""
    pytest.importorskip("torchao")
    import copy

    model = nn.Sequential(nn.Linear(K, N, bias=bias), nn.GELU(), nn.Linear(N, K, bias=bias)).to(torch.bfloat16)
    from torchao.quantization import quantize_

    quantize_(model.requires_grad_(False), torchao_fp8_configs(monkeypatch)[config])
    plain = copy.deepcopy(model)
    assert fp8.from_torchao(plain) == ["0", "2"]
    assert all(isinstance(plain[i], Fp8Linear) and not fp8.is_torchao_fp8(plain[i].weight) for i in (0, 2))
    with torch.no_grad():
        for shape in ((M, K), (2, 3, K), (1, K)):
            x = torch.randn(shape, dtype=torch.bfloat16)
            assert torch.equal(plain(x), model(x)), shape
        compiled, family_off, expected = compiled_with_and_without(plain, torch.randn(2, 3, K, dtype=torch.bfloat16))
    assert compiled.code.count(OP_CALL) == 2 and [r for r, _ in compiled.details] == [True, True]
    as_close_to_eager_as_default_compile(compiled.out, family_off.out, expected)  # Inductor's GELU rounds once


def test_compiling_torchao_fp8_weights_hints_at_from_torchao(monkeypatch):
    """torchao fp8 weights reach the graph as tensor subclasses: the backend names `fp8.from_torchao`; after it, the
    plain layers leave it nothing to say."""
    pytest.importorskip("torchao")
    model = torchao_model(torchao_fp8_configs(monkeypatch)["per-row"])
    x = torch.randn(2, K, dtype=torch.bfloat16)
    hints = from_torchao_hints(monkeypatch, model, x)
    assert [level for level, _ in hints] == ["INFO"], hints  # compiled as their inner tensors: guards are what is left
    assert hints[0][1].startswith("1 torchao fp8 weights reach this graph") and \
        "`fa4_inductor.fp8.from_torchao(model)`" in hints[0][1] and "1.46 against 1.44 ms/token" in hints[0][1], hints
    hints = from_torchao_hints(monkeypatch, model, x, subclass_weights=False)
    assert [level for level, _ in hints] == ["WARNING"] and "1.46 against 2.71 ms/token" in hints[0][1], hints
    assert fp8.from_torchao(model) == ["0"] and from_torchao_hints(monkeypatch, model, x) == []


def test_from_torchao_leaves_what_fp8linear_does_not_compute(monkeypatch):
    """Weights whose arithmetic `Fp8Linear` does not reproduce stay torchao's: a bound on the activation's scale,
    and a weight that is not fp8."""
    pytest.importorskip("torchao")
    import torchao.quantization as quantization
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    configs = torchao_fp8_configs(monkeypatch)
    bounded = quantization.Float8DynamicActivationFloat8WeightConfig(
        granularity=quantization.PerRow(), activation_value_ub=100.0, set_inductor_config=False)
    model = nn.Sequential(nn.Linear(K, N), nn.Linear(N, K), nn.Linear(K, N)).to(torch.bfloat16).requires_grad_(False)
    quantize_(model, bounded, filter_fn=lambda m, fqn: fqn == "0")
    quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: fqn == "1")
    quantize_(model, configs["per-row"], filter_fn=lambda m, fqn: fqn == "2")
    assert fp8.from_torchao(model) == ["2"]
    assert fp8.torchao_fp8_layout(model[2].weight) is None and fp8.torchao_fp8_layout(model[0].weight) is None


def test_one_row_matmul_inductor_decomposed_is_rewritten():
    """With `coordinate_descent_tuning` Inductor has made a one-row weight-only matmul a multiply and a sum in float32
    before our stage; the family sees the matmul again (lowering/gemv.py)."""
    model = WeightOnlyFp8Linear(bias=False)
    x = torch.randn(1, K, dtype=torch.bfloat16)
    compiled, expected = compiled_one_row_decomposed(model, x, BACKEND, fa4_inductor.backend(fp8_linear=False),
                                                     OP_CALL)
    assert compiled.details == [(True, f"fa4.fp8_linear(x[1x{K}] bfloat16, w[{N}x{K}] float8_e4m3fn, "
                                       f"w_scale[{N}] float32)")]
    torch.testing.assert_close(compiled.out, expected, atol=0, rtol=0)


class TestRewrittenGraphs(expecttest.TestCase):
    def test_dynamic_activation_x_3d(self):
        """Per row, then what per tensor changes: the scales' shapes."""
        graphs = []
        for per_row in (True, False):
            compiled, _, _ = compiled_with_and_without(dynamic_fp8_linear(per_row=per_row),
                                                       torch.randn(2, 3, K, dtype=torch.bfloat16))
            graphs.append(from_the_fp8_cast(compiled.graphs[0]).splitlines())
        per_tensor = [line for line in graphs[1] if line not in graphs[0]]
        self.assertExpectedInline("\n".join([*graphs[0], "--- per tensor, the lines that differ:", *per_tensor]), """\
convert_element_type_2: torch.float8_e4m3fn[2, 3, 64] = prims.convert_element_type(clamp_max, float8_e4m3fn)
view: torch.float8_e4m3fn[6, 64] = aten.reshape(convert_element_type_2, (-1, 64))
view_1: f32[6, 1] = aten.reshape(convert_element_type, (-1, 1))
reshape_default: f32[48] = aten.reshape(arg2_1, (-1))
reshape_default_1: f32[6] = aten.reshape(view_1, (-1))
convert_element_type_default: bf16[6, 64] = prims.convert_element_type(view, bfloat16)
fp8_linear_default: bf16[6, 48] = fa4.fp8_linear(convert_element_type_default, arg1_1, reshape_default, reshape_default_1, arg3_1, use_fast_accum=True)
view_2: bf16[2, 3, 48] = aten.reshape(fp8_linear_default, (2, 3, 48))
--- per tensor, the lines that differ:
view_1: f32[1, 1] = aten.reshape(convert_element_type, (-1, 1))
reshape_default: f32[1] = aten.reshape(arg2_1, (-1))
reshape_default_1: f32[1] = aten.reshape(view_1, (-1))""")

    def test_torchao_weight_only_x_3d_with_bias(self):
        pytest.importorskip("torchao")
        from torchao.quantization import Float8WeightOnlyConfig

        model = torchao_model(Float8WeightOnlyConfig(set_inductor_config=False))
        compiled, _, _ = compiled_with_and_without(model, torch.randn(2, 3, K, dtype=torch.bfloat16))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
view: bf16[6, 64] = aten.reshape(arg3_1, (6, 64))
reshape_default: f32[48] = aten.reshape(arg1_1, (-1))
fp8_linear_default: bf16[6, 48] = fa4.fp8_linear(view, arg0_1, reshape_default)
view_1: bf16[2, 3, 48] = aten.reshape(fp8_linear_default, (2, 3, 48))
add: bf16[2, 3, 48] = aten.add(view_1, arg2_1)""")

    def test_weight_only_user_code_x_3d(self):
        compiled, _, _ = compiled_with_and_without(WeightOnlyFp8Linear(), torch.randn(2, 3, K, dtype=torch.bfloat16))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
view: bf16[6, 64] = aten.reshape(arg2_1, (6, 64))
fp8_linear_default: bf16[6, 48] = fa4.fp8_linear(view, arg0_1, arg1_1, None, arg3_1)
view_1: bf16[2, 3, 48] = aten.reshape(fp8_linear_default, (2, 3, 48))""")


# --------------------------------------------------------------------------------------- what stays as written


def _scaled_mm(x_fp8, x_scale, w, w_scale, **kwargs):
    return torch._scaled_mm(x_fp8, w.t(), x_scale, w_scale.t(), out_dtype=torch.bfloat16, **kwargs)


def quantized_x(x, dtype=E4M3):
    x_scale = (x.abs().amax(dim=-1, keepdim=True) / 448).float()
    return (x.float() / x_scale).clamp(-448, 448).to(dtype), x_scale


@pytest.mark.parametrize("fn, reason", [
    pytest.param(lambda x, w, ws: F.linear(x, ((w.float() * 2).to(E4M3).float() * ws[:, None]).to(x.dtype)),
                 "the fp8 weight (convert_element_type_1) is computed in the graph, not a parameter or buffer",
                 id="computed-weight"),
    pytest.param(lambda x, w, ws: _scaled_mm(*quantized_x(x), w.to(torch.float32).to(E4M3), ws[:, None]),
                 "the fp8 weight (convert_element_type_4) is computed in the graph, not a parameter or buffer",
                 id="computed-weight-scaled-mm"),
    pytest.param(lambda x, w, ws: _scaled_mm(*quantized_x(x), w, ws[:, None], scale_result=torch.ones(())),
                 "torch._scaled_mm is given a result scale (scale_result), which the op does not take",
                 id="scale-result"),
    pytest.param(lambda x, w, ws: _scaled_mm(*quantized_x(x, torch.float8_e5m2), w, ws[:, None]),
                 "the activation is float8_e5m2, not float8_e4m3fn", id="e5m2-activation"),
    pytest.param(lambda x, w, ws: F.linear(x, (w.float() * torch.full((K,), 0.01)).to(x.dtype)),
                 "the fp8 weight is multiplied by a float32 tensor of shape [64]: not a scale per output channel or "
                 "per tensor", id="weight-only-per-input-channel"),
    pytest.param(lambda x, w, ws: F.linear(x, w.to(x.dtype) * ws.to(x.dtype)[:, None]),
                 "the fp8 weight is multiplied by its scale in bfloat16, not float32 (the op's order)",
                 id="dequantized-in-bfloat16"),
])
def test_what_stays_as_written(fn, reason):
    w, w_scale = fp8_weight()
    x = torch.randn(M, K, dtype=torch.bfloat16)
    compiled = PostGradCompiled(fn, x, w, w_scale, backend=BACKEND)
    assert OP_CALL not in compiled.code
    assert compiled.details == [(False, reason)]
    torch._dynamo.reset()
    assert torch.equal(compiled.out, torch.compile(fn, backend="inductor")(x, w, w_scale))  # what Inductor alone gives


def test_an_e5m2_weight_stays_as_written():
    model = WeightOnlyFp8Linear(weight_dtype=torch.float8_e5m2)
    x = torch.randn(M, K, dtype=torch.bfloat16)
    compiled, plain, expected = compiled_with_and_without(model, x)
    assert OP_CALL not in compiled.code
    assert compiled.details == [(False, "weight dtype float8_e5m2 is not supported (takes float8_e4m3fn)")]
    torch.testing.assert_close(compiled.out, plain.out, atol=0, rtol=0)


def test_a_dequantized_weight_read_twice_stays_as_written():
    def fn(x, w, ws):
        dequantized = (w.float() * ws[:, None]).to(x.dtype)
        return F.linear(x, dequantized), dequantized.sum()

    w, w_scale = fp8_weight()
    x = torch.randn(M, K, dtype=torch.bfloat16)
    compiled = PostGradCompiled(fn, x, w, w_scale, backend=BACKEND)
    assert OP_CALL not in compiled.code
    assert [r for r, _ in compiled.details] == [False]
    assert compiled.details[0][1].startswith("the dequantized weight (convert_element_type_1) is also read by ")


@pytest.mark.slow
def test_static_rows_above_16_stay_on_cuda(monkeypatch):
    """On CUDA a `_scaled_mm` of more than 16 rows (known when compiling) stays as written: the op would call
    `torch._scaled_mm` again. The rule, applied to the CPU graph: 17 rows stay, 16 become the op."""
    from fa4_inductor.lowering import fp8_linear as family

    monkeypatch.setattr(family, "fp8_linear_scaled_mm_kept_reason",
                        lambda device, dtype, m, n, k: fp8_linear_scaled_mm_kept_reason("cuda", dtype, m, n, k))
    for rows, rewritten in ((17, False), (16, True)):
        compiled, plain, _ = compiled_with_and_without(dynamic_fp8_linear(), torch.randn(rows, K, dtype=torch.bfloat16))
        assert (OP_CALL in compiled.code) is rewritten
        assert compiled.details == [(rewritten, describe_scaled(16, True) if rewritten else
                                     fp8_linear_scaled_mm_kept_reason("cuda", torch.bfloat16, 17, N, K))]
        within_a_rounding(compiled.out, plain.out)
    monkeypatch.setattr(op, "SCALED_MM_NARROW_N", 32)  # and a wide weight short in K stays at any row count
    compiled, plain, _ = compiled_with_and_without(dynamic_fp8_linear(), torch.randn(16, K, dtype=torch.bfloat16))
    assert OP_CALL not in compiled.code
    assert compiled.details == [(False, fp8_linear_scaled_mm_kept_reason("cuda", torch.bfloat16, 16, N, K))]
    assert "N 48 > 32 and K 64 < 2 x N" in compiled.details[0][1]


@pytest.mark.parametrize("backend, rewritten", [(fa4_inductor.backend(fp8_linear=False), False),
                                                (fa4_inductor.fa4_inductor, True)],
                         ids=["option-off", "default-options"])
def test_the_family_is_on_by_default_and_has_an_off_switch(backend, rewritten):
    model = WeightOnlyFp8Linear()
    x = torch.randn(M, K, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = PostGradCompiled(model, x, backend=backend)
        expected = model(x)
    assert (OP_CALL in compiled.code) is rewritten and len(compiled.records) == int(rewritten)
    torch.testing.assert_close(compiled.out, expected, atol=0, rtol=0)


def test_explain_reports_the_family():
    report = fa4_inductor.explain(dynamic_fp8_linear(), torch.randn(M, K, dtype=torch.bfloat16))
    assert [(r.family, r.rewritten) for r in report.records] == [("fp8_linear", True)], report.records
