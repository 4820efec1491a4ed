"""`fa4::nvfp4_sibling_linears` (kernels/nvfp4_sibling_linears.py) and the grouping that emits it
(lowering/sibling_linears.py): NVFP4 linears of one x as one op, outputs bit for bit those of the separate calls."""

import expecttest
import pytest
import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import nvfp4
from fa4_inductor.kernels import NVFP4_LINEAR, NVFP4_SIBLING_LINEARS
from fa4_inductor.kernels import nvfp4_sibling_linears as siblings_op
from helpers import PostGradCompiled, SiblingLinearsBlock
from test_nvfp4_linear import OPCHECK_TESTS, TOLERANCES, blocked, float64_dequantized, random_nvfp4

K = 64
ROWS = (48, 16, 16)  # q / k / v of a GQA layer
BACKEND = fa4_inductor.backend(nvfp4_linear=True, gated_linears=False)  # the siblings as they are (gated: its own file)
OP_LINE = "fa4.nvfp4_sibling_linears("
pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # the graphs are captured in our pass


def weights(rows=ROWS, k=K, seed=0):
    """Per weight (w_fp4, block, global_scale), fresh random."""
    return [random_nvfp4(n, k, seed=seed + i) for i, n in enumerate(rows)]


def op_args(ws, biases=None):
    return ([w[0] for w in ws], [w[1] for w in ws], [w[2] for w in ws], biases or [None] * len(ws))


