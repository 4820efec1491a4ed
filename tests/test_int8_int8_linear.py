"""`fa4::int8_int8_linear` (kernels/int8_int8_linear.py) and the int8_int8_linear family, which emits it for
torchao's `Int8DynamicActivationInt8WeightConfig` on Inductor's aten graphs (lowering/int8_int8_linear.py)."""

import contextlib
import math
import re
from unittest import mock

import expecttest
import pytest
import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import report
from fa4_inductor.kernels import INT8_INT8_LINEAR, int8_int8_linear_unsupported_reason
from fa4_inductor.kernels import int8_int8_linear as op
from helpers import PostGradCompiled as Compiled
from helpers import assert_within_int8_int8_bound

pytestmark = pytest.mark.usefixtures("without_fx_graph_cache", "torchao_int_mm_as_on_cuda")

M, N, K = 5, 48, 64
OP_CALL = "torch.ops.fa4.int8_int8_linear.default("
OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def inputs(m=M, bias_dtype=torch.bfloat16, scale_shape=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (m, K), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    x_scale = torch.rand(scale_shape or (m, 1), generator=g) / 64 + 1e-3
    w_scale = torch.rand(N, generator=g) / 64 + 1e-3
    bias = None if bias_dtype is None else torch.randn(N, generator=g).to(bias_dtype)
    return x, x_scale, w, w_scale, bias


@pytest.mark.parametrize("scale_shape", ["[M, 1]", "[M]"])
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_opcheck(out_dtype, bias_dtype, scale_shape):
    x, xs, w, ws, b = inputs(bias_dtype=bias_dtype, scale_shape=(M, 1) if scale_shape == "[M, 1]" else (M,))
    torch.library.opcheck(INT8_INT8_LINEAR, (x, xs, w, ws, b), {"out_dtype": out_dtype})


@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16], ids=str)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_equals_torchaos_arithmetic_bit_for_bit(out_dtype, bias_dtype):
    """The steps of the aten graph torchao's tensor subclass leaves (lowering/int8_int8_linear.py), eagerly."""
    x, xs, w, ws, b = inputs(m=7, bias_dtype=bias_dtype, seed=3)
    y = (torch._int_mm(x, w.t()).to(torch.float32) * xs).to(out_dtype) * ws
    expected = (y if b is None else y + b).to(out_dtype)
    assert torch.equal(INT8_INT8_LINEAR(x, xs, w, ws, b, out_dtype=out_dtype), expected)


@pytest.mark.parametrize("m", [0, 1, 16, 17])
def test_cuda_path_pads_small_m_without_changing_the_result(m):
    """The CUDA kernel's padding for `_int_mm` (run here on CPU tensors): rows are independent, so the padded
    product sliced back is the reference bit for bit."""
    x, xs, w, ws, b = inputs(m=m, seed=m)
    assert torch.equal(op.int8_int8_linear_cuda(x, xs, w, ws, b, out_dtype=torch.bfloat16),
                       op.int8_int8_linear(x, xs, w, ws, b, out_dtype=torch.bfloat16))


def test_cuda_path_runs_few_rows_on_a_mixed_input_kernel(monkeypatch):
    """Where one of int8_linear's mixed-input kernels takes the shape (a stand-in here that rounds as they do: float32
    products and sums, the weight's scale, one rounding to bf16), up to 16 rows run the int8 activation through it
    in the output's dtype, then x's scale and the bias: within a bf16 rounding of the scaled product plus one of
    the result from the float64 value. 17 rows and more stay on `_int_mm`, bit for bit the reference."""
    seen = []

    class StandIn:
        @staticmethod
        def run(x, w_int8, w_scale):
            seen.append((tuple(x.shape), x.dtype))
            return ((x.float() @ w_int8.float().T) * w_scale).to(x.dtype)

    monkeypatch.setattr(op, "weight_only_route", lambda x, w_int8, w_scale: StandIn)
    for bias_dtype in (torch.bfloat16, None):
        x, xs, w, ws, b = inputs(m=5, bias_dtype=bias_dtype, seed=5)
        out = op.int8_int8_linear_cuda(x, xs, w, ws, b, out_dtype=torch.bfloat16)
        assert seen.pop() == ((5, K), torch.bfloat16) and out.dtype == torch.bfloat16 and out.is_contiguous()
        assert_within_int8_int8_bound(out, x, xs, w, ws, b)
    x, xs, w, ws, b = inputs(m=17, seed=17)
    assert torch.equal(op.int8_int8_linear_cuda(x, xs, w, ws, b, out_dtype=torch.bfloat16),
                       op.int8_int8_linear(x, xs, w, ws, b, out_dtype=torch.bfloat16))
    assert seen == []


