"""`fa4::int8_linear` (kernels/int8_linear.py) and the int8_linear family, which emits it on Inductor's aten
graphs (lowering/int8_linear.py), through the real backend."""

import math

import expecttest
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fa4_inductor
import upstream
from helpers import PostGradCompiled, compiled_one_row_decomposed, from_torchao_hints, one_row_matmuls_decomposed
from fa4_inductor.kernels import INT8_LINEAR, int8_linear_unsupported_reason

pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # conftest.py: a cache hit skips the passes

N, K, GROUP = 48, 64, 16
OP_CALL = "torch.ops.fa4.int8_linear.default("


def quantized(dtype, group_size=-1, seed=0):
    """A random int8 weight [N, K] and positive scales [N] or [N, K // group_size] of `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=generator)
    scale_shape = (N,) if group_size == -1 else (N, K // group_size)
    return w, (torch.rand(scale_shape, generator=generator) / 64 + 1e-3).to(dtype)


# ------------------------------------------------------------------------------------------------------ the op

MODES = [pytest.param(-1, False, id="per-channel"), pytest.param(GROUP, False, id="per-group"),
         pytest.param(-1, True, id="scale-after-matmul")]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("group_size, scale_after_matmul", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype, group_size, scale_after_matmul, with_bias):
    w, scale = quantized(dtype, group_size)
    bias = torch.randn(N, dtype=dtype) if with_bias else None
    for x in (torch.randn(2, 3, K, dtype=dtype), torch.randn(K, 5, dtype=dtype).t()):
        torch.library.opcheck(INT8_LINEAR, (x, w, scale, bias),
                              {"group_size": group_size, "scale_after_matmul": scale_after_matmul})


def float64_reference(x, w, scale, bias, group_size):
    n, k = w.shape
    group = k if group_size == -1 else group_size
    dequantized = (w.double().view(n, k // group, group) * scale.double().view(n, -1, 1)).view(n, k)
    out = x.double() @ dequantized.T
    return out if bias is None else out + bias.double()


TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}  # relative to the output's scale


@pytest.mark.parametrize("group_size, scale_after_matmul", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_numerics_against_float64(dtype, group_size, scale_after_matmul):
    torch.manual_seed(1)
    w, scale = quantized(dtype, group_size, seed=2)
    x, bias = torch.randn(4, 7, K, dtype=dtype), torch.randn(N, dtype=dtype)
    out = INT8_LINEAR(x, w, scale, bias, group_size=group_size, scale_after_matmul=scale_after_matmul)
    assert out.dtype == dtype and out.shape == (4, 7, N) and out.is_contiguous()
    expected, tol = float64_reference(x, w, scale, bias, group_size), TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol * expected.abs().max().item(), rtol=tol)


def test_float32_scales_dequantize_in_float32_then_round_once():
    """With a float32 scale the op computes `(w.float() * scale).to(x.dtype)`, as the model code does."""
    w, scale = quantized(torch.float32)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    expected = F.linear(x, (w.float() * scale[:, None]).to(torch.bfloat16))
    assert torch.equal(INT8_LINEAR(x, w, scale), expected)


@pytest.mark.parametrize("change, message", [
    (dict(w=torch.zeros(N, K)), "2-D int8 weight"),
    (dict(x=torch.randn(3, K, dtype=torch.float64)), "x dtype float64 is not supported"),
    (dict(scale=torch.ones(N, 2)), r"w_scale has shape \[48, 2\], wants \[48\]"),
    (dict(group_size=24), "group_size 24 does not divide the 64 input features"),
    (dict(group_size=GROUP, scale_after_matmul=True, scale=torch.ones(N, K // GROUP)), "per group cannot"),
    (dict(scale_after_matmul=True, scale=torch.ones(N, dtype=torch.bfloat16)), "must have x's dtype float32"),
    (dict(bias=torch.zeros(N, dtype=torch.bfloat16)), "bias of x's dtype float32"),
    (dict(x=torch.randn(3, K + 1)), "x has 65 features, the weight 64"),
])
def test_inputs_the_op_cannot_take_are_errors(change, message):
    w, scale = quantized(torch.float32)
    args = dict(x=torch.randn(3, K), w=w, scale=scale, bias=None, group_size=-1, scale_after_matmul=False) | change
    with pytest.raises((ValueError, RuntimeError), match=message):
        INT8_LINEAR(args["x"], args["w"], args["scale"], args["bias"], group_size=args["group_size"],
                    scale_after_matmul=args["scale_after_matmul"])


def test_unsupported_reason():
    assert int8_linear_unsupported_reason("cuda", torch.bfloat16, torch.bfloat16, K) is None
    assert int8_linear_unsupported_reason("cpu", torch.float16, torch.float32, K, GROUP) is None
    assert int8_linear_unsupported_reason("mps", torch.float16, torch.float16, K) == \
        "device mps has no fa4 int8_linear kernel"
    assert int8_linear_unsupported_reason("cpu", torch.bfloat16, torch.float32, K, scale_after_matmul=True) == \
        "a scale applied after the matmul must have x's dtype bfloat16, not float32 (it would promote the output)"


# -------------------------------------------------------------------------------------- the family, compiled


def compile_with_int8(fn, *args, backend=fa4_inductor.backend(int8_linear=True)) -> PostGradCompiled:
    return PostGradCompiled(fn, *args, backend=backend)


def gpt_fast_linear(dtype):
    torch.manual_seed(0)
    return upstream.WeightOnlyInt8Linear.from_linear(nn.Linear(K, N), dtype)


@pytest.mark.parametrize("x_shape", [(5, K), (2, 3, K)], ids=["x-2d", "x-3d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpt_fast_weight_only_int8_linear(dtype, x_shape):
    linear = gpt_fast_linear(dtype)
    x = torch.randn(x_shape, dtype=dtype)
    compiled = compile_with_int8(linear, x)
    assert OP_CALL in compiled.code
    torch.testing.assert_close(compiled.out, linear(x), atol=0, rtol=0)  # the same arithmetic, in the same order
    m = x_shape[0] * (x_shape[1] if len(x_shape) == 3 else 1)
    dtype_name = str(dtype).removeprefix("torch.")
    assert compiled.details == [(True, f"fa4.int8_linear(x[{m}x{K}] {dtype_name}, w[{N}x{K}] int8, "
                                       f"scale[{N}] {dtype_name}, scale_after_matmul=True)")]


def test_gpt_fast_with_a_dynamic_batch():
    linear = gpt_fast_linear(torch.bfloat16)
    x = torch.randn(4, 3, K, dtype=torch.bfloat16)
    torch._dynamo.mark_dynamic(x, 0)
    compiled = compile_with_int8(linear, x)
    assert OP_CALL in compiled.code
    torch.testing.assert_close(compiled.out, linear(x), atol=0, rtol=0)
    assert [rewritten for rewritten, _ in compiled.details] == [True]


class DequantizedLinear(nn.Module):
    """User code that dequantizes an int8 weight buffer with `dequantize(w, scale, dtype)`, then `F.linear`."""

    def __init__(self, dequantize, dtype, scale_dtype=None, group_size=-1, bias=False):
        super().__init__()
        w, scale = quantized(scale_dtype or dtype, group_size)
        self.register_buffer("weight", w)
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(torch.randn(N, dtype=dtype), requires_grad=False) if bias else None
        self.dequantize = dequantize

    def forward(self, x):
        return F.linear(x, self.dequantize(self.weight, self.scale, x.dtype), self.bias)


SPELLINGS = {
    "per-channel [:, None] with bias": (lambda w, s, dtype: w.to(dtype) * s[:, None], {"bias": True}),
    "per-channel view(-1, 1)": (lambda w, s, dtype: w.to(dtype) * s.view(-1, 1), {}),
    "per-channel in float32": (lambda w, s, dtype: (w.float() * s[:, None]).to(dtype), {"scale_dtype": torch.float32}),
    "per-group view, cast, view back": (
        lambda w, s, dtype: (w.view(N, K // GROUP, GROUP).to(dtype) * s[..., None]).view(N, K), {"group_size": GROUP}),
    "per-group cast, view, flatten": (
        lambda w, s, dtype: (w.to(dtype).view(N, -1, GROUP) * s.unsqueeze(-1)).flatten(1), {"group_size": GROUP}),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_plain_dequantize_then_linear(dtype, spelling):
    dequantize, kwargs = SPELLINGS[spelling]
    linear = DequantizedLinear(dequantize, dtype, **kwargs)
    x = torch.randn(2, 3, K, dtype=dtype)
    compiled = compile_with_int8(linear, x)
    assert OP_CALL in compiled.code
    torch.testing.assert_close(compiled.out, linear(x), atol=0, rtol=0)
    assert [rewritten for rewritten, _ in compiled.details] == [True]


class TestRewrittenGraphs(expecttest.TestCase):
    def test_gpt_fast_x_3d(self):
        compiled = compile_with_int8(gpt_fast_linear(torch.bfloat16), torch.randn(2, 3, K, dtype=torch.bfloat16))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
view: bf16[6, 64] = aten.reshape(arg1_1, (6, 64))
int8_linear_default: bf16[6, 48] = fa4.int8_linear(view, arg0_1, arg2_1, None, scale_after_matmul=True)
reshape_default: bf16[2, 3, 48] = aten.reshape(int8_linear_default, (2, 3, 48))""")

    def test_gpt_fast_one_row_decomposed_by_inductor(self):
        with one_row_matmuls_decomposed():
            compiled = compile_with_int8(gpt_fast_linear(torch.bfloat16), torch.randn(1, K, dtype=torch.bfloat16))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