@pytest.mark.parametrize("layout", ["rowmajor", "blocked"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_opcheck(with_bias, layout):
    ws = weights()
    if layout == "blocked":
        ws = [(w, blocked(b), g) for w, b, g in ws]
    biases = [torch.randn(ROWS[0]), None, torch.randn(ROWS[2])] if with_bias else None
    for x in (torch.randn(2, 3, K), torch.randn(K, 5).t()):
        torch.library.opcheck(NVFP4_SIBLING_LINEARS, (x, *op_args(ws, biases)), {"scale_layout": layout},
                              test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_each_output_is_its_linears_bit_for_bit_and_near_float64(dtype):
    ws = weights(seed=3)
    biases = [None, torch.randn(ROWS[1], dtype=dtype), None]
    x = torch.randn(2, 3, K, dtype=dtype)
    outs = NVFP4_SIBLING_LINEARS(x, *op_args(ws, biases))
    for out, w, bias in zip(outs, ws, biases):
        assert torch.equal(out, NVFP4_LINEAR(x, *w, bias))
        expected = x.double() @ float64_dequantized(*w).T + (0 if bias is None else bias.double())
        tol = TOLERANCES[dtype]
        torch.testing.assert_close(out.double(), expected, atol=tol * expected.abs().max().item(), rtol=tol)


@pytest.mark.parametrize("change, message", [
    (lambda ws, b: (ws[:1], b[:1]), "takes 2..3 weights, got 1"),
    (lambda ws, b: (ws * 2, b * 2), "takes 2..3 weights, got 6"),
    (lambda ws, b: (ws, b[:2]), "one of each of block scales, global scales, biases (or None) per weight"),
    (lambda ws, b: (ws[:2] + [random_nvfp4(16, 32)], b), "x has 64 features, the weight 32"),
])
def test_calls_it_cannot_take_are_errors(change, message):
    ws, biases = change(weights(), [None] * 3)
    with pytest.raises((ValueError, RuntimeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        NVFP4_SIBLING_LINEARS(torch.randn(3, K), [w[0] for w in ws], [w[1] for w in ws], [w[2] for w in ws], biases)


@pytest.fixture
def cuda_route(monkeypatch):
    """`_nvfp4_sibling_linears_cuda` on CPU tensors, its kernels replaced by the reference: the one-launch GEMV
    records its calls, `fa4::nvfp4_linear`'s CUDA path runs the reference."""
    calls = []

    def run_siblings(x2d, ws):
        calls.append(("one launch", x2d.shape, [w[0].shape[0] for w in ws]))
        return [NVFP4_LINEAR(x2d, *w) for w in ws]

    def one_by_one(x, *operands, scale_layout="rowmajor"):
        calls.append(("one by one", x.shape, operands[0].shape[0]))
        return NVFP4_LINEAR(x, *operands, scale_layout=scale_layout)

    monkeypatch.setattr(siblings_op.nvfp4_int_gemv, "run_siblings", run_siblings)
    monkeypatch.setattr(siblings_op.nvfp4_linear, "_nvfp4_linear_cuda", one_by_one)
    return calls


@pytest.mark.parametrize("one_launch", [True, False])
def test_the_cuda_path_runs_one_launch_where_the_gemv_takes_the_rows_together(monkeypatch, cuda_route, one_launch):
    monkeypatch.setattr(siblings_op, "one_launch", lambda x2d, w_fp4: one_launch)
    ws = weights(seed=5)
    biases = [torch.randn(ROWS[0]), None, torch.randn(ROWS[2])]
    x = torch.randn(1, 1, K)
    outs = siblings_op._nvfp4_sibling_linears_cuda(x, *op_args([(w, blocked(b), g) for w, b, g in ws], biases),
                                                    scale_layout="blocked")
    for out, w, bias in zip(outs, ws, biases):
        assert torch.equal(out, NVFP4_LINEAR(x, *w, bias)) and out.shape == (1, 1, w[0].shape[0])
    if one_launch:
        assert cuda_route == [("one launch", (1, K), list(ROWS))]
    else:
        assert cuda_route == [("one by one", (1, 1, K), n) for n in ROWS]


def test_one_launch_asks_the_integer_gemv_for_the_rows_together(monkeypatch):
    asked = []
    monkeypatch.setattr(siblings_op.nvfp4_linear, "kernel_for", lambda x2d, w: ("w4a16", ""))
    monkeypatch.setattr(siblings_op.w4a16_decode, "int_gemv_route", lambda x2d, n, k: asked.append((n, k)) or True)
    w_fp4 = [w[0] for w in weights()]
    assert siblings_op.one_launch(torch.randn(1, K), w_fp4) and asked == [(sum(ROWS), K)]
    monkeypatch.setattr(siblings_op.nvfp4_linear, "kernel_for", lambda x2d, w: ("quack", ""))
    assert not siblings_op.one_launch(torch.randn(1, K), w_fp4)


def Block(dtype, bias=False):
    def linear(n, k):
        return nvfp4.NVFP4Linear.from_linear(nn.Linear(k, n, bias=bias).to(dtype))

    return SiblingLinearsBlock(linear, K, ROWS)


def compiled_block(dtype, x, backend=BACKEND, bias=False):
    block = Block(dtype, bias)
    with torch.no_grad():
        return block, PostGradCompiled(block, x, backend=backend)


APART = fa4_inductor.backend(nvfp4_linear=True, sibling_linears=False)


def check_outputs(block, compiled, x, dtype):
    """Bit for bit the compiled block's without the grouping (Inductor's code around the linears may round otherwise
    than eager), and near eager."""
    with torch.no_grad():
        torch.testing.assert_close(compiled.out, PostGradCompiled(block, x, backend=APART).out, atol=0, rtol=0)
        eager = block(x)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(compiled.out, eager, atol=tol * eager.abs().max().item(), rtol=tol)


@pytest.mark.parametrize("dtype, bias", [
    pytest.param(dtype, bias, id=f"{dtype}-{'bias' if bias else 'no-bias'}",
                 marks=[] if (dtype, bias) == (torch.bfloat16, True) else [pytest.mark.slow])  # one in the fast tier
    for dtype in (torch.float32, torch.bfloat16) for bias in (False, True)])
def test_a_layers_siblings_become_two_calls(dtype, bias):
    x = torch.randn(2, 3, K, dtype=dtype)
    block, compiled = compiled_block(dtype, x, bias=bias)
    check_outputs(block, compiled, x, dtype)
    groups = [d for rewritten, d in compiled.details if d.startswith(OP_LINE)]
    assert groups == [f"{OP_LINE}x[6x64], 3 weights: 48x32, 16x32, 16x32)",
                      f"{OP_LINE}x[6x64], 2 weights: 128x32, 128x32)"]
    assert compiled.code.count("torch.ops.fa4.nvfp4_sibling_linears.default(") == 2
    assert compiled.code.count("torch.ops.fa4.nvfp4_linear.default(") == 1  # down


def test_the_option_off_keeps_the_calls_apart():
    x = torch.randn(1, 1, K, dtype=torch.bfloat16)
    _, compiled = compiled_block(torch.bfloat16, x, APART)
    assert "nvfp4_sibling_linears" not in compiled.code
    assert compiled.code.count("torch.ops.fa4.nvfp4_linear.default(") == 6


@pytest.mark.slow
def test_a_dynamic_batch_keeps_the_grouping():
    x = torch.randn(4, 3, K, dtype=torch.bfloat16)
    torch._dynamo.mark_dynamic(x, 0)
    block, compiled = compiled_block(torch.bfloat16, x)
    assert compiled.code.count("torch.ops.fa4.nvfp4_sibling_linears.default(") == 2
    check_outputs(block, compiled, x, torch.bfloat16)


class TestRewrittenGraphs(expecttest.TestCase):
    def test_decode_step_of_a_layer(self):
        _, compiled = compiled_block(torch.bfloat16, torch.randn(1, 1, K, dtype=torch.bfloat16))
        ops = [line for line in "\n".join(compiled.graphs).splitlines() if "fa4." in line or "getitem" in line]
        self.assertExpectedInline("\n".join(ops), """\
nvfp4_sibling_linears_default: (bf16[1, 48], bf16[1, 16], bf16[1, 16]) = fa4.nvfp4_sibling_linears(view_3, (arg3_1, arg6_1, arg9_1), (arg2_1, arg5_1, arg8_1), (arg1_1, arg4_1, arg7_1), (None, None, None))
nvfp4_linear_default_sibling: bf16[1, 48] = getitem(nvfp4_sibling_linears_default, 0)
nvfp4_linear_default_1_sibling: bf16[1, 16] = getitem(nvfp4_sibling_linears_default, 1)
nvfp4_linear_default_2_sibling: bf16[1, 16] = getitem(nvfp4_sibling_linears_default, 2)
nvfp4_sibling_linears_default_1: (bf16[1, 128], bf16[1, 128]) = fa4.nvfp4_sibling_linears(view_19, (arg12_1, arg15_1), (arg11_1, arg14_1), (arg10_1, arg13_1), (None, None))
nvfp4_linear_default_3_sibling: bf16[1, 128] = getitem(nvfp4_sibling_linears_default_1, 0)
nvfp4_linear_default_4_sibling: bf16[1, 128] = getitem(nvfp4_sibling_linears_default_1, 1)
nvfp4_linear_default_5: bf16[1, 64] = fa4.nvfp4_linear(view_29, arg18_1, arg17_1, arg16_1, None)""")


def test_torchao_weights_group_with_their_stored_scales():
    """torchao's `NVFP4WeightOnlyConfig` on every projection: each call reads its weight's stored (blocked) scales,
    and the q / k / v and gate / up calls group with `scale_layout="blocked"`; outputs bit for bit the grouping off."""
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig
    from torchao.quantization import quantize_

    block = SiblingLinearsBlock(lambda n, k: nn.Linear(k, n, bias=False), K, ROWS).to(torch.bfloat16)
    quantize_(block.requires_grad_(False), NVFP4WeightOnlyConfig(use_dynamic_per_tensor_scale=True))
    x = torch.randn(1, 1, K, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = PostGradCompiled(block, x, backend=BACKEND)
        apart = PostGradCompiled(block, x, backend=APART)
    torch.testing.assert_close(compiled.out, apart.out, atol=0, rtol=0)
    calls = [line for line in compiled.graphs[0].splitlines() if OP_LINE in line]
    assert len(calls) == 2 and all(line.endswith("scale_layout='blocked')") for line in calls), calls
    assert compiled.code.count("torch.ops.fa4.nvfp4_linear.default(") == 1