@pytest.mark.parametrize("m", [1, 16, 17, 40])
def test_numerics_against_float64(m):
    x, xs, w, ws, b = inputs(m=m, seed=m)
    out = INT8_INT8_LINEAR(x, xs, w, ws, b, out_dtype=torch.bfloat16)
    expected = (x.double() @ w.double().T) * xs.double() * ws.double() + b.double()
    torch.testing.assert_close(out.double(), expected, atol=2e-2 * expected.abs().max().item(), rtol=2e-2)


@pytest.mark.parametrize("change, message", [
    (dict(x=torch.zeros(M, K)), "2-D int8 x_int8"),
    (dict(w=torch.zeros(N, K, dtype=torch.int8)[None]), "2-D int8 w_int8"),
    (dict(out_dtype=torch.int32), "out_dtype int32 is not supported"),
    (dict(xs=torch.ones(M, 2)), r"x_scale has shape \[5, 2\], wants \[5, 1\] or \[5\]"),
    (dict(ws=torch.ones(N, 1)), r"w_scale has shape \[48, 1\], wants \[48\]"),
    (dict(b=torch.ones(N, dtype=torch.int32)), "floating-point bias"),
    (dict(x=torch.zeros(M, K + 8, dtype=torch.int8)), "x has 72 features, the weight 64"),
])
def test_inputs_the_op_cannot_take_are_errors(change, message):
    x, xs, w, ws, b = inputs()
    args = dict(x=x, xs=xs, w=w, ws=ws, b=b, out_dtype=torch.bfloat16) | change
    with pytest.raises((ValueError, RuntimeError), match=message):
        INT8_INT8_LINEAR(args["x"], args["xs"], args["w"], args["ws"], args["b"], out_dtype=args["out_dtype"])


def test_unsupported_reason():
    assert int8_int8_linear_unsupported_reason("cuda", torch.bfloat16, 4096, 4096) is None
    assert int8_int8_linear_unsupported_reason("cpu", torch.float32, 12, 20) is None
    assert int8_int8_linear_unsupported_reason("cuda", torch.bfloat16, 12, 64) == \
        "cuBLAS's int8 GEMM (torch._int_mm) needs K and N multiples of 8; the weight is [12, 64]"
    assert int8_int8_linear_unsupported_reason("mps", torch.bfloat16, 8, 8) == \
        "device mps has no fa4 int8_int8_linear kernel"


# -------------------------------------------------------------------------------------- the family, compiled


def torchao_model(bias, seed=0, dtype=torch.bfloat16):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(K, N, bias=bias)).to(dtype).requires_grad_(False)
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    return model


BACKEND = fa4_inductor.backend(int8_int8_linear=True)


def describe(m, bias):
    return (f"fa4.int8_int8_linear(x[{m}x{K}] int8, x_scale[{m}x1] float32, w[{N}x{K}] int8, w_scale[{N}] float32"
            + (f", bias[{N}] bfloat16" if bias else "") + ", out_dtype=bfloat16)")


def close_to(out, expected):
    """Within two bf16 roundings of the output's scale: the activation quantization is Inductor's (its
    roundings may differ from eager's by one step of an int8 code)."""
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2 * expected.abs().max().item(), rtol=2e-2)


def compiled_torchao_model(bias, x_shape, dtype=torch.bfloat16):
    """torchao's module compiled by BACKEND on a fresh random x, and its eager output."""
    pytest.importorskip("torchao")
    model = torchao_model(bias, dtype=dtype)
    x = torch.randn(x_shape, dtype=dtype)
    with torch.no_grad():
        return Compiled(model, x, backend=BACKEND), model(x)


@pytest.mark.parametrize("bias", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["no-bias", "bias"])
@pytest.mark.parametrize("x_shape", [(1, K), (16, K), pytest.param((2, 3, K), marks=pytest.mark.slow)], ids=str)
def test_torchao_int8_dynamic_small_m(x_shape, bias):
    compiled, expected = compiled_torchao_model(bias, x_shape)
    assert OP_CALL in compiled.code
    m = 1 if len(x_shape) == 2 and x_shape[0] == 1 else x_shape[0] * (x_shape[1] if len(x_shape) == 3 else 1)
    assert compiled.details == [(True, describe(m, bias))]
    assert compiled.out.shape == expected.shape
    close_to(compiled.out, expected)