int8_linear_default: bf16[1, 48] = fa4.int8_linear(arg1_1, arg0_1, arg2_1, None, scale_after_matmul=True)""")

    def test_per_group_with_bias(self):
        dequantize, _ = SPELLINGS["per-group view, cast, view back"]
        linear = DequantizedLinear(dequantize, torch.bfloat16, group_size=GROUP, bias=True)
        compiled = compile_with_int8(linear, torch.randn(2, 3, K, dtype=torch.bfloat16))
        self.assertExpectedInline("\n".join(compiled.graphs), """\
view_2: bf16[6, 64] = aten.reshape(arg2_1, (6, 64))
int8_linear_default: bf16[6, 48] = fa4.int8_linear(view_2, arg0_1, arg1_1, arg3_1, group_size=16)
view_3: bf16[2, 3, 48] = aten.reshape(int8_linear_default, (2, 3, 48))""")


@pytest.mark.slow
@pytest.mark.parametrize("recompute", [True, False])
def test_training_rewrites_unless_the_dequantized_weight_is_saved(recompute):
    """The backward reads the dequantized weight: by default it computes it again (lowering/joint_graph.py) and
    the forward's linear is rewritten; with `recompute_dequantized_weights=False` the forward saves it, and the
    linear stays as written, with that reason."""
    linear = gpt_fast_linear(torch.float32)
    x = torch.randn(2, 3, K, requires_grad=True)
    compiled = compile_with_int8(linear, x, backend=fa4_inductor.backend(int8_linear=True,
                                                                         recompute_dequantized_weights=recompute))
    if recompute:
        assert OP_CALL in compiled.code and [rewritten for rewritten, _ in compiled.details] == [True]
    else:
        assert OP_CALL not in compiled.code
        assert compiled.details == [(False, "the dequantized weight (convert_element_type) is also read by output, "
                                            "a graph output (a training forward saves it for the backward)")]
    expected = linear(x)
    torch.testing.assert_close(compiled.out, expected, atol=1e-2 * expected.abs().max().item(), rtol=1e-2)  # bf16 mm
    torch.testing.assert_close(torch.autograd.grad(compiled.out.sum(), x), torch.autograd.grad(expected.sum(), x))


@pytest.mark.parametrize("fn, scale, reason", [
    pytest.param(lambda x, w, s: F.linear(x, w.to(x.dtype)) * s, torch.rand(N),
                 "a scale applied after the matmul must have x's dtype bfloat16, not float32 (it would promote the "
                 "output)", id="float32-scales-after-a-bfloat16-matmul"),
    pytest.param(lambda x, w, s: F.linear(x, w.to(x.dtype) * s), torch.rand(K, dtype=torch.bfloat16),
                 "the int8 weight viewed as [48, 64] is multiplied by a bfloat16 tensor of shape [64]: not a scale per "
                 "output channel or per group", id="per-input-channel-scales"),
    pytest.param(lambda x, w, s: F.linear(x, (w.half() * s.half()[:, None]).to(x.dtype)),
                 torch.rand(N, dtype=torch.bfloat16), "the weight is dequantized through float16 for a bfloat16 x, "
                 "which rounds differently from the op", id="dequantized-in-float16"),
])
def test_what_stays_as_written(fn, scale, reason):
    w, _ = quantized(torch.bfloat16)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    compiled = compile_with_int8(fn, x, w, scale)
    assert OP_CALL not in compiled.code
    torch._dynamo.reset()
    assert torch.equal(compiled.out, torch.compile(fn, backend="inductor")(x, w, scale))  # what Inductor alone gives
    assert compiled.details == [(False, reason)]


@pytest.mark.parametrize("backend, rewritten", [(fa4_inductor.backend(int8_linear=False), False),
                                                (fa4_inductor.fa4_inductor, True)],
                         ids=["option-off", "default-options"])
def test_the_family_is_on_by_default_and_has_an_off_switch(backend, rewritten):
    """On by default (options.py gives the H200 measurements), off with `int8_linear=False`."""
    linear = gpt_fast_linear(torch.bfloat16)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    compiled = compile_with_int8(linear, x, backend=backend)
    assert (OP_CALL in compiled.code) == rewritten and len(compiled.records) == int(rewritten)
    torch.testing.assert_close(compiled.out, linear(x))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("x_shape", [(5, K), pytest.param((2, 3, K), marks=pytest.mark.slow)], ids=["x-2d", "x-3d"])
def test_torchao_int8_weight_only_config(x_shape, bias):
    """torchao's `Int8WeightOnlyConfig` (an `Int8Tensor` weight): transposed, cast, multiplied by its float32
    scale cast to x's dtype, the bias added after; the op takes the matmul and the scale, the add stays."""
    torchao = pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(K, N, bias=bias)).to(torch.bfloat16).requires_grad_(False)
    quantize_(model, Int8WeightOnlyConfig())
    x = torch.randn(x_shape, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = compile_with_int8(model, x)
        expected = model(x)
    assert OP_CALL in compiled.code, torchao.__version__
    torch.testing.assert_close(compiled.out, expected, atol=0, rtol=0)  # eager's roundings, in eager's order
    assert [r.detail for r in compiled.records] == [
        f"fa4.int8_linear(x[{'x'.join(map(str, (math.prod(x_shape[:-1]), K)))}] bfloat16, w[{N}x{K}] int8, "
        f"scale[{N}] bfloat16, scale_after_matmul=True)"]


def torchao_int8_model(bias: bool):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(K, N, bias=bias)).to(torch.bfloat16).requires_grad_(False)
    quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False))  # leaves Inductor's config as it is
    return model