@pytest.mark.parametrize("x_shape", [(3, K), (2, 3, K)], ids=str)
def test_a_float32_model_has_no_cast_back_and_is_rewritten(x_shape):
    """With a float32 activation torchao's graph has no cast after the activation scale (the product is float32
    already): the op with out_dtype float32 computes the same chain."""
    compiled, expected = compiled_torchao_model(True, x_shape, torch.float32)
    assert OP_CALL in compiled.code
    assert compiled.details == [(True, f"fa4.int8_int8_linear(x[{math.prod(x_shape[:-1])}x{K}] int8, "
                                       f"x_scale[{math.prod(x_shape[:-1])}x1] float32, w[{N}x{K}] int8, "
                                       f"w_scale[{N}] float32, bias[{N}] float32, out_dtype=float32)")]
    assert compiled.out.shape == expected.shape and compiled.out.dtype == torch.float32
    close_to(compiled.out, expected)


def test_static_m_above_16_stays_for_default_compile():
    pytest.importorskip("torchao")
    model = torchao_model(True)
    x = torch.randn(20, K, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = Compiled(model, x, backend=BACKEND)
    assert OP_CALL not in compiled.code
    assert compiled.details == [(False, "20 rows: default compile runs torch._int_mm with the scaling fused (the op "
                                        "would add unfused kernels); it takes M below 17")]


@pytest.mark.slow  # 11 s: the fast tier's 5 minutes
def test_dynamic_m_is_decided_for_the_call_under_a_guard():
    """A symbolic M of 12 (2 x 6) becomes the op, guarded: a call of 24 rows recompiles and stays as written for
    default compile's fused scaling, and one of 6 rows (1 x 6, specialized: a third graph) takes the op again."""
    pytest.importorskip("torchao")
    model = torchao_model(True)
    with report.collecting() as records, torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=BACKEND)
        for batch in (2, 4, 1, 3):
            x = torch.randn(batch, 6, K, dtype=torch.bfloat16)
            if batch == 2:
                torch._dynamo.mark_dynamic(x, 0)
            close_to(compiled(x), model(x))
    assert [r.rewritten for r in records] == [True, False, True]  # 3 x 6 rows reused the second graph
    assert records[0].detail.startswith("fa4.int8_int8_linear(x[6*s")
    assert records[1].detail == ("24 rows (M symbolic: this compile's, under a guard): default compile runs "
                                 "torch._int_mm with the scaling fused (the op would add unfused kernels); it takes M "
                                 "below 17")
    assert records[2].detail == describe(6, True)


@pytest.mark.parametrize("backend, rewritten", [(fa4_inductor.backend(int8_int8_linear=False), False),
                                                 (fa4_inductor.fa4_inductor, True)],
                         ids=["option-off", "default-options"])
def test_the_family_is_on_by_default_and_off_when_asked(backend, rewritten):
    pytest.importorskip("torchao")
    model = torchao_model(False)
    x = torch.randn(2, K, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = Compiled(model, x, backend=backend)
    assert (OP_CALL in compiled.code) is rewritten
    assert [r.rewritten for r in compiled.records] == ([True] if rewritten else [])


@pytest.mark.parametrize("fn, reason", [
    pytest.param(lambda x, w, xs, ws: torch._int_mm(x, w.t()).float() * xs,
                 "the activation-scaled product goes to output, not a cast to the output dtype", id="no-output-cast"),
    pytest.param(lambda x, w, xs, ws: (torch._int_mm(x, w.t()).float() * xs).to(torch.bfloat16),
                 "the scaled product goes to output, not a multiplication by the weight's scale", id="no-weight-scale", marks=pytest.mark.slow),
    pytest.param(lambda x, w, xs, ws: (torch._int_mm(x, w.t()) * xs.to(torch.bfloat16)).to(torch.bfloat16) * ws,
                 "the int8 GEMM's int32 output is multiplied by a bfloat16 scale, not float32 (an order the op does "
                 "not compute)", id="bfloat16-activation-scale"),
    pytest.param(lambda x, w, xs, ws: (torch._int_mm(x, w.t()).float() * xs).to(torch.bfloat16) * ws[:8].sum(),
                 "the scaled product is multiplied by a float32 tensor of shape [], not a per-channel weight "
                 "scale [48]", id="per-tensor-weight-scale", marks=pytest.mark.slow),
    pytest.param(lambda x, w, xs, ws: (torch._int_mm(x, w.t()).float() * xs.T[:, :1].T).to(torch.bfloat16) * ws,
                 "the int8 GEMM's float32 output is multiplied by a float32 tensor of shape [1, 1], not a per-row "
                 "activation scale [5, 1]", id="not-per-row"),
])
def test_what_stays_as_written(fn, reason):
    x, xs, w, ws, _ = inputs()
    compiled = Compiled(fn, x, w, xs, ws, backend=BACKEND)
    assert OP_CALL not in compiled.code
    assert compiled.details == [(False, reason)]
    torch._dynamo.reset()
    torch.testing.assert_close(compiled.out, torch.compile(fn, backend="inductor")(x, w, xs, ws))


@pytest.mark.parametrize("fn", [
    lambda x, w, xs, ws: ((torch._int_mm(x, w.t()) * xs).to(torch.bfloat16) * ws).to(torch.bfloat16),
    lambda x, w, xs, ws: ((torch._int_mm(x, w.t()) * xs.expand(x.shape[0], w.shape[0])).to(torch.bfloat16)
                          * ws).to(torch.bfloat16),
], ids=["promoted", "promoted-expanded"])
def test_torch_2_11s_spelling_is_rewritten(fn):
    """torch 2.11's graph of torchao's config (read on the H200, docs/scripts/quant_graphs.py) multiplies the int32
    product by the float32 activation scale, broadcast by an explicit expand, without a cast first: the same
    arithmetic (the int32 values promote to float32)."""
    x, xs, w, ws, _ = inputs()
    compiled = Compiled(fn, x, w, xs, ws, backend=BACKEND)
    assert OP_CALL in compiled.code and compiled.details == [(True, describe(M, False))], compiled.details
    torch.testing.assert_close(compiled.out, fn(x, w, xs, ws), rtol=0, atol=0)


@contextlib.contextmanager
def as_on_cuda_with_a_mixed_input_kernel():
    """The family's choice on CUDA where `fa4::int8_linear` has a mixed-input kernel for the call, made on the CPU."""
    from fa4_inductor.kernels import int8_linear as int8_linear_op
    from fa4_inductor.lowering import int8_int8_linear as family

    with mock.patch.object(family, "SCALED_IN_GRAPH_DEVICES", ("cuda", "cpu")), \
            mock.patch.object(op, "weight_only_route", lambda x, w, s: int8_linear_op.W4A16):
        yield


@pytest.fixture
def scaled_in_graph_as_on_cuda():
    with as_on_cuda_with_a_mixed_input_kernel():
        yield


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("x_shape", [(1, K), (2, 3, K)], ids=str)
def test_where_int8_linear_has_a_kernel_the_graph_scales_its_result(scaled_in_graph_as_on_cuda, x_shape, bias):
    """`fa4::int8_linear` on the activation cast to bf16 (exact), its result scaled in the graph: within the bound of
    the op's own mixed-input path of the float64 product (`assert_within_int8_int8_bound`)."""
    compiled, expected = compiled_torchao_model(bias, x_shape)
    assert "torch.ops.fa4.int8_linear.default(" in compiled.code and OP_CALL not in compiled.code
    m = math.prod(x_shape[:-1])
    assert compiled.details == [(True, f"fa4.int8_linear(x[{m}x{K}] int8 as bfloat16, w[{N}x{K}] int8, w_scale[{N}] "
                                       f"float32) * x_scale[{m}x1] float32" + (f" + bias[{N}] bfloat16" if bias else "")
                                       + " as bfloat16: the cast and the scaling in the graph, for Inductor to fuse")]
    assert compiled.out.shape == expected.shape and compiled.out.dtype == torch.bfloat16
    close_to(compiled.out, expected)


def test_a_symbolic_m_keeps_the_op_which_decides_per_call(scaled_in_graph_as_on_cuda):
    pytest.importorskip("torchao")
    model = torchao_model(False)
    with report.collecting() as records, torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=BACKEND)
        x = torch.randn(2, 3, K, dtype=torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 0)
        close_to(compiled(x), model(x))
    assert [r.rewritten for r in records] == [True] and records[0].detail.startswith("fa4.int8_int8_linear(x[3*s")