@pytest.mark.parametrize("source", ["torchao", "gpt-fast", "dequantize in float32"])
def test_one_row_matmuls_inductor_decomposed_are_rewritten(source):
    """With `coordinate_descent_tuning` (torchao turns it on) Inductor has made a one-row matmul a multiply and a
    sum in float32 before our stage; the family sees the matmul again (lowering/gemv.py): same arithmetic."""
    if source == "torchao":
        pytest.importorskip("torchao")
        linear, scale_dtype, after = torchao_int8_model(bias=True), "bfloat16", ", scale_after_matmul=True"
    elif source == "gpt-fast":
        linear, scale_dtype, after = gpt_fast_linear(torch.bfloat16), "bfloat16", ", scale_after_matmul=True"
    else:
        linear = DequantizedLinear(SPELLINGS["per-channel in float32"][0], torch.bfloat16, torch.float32)
        scale_dtype, after = "float32", ""
    x = torch.randn(1, 1, K, dtype=torch.bfloat16)
    compiled, expected = compiled_one_row_decomposed(linear, x, fa4_inductor.backend(int8_linear=True),
                                                     fa4_inductor.backend(int8_linear=False), OP_CALL)
    assert compiled.details == [(True, f"fa4.int8_linear(x[1x{K}] bfloat16, w[{N}x{K}] int8, scale[{N}] "
                                       f"{scale_dtype}{after})")]
    reference = linear[0] if source == "torchao" else linear
    w = reference.weight
    dequantized = w.dequantize().double() if source == "torchao" else None
    if dequantized is not None:  # against float64: within a bf16 rounding of the output
        out64 = x.double() @ dequantized.T + reference.bias.double()
        torch.testing.assert_close(compiled.out.double(), out64, atol=1e-2 * out64.abs().max().item(), rtol=1e-2)
    torch.testing.assert_close(compiled.out, expected, atol=0, rtol=0)  # a matmul's roundings, as eager's