class TestRewrittenGraphs(expecttest.TestCase):
    @staticmethod
    def rewritten_3d_with_bias() -> str:
        """The rewritten graph of torchao's module with a bias on a [2, 3, K] x, from the activation's quantized codes on."""
        pytest.importorskip("torchao")
        with torch.no_grad():
            compiled = Compiled(torchao_model(True), torch.randn(2, 3, K, dtype=torch.bfloat16), backend=BACKEND)
        lines = compiled.graphs[0].splitlines()
        quantized = next(i for i, line in enumerate(lines) if line.startswith("convert_element_type_4:"))
        shown = "\n".join(lines[quantized:])
        # x's float32 scale is torchao's cast on torch 2.13, lowering's own on 2.11 (which names it as it names the
        # casts it adds): named for what it is, and lowering's casts numbered in order, the graph reads the same
        scale = re.search(r"^view_8: f32\[6, 1\] = aten\.reshape\((\w+), ", shown, re.M).group(1)
        shown = re.sub(rf"\b{scale}\b", "x_scale_f32", shown)
        added = list(dict.fromkeys(re.findall(r"\bconvert_element_type_default(?:_\d+)?\b", shown)))
        renamed = {name: "convert_element_type_default" + (f"_{i}" if i else "") for i, name in enumerate(added)}
        return re.sub(r"\bconvert_element_type_default(?:_\d+)?\b", lambda m: renamed[m.group(0)], shown)

    def test_the_cast_and_the_scaling_in_the_graph(self):
        with as_on_cuda_with_a_mixed_input_kernel():
            graph = self.rewritten_3d_with_bias()
        self.assertExpectedInline(graph, """\
convert_element_type_4: torch.int8[2, 3, 64] = prims.convert_element_type(clamp_max, int8)
view_7: torch.int8[6, 64] = aten.reshape(convert_element_type_4, (-1, 64))
view_8: f32[6, 1] = aten.reshape(x_scale_f32, (-1, 1))
view_9: f32[48] = aten.reshape(arg1_1, (48))
convert_element_type_default: bf16[6, 64] = prims.convert_element_type(view_7, bfloat16)
int8_linear_default: bf16[6, 48] = fa4.int8_linear(convert_element_type_default, arg0_1, view_9)
mul_tensor: f32[6, 48] = aten.mul(int8_linear_default, view_8)
add_tensor: f32[6, 48] = aten.add(mul_tensor, arg3_1)
convert_element_type_default_1: bf16[6, 48] = prims.convert_element_type(add_tensor, bfloat16)
reshape_default: bf16[2, 3, 48] = aten.reshape(convert_element_type_default_1, (2, 3, 48))""")

    def test_torchao_x_3d_with_bias(self):
        self.assertExpectedInline(self.rewritten_3d_with_bias(), """\
convert_element_type_4: torch.int8[2, 3, 64] = prims.convert_element_type(clamp_max, int8)
view_7: torch.int8[6, 64] = aten.reshape(convert_element_type_4, (-1, 64))
view_8: f32[6, 1] = aten.reshape(x_scale_f32, (-1, 1))
view_9: f32[48] = aten.reshape(arg1_1, (48))
int8_int8_linear_default: bf16[6, 48] = fa4.int8_int8_linear(view_7, view_8, arg0_1, view_9, arg3_1, out_dtype=bfloat16)
reshape_default: bf16[2, 3, 48] = aten.reshape(int8_int8_linear_default, (2, 3, 48))""")


def test_a_frozen_shape_env_or_a_data_dependent_size_adds_no_guard():
    """Once Dynamo has built its guards (a backward compiled lazily after them), or for a data-dependent size, a
    symbolic M cannot be guarded: `guardable` says so, and the family then takes the op, which serves every M."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    from fa4_inductor.lowering.spellings import guardable, size_hint

    env = ShapeEnv()
    rows = env.create_symintnode(env.create_symbol(24, ConstantSource("m"), dynamic_dim=DimDynamic.DYNAMIC), hint=24)
    assert guardable(rows) and guardable(24) and size_hint(rows) == 24
    assert not guardable(rows, env.create_unbacked_symint())
    env.freeze()
    assert not guardable(rows) and guardable(24)