def test_one_row_int8_cast_folded_into_the_widening_is_rewritten():
    """torch 2.11 on CUDA hands our stage torchao's one-row linear with `convert(convert(w.T, bf16), f32)` folded into
    `convert(w.T, f32)` (seen on the H200, docs/benchmarks.md session 12): written out here as that graph."""
    w, _ = quantized(torch.bfloat16)
    scale, bias = torch.rand(N, 1) / 64 + 1e-3, torch.randn(N, dtype=torch.bfloat16)

    def folded(x, w, scale, bias):
        total = (x.float().unsqueeze(2) * w.t().float().unsqueeze(0)).sum(dim=1)
        return total.to(x.dtype) * scale.to(x.dtype).reshape(N) + bias

    x = torch.randn(1, K, dtype=torch.bfloat16)
    compiled = compile_with_int8(folded, x, w, scale, bias)
    assert compiled.details == [(True, f"fa4.int8_linear(x[1x{K}] bfloat16, w[{N}x{K}] int8, scale[{N}] bfloat16, "
                                       "scale_after_matmul=True)")]
    assert "aten.sum(" not in compiled.graphs[0]
    out64 = x.double() @ (w.double() * scale.double()).T + bias.double()  # within the bf16 roundings of scale and out
    torch.testing.assert_close(compiled.out.double(), out64, atol=1e-2 * out64.abs().max().item(), rtol=1e-2)


def test_a_declined_one_row_matmul_keeps_inductor_decomposition():
    """Declined (a float32 scale after a bf16 matmul would promote the output): the multiply and sum are put
    back as they were, the graph computes what it did."""
    linear = upstream.WeightOnlyInt8Linear.from_linear(nn.Linear(K, N), torch.bfloat16)
    linear.scales = linear.scales.float()
    x = torch.randn(1, K, dtype=torch.bfloat16)
    with one_row_matmuls_decomposed(), torch.no_grad():
        compiled = compile_with_int8(linear, x)
        plain = PostGradCompiled(linear, x, backend=fa4_inductor.backend(int8_linear=False))
        expected = linear(x)
    assert compiled.details == [(False, "a scale applied after the matmul must have x's dtype bfloat16, not float32 "
                                        "(it would promote the output)")]
    ops = lambda graph: sorted(line.split(" = ", 1)[1].split("(")[0] for line in graph.splitlines())  # noqa: E731
    assert ops(compiled.graphs[0]) == ops(plain.graphs[0]) and "aten.sum(" in compiled.graphs[0]
    torch.testing.assert_close(compiled.out, plain.out, atol=0, rtol=0)  # Inductor's code for it, as without us
    torch.testing.assert_close(compiled.out, expected, atol=1e-2 * expected.abs().max().item(), rtol=1e-2)  # bf16 mm


@pytest.mark.parametrize("inductor_gemvs", [True, False])
def test_one_row_matmul_left_to_inductor_gemv_where_it_measured_faster(monkeypatch, inductor_gemvs):
    """Where `gemv_reason` says Inductor's fused GEMV is faster for the weight's shape (a CUDA rule: forced here), the
    decomposition stays with that reason; `inductor_gemvs=False` sends it to the op all the same."""
    from fa4_inductor.lowering import int8_linear as family

    monkeypatch.setattr(family, "int8_linear_gemv_reason", lambda device, n, k: f"GEMV faster for [{n}, {k}]")
    linear = gpt_fast_linear(torch.bfloat16)
    x = torch.randn(1, K, dtype=torch.bfloat16)
    with one_row_matmuls_decomposed(), torch.no_grad():
        compiled = compile_with_int8(linear, x, backend=fa4_inductor.backend(inductor_gemvs=inductor_gemvs))
        expected = linear(x)
    if inductor_gemvs:
        assert compiled.details == [(False, f"GEMV faster for [{N}, {K}]")] and "aten.sum(" in compiled.graphs[0]
    else:
        assert [rewritten for rewritten, _ in compiled.details] == [True] and OP_CALL in compiled.code
    torch.testing.assert_close(compiled.out, expected, atol=1e-2 * expected.abs().max().item(), rtol=1e-2)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_from_torchao_keeps_the_weights_bit_for_bit_as_plain_buffers(bias):
    """`int8.from_torchao` turns torchao's int8 weight-only linears into `Int8Linear` layers: the same outputs bit for
    bit (eager, 2-D and 3-D x), no tensor subclass left, dynamic-activation weights left as they are; compiled with
    the backend, each one runs the op, with the same outputs as torchao's weights under the backend."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    from fa4_inductor import int8

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(K, N, bias=bias), nn.ReLU(), nn.Linear(N, N)).to(torch.bfloat16)
    model.requires_grad_(False)
    quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False), filter_fn=lambda m, fqn: fqn == "0")
    quantize_(model, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False),
              filter_fn=lambda m, fqn: fqn == "2")
    xs = [torch.randn(5, K, dtype=torch.bfloat16), torch.randn(2, 3, K, dtype=torch.bfloat16)]
    with torch.no_grad():
        before = [model(x) for x in xs]
        under_backend = compile_with_int8(model[0], xs[0]).out
    w = model[0].weight
    codes, scale = w.qdata.clone(), w.scale.clone()
    assert int8.from_torchao(model) == ["0"]
    layer = model[0]
    assert isinstance(layer, int8.Int8Linear) and type(model[2].weight).__name__ == "Int8Tensor"
    assert not int8.is_torchao_int8_weight_only(model[2].weight)
    assert torch.equal(layer.weight, codes) and torch.equal(layer.scale, scale.flatten().to(torch.bfloat16))
    with torch.no_grad():
        for x, expected in zip(xs, before):
            torch.testing.assert_close(model(x), expected, atol=0, rtol=0)
        compiled = compile_with_int8(layer, xs[0])
    assert compiled.code.count(OP_CALL) == 1
    torch.testing.assert_close(compiled.out, under_backend, atol=0, rtol=0)
    out64 = xs[0].double() @ (codes.double() * scale.double()).T + (layer.bias.double() if bias else 0)
    torch.testing.assert_close(compiled.out.double(), out64, atol=1e-2 * out64.abs().max().item(), rtol=1e-2)


def test_compiling_torchao_int8_weights_hints_at_from_torchao(monkeypatch):
    """torchao int8 weight-only weights reach the graph as tensor subclasses: the backend names `int8.from_torchao`,
    at INFO where they are compiled as their inner tensors (the default), as a WARNING where they are not."""
    pytest.importorskip("torchao")
    model, x = torchao_int8_model(bias=False), torch.randn(2, K, dtype=torch.bfloat16)
    for options, level, says in (({}, "INFO", "compiled as their inner tensors"),
                                 ({"subclass_weights": False}, "WARNING", "each unwrapped by AOTAutograd")):
        hints = from_torchao_hints(monkeypatch, model, x, **options)
        assert len(hints) == 1 and hints[0][0] == level, hints
        message = hints[0][1]
        assert message.startswith("1 torchao int8 weights reach this graph") and says in message and \
            "`fa4_inductor.int8.from_torchao(model)`" in message, message


def test_explain_reports_the_post_grad_family():
    """`explain` runs no Inductor, but a graph with int8 inputs goes through AOTAutograd so that the POST_GRAD
    families report on it (backend.rewrite_only)."""
    linear = gpt_fast_linear(torch.bfloat16)
    report = fa4_inductor.explain(linear, torch.randn(5, K, dtype=torch.bfloat16))
    assert [(r.family, r.rewritten) for r in report.records] == [("int8_linear", True)], report.records
