"""`fa4::int8_sibling_linears` (kernels/int8_sibling_linears.py) and the grouping that emits it
(lowering/sibling_linears.py): int8 weight-only linears of one x as one op, outputs those of the separate calls."""

import expecttest
import pytest
import torch
import torch.nn as nn

import fa4_inductor
import upstream
from fa4_inductor.kernels import INT8_LINEAR, INT8_SIBLING_LINEARS
from fa4_inductor.kernels import int8_sibling_linears as siblings_op
from helpers import PostGradCompiled, SiblingLinearsBlock
from test_int8_linear import TOLERANCES, float64_reference

K = 64
ROWS = (48, 16, 16)  # q / k / v of a GQA layer
OP_LINE = "fa4.int8_sibling_linears("
BACKEND = fa4_inductor.backend(int8_linear=True)
APART = fa4_inductor.backend(int8_linear=True, sibling_linears=False)
pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # the graphs are captured in our pass


def weights(dtype, rows=ROWS, group_size=-1, seed=0):
    """Per weight (w_int8 [N, K], positive scales [N] or [N, K // group_size] of `dtype`), fresh random."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(-128, 128, (n, K), dtype=torch.int8, generator=g),
             (torch.rand((n,) if group_size == -1 else (n, K // group_size), generator=g) / 64 + 1e-3).to(dtype))
            for n in rows]


def op_args(ws, biases=None):
    return [w for w, _ in ws], [s for _, s in ws], biases or [None] * len(ws)


MODES = [pytest.param(-1, False, id="per-channel"), pytest.param(16, False, id="per-group"),
         pytest.param(-1, True, id="scale-after-matmul")]


@pytest.mark.parametrize("group_size, scale_after_matmul", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck(dtype, group_size, scale_after_matmul):
    ws = weights(dtype, group_size=group_size)
    biases = [torch.randn(ROWS[0], dtype=dtype), None, None]
    for x in (torch.randn(2, 3, K, dtype=dtype), torch.randn(K, 5, dtype=dtype).t()):
        torch.library.opcheck(INT8_SIBLING_LINEARS, (x, *op_args(ws, biases)),
                              {"group_size": group_size, "scale_after_matmul": scale_after_matmul})


@pytest.mark.parametrize("group_size, scale_after_matmul", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_each_output_is_its_linears_bit_for_bit_and_near_float64(dtype, group_size, scale_after_matmul):
    ws = weights(dtype, group_size=group_size, seed=3)
    biases = [None, torch.randn(ROWS[1], dtype=dtype), None]
    x = torch.randn(2, 3, K, dtype=dtype)
    flags = dict(group_size=group_size, scale_after_matmul=scale_after_matmul)
    outs = INT8_SIBLING_LINEARS(x, *op_args(ws, biases), **flags)
    for out, (w, scale), bias in zip(outs, ws, biases):
        assert torch.equal(out, INT8_LINEAR(x, w, scale, bias, **flags))
        expected = float64_reference(x, w, scale, bias, group_size)
        tol = TOLERANCES[dtype]
        torch.testing.assert_close(out.double(), expected, atol=tol * expected.abs().max().item(), rtol=tol)


def test_calls_it_cannot_take_are_errors():
    ws = weights(torch.float32)
    x = torch.randn(3, K)
    with pytest.raises(ValueError, match="takes 2..3 weights, got 1"):
        INT8_SIBLING_LINEARS(x, *op_args(ws[:1]))
    with pytest.raises(ValueError, match="one of each of scales, biases"):
        INT8_SIBLING_LINEARS(x, [w for w, _ in ws], [s for _, s in ws][:2], [None] * 3)


@pytest.fixture
def cuda_route(monkeypatch):
    """`_int8_sibling_linears_cuda` on CPU tensors, its kernels replaced by the reference: the one-launch GEMV records
    its calls, `fa4::int8_linear`'s CUDA path runs the reference."""
    calls = []

    def gemv_siblings(x2d, ws):
        calls.append(("one launch", tuple(x2d.shape), [w.shape[0] for w, _ in ws]))
        return [INT8_LINEAR(x2d, w, s) for w, s in ws]

    def one_by_one(x, w, s, bias=None, **flags):
        calls.append(("one by one", tuple(x.shape), w.shape[0]))
        return INT8_LINEAR(x, w, s, bias, **flags)

    monkeypatch.setattr(siblings_op.w4a16_decode, "int8_gemv_siblings", gemv_siblings)
    monkeypatch.setattr(siblings_op.int8_linear, "int8_linear_cuda", one_by_one)
    return calls


@pytest.mark.parametrize("one_launch", [True, False])
def test_the_cuda_path_runs_one_launch_where_the_gemv_takes_every_call(monkeypatch, cuda_route, one_launch):
    monkeypatch.setattr(siblings_op, "one_launch", lambda *a: one_launch)
    ws = weights(torch.bfloat16, seed=5)
    x = torch.randn(1, 1, K, dtype=torch.bfloat16)
    outs = siblings_op._int8_sibling_linears_cuda(x, *op_args(ws))
    for out, (w, s) in zip(outs, ws):
        assert torch.equal(out, INT8_LINEAR(x, w, s)) and out.shape == (1, 1, w.shape[0])
    expected = [("one launch", (1, K), list(ROWS))] if one_launch else [("one by one", (1, 1, K), n) for n in ROWS]
    assert cuda_route == expected


def test_one_launch_asks_each_call_its_route_and_takes_no_bias(monkeypatch):
    monkeypatch.setattr(siblings_op.int8_linear, "kernel_for", lambda *a, **k: (siblings_op.int8_linear.W4A16.name, ""))
    monkeypatch.setattr(siblings_op.w4a16_decode, "configured_gemv_rows", lambda: 1)
    ws = weights(torch.bfloat16)
    w, s, b = op_args(ws)
    x = torch.randn(1, K, dtype=torch.bfloat16)
    assert siblings_op.one_launch(x, w, s, b)
    assert not siblings_op.one_launch(torch.randn(2, K, dtype=torch.bfloat16), w, s, b)  # more rows than the GEMV's
    assert not siblings_op.one_launch(x, w, s, [None, torch.zeros(16, dtype=torch.bfloat16), None])
    assert not siblings_op.one_launch(x, w, [s[0].float(), *s[1:]], b)  # scales of two dtypes
    monkeypatch.setattr(siblings_op, "ONE_LAUNCH_MAX_ROWS", sum(ROWS) - 1)  # gate / up's sizes: measured slower
    assert not siblings_op.one_launch(x, w, s, b)
    monkeypatch.setattr(siblings_op.int8_linear, "kernel_for", lambda *a, **k: ("quack_int8", ""))
    assert not siblings_op.one_launch(x, w, s, b)


def Block(dtype):
    return SiblingLinearsBlock(lambda n, k: upstream.WeightOnlyInt8Linear.from_linear(nn.Linear(k, n), dtype), K, ROWS)


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.bfloat16], ids=str)
def test_a_layers_siblings_become_two_calls(dtype):
    block, x = Block(dtype), torch.randn(2, 3, K, dtype=dtype)
    with torch.no_grad():
        compiled = PostGradCompiled(block, x, backend=BACKEND)
        apart = PostGradCompiled(block, x, backend=APART)
        eager = block(x)
    torch.testing.assert_close(compiled.out, apart.out, atol=0, rtol=0)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(compiled.out, eager, atol=tol * eager.abs().max().item(), rtol=tol)
    assert [d for _, d in compiled.details if d.startswith(OP_LINE)] == [
        f"{OP_LINE}x[6x64], 3 weights: 48x64, 16x64, 16x64)", f"{OP_LINE}x[6x64], 2 weights: 128x64, 128x64)"]
    assert compiled.code.count("torch.ops.fa4.int8_sibling_linears.default(") == 2
    assert compiled.code.count("torch.ops.fa4.int8_linear.default(") == 1
    assert apart.code.count("torch.ops.fa4.int8_linear.default(") == 6 and "sibling" not in apart.code


class SplitReader(nn.Module):
    """Two linears of one x whose tensor is also split (a node whose value is a tuple), as DeepSeek V3's MLA splits
    its latent."""

    def __init__(self, dtype):
        super().__init__()
        self.a, self.b = (upstream.WeightOnlyInt8Linear.from_linear(nn.Linear(K, 32), dtype) for _ in range(2))

    def forward(self, x):
        h = x * 2
        lo, hi = h.split(K // 2, dim=-1)
        return self.a(h) + self.b(h) + (hi - lo)


def test_siblings_of_an_x_that_is_also_split():
    block, x = SplitReader(torch.bfloat16), torch.randn(2, 3, K, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = PostGradCompiled(block, x, backend=BACKEND)
        eager = block(x)
    assert [d for _, d in compiled.details if d.startswith(OP_LINE)] == [f"{OP_LINE}x[6x64], 2 weights: 32x64, 32x64)"]
    tol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(compiled.out, eager, atol=tol * eager.abs().max().item(), rtol=tol)


class TestRewrittenGraphs(expecttest.TestCase):
    def test_decode_step_of_a_layer(self):
        with torch.no_grad():
            compiled = PostGradCompiled(Block(torch.bfloat16), torch.randn(1, 1, K, dtype=torch.bfloat16),
                                        backend=BACKEND)
        ops = [line for line in "\n".join(compiled.graphs).splitlines() if "fa4." in line or "getitem" in line]
        self.assertExpectedInline("\n".join(ops), """\
int8_sibling_linears_default: (bf16[1, 48], bf16[1, 16], bf16[1, 16]) = fa4.int8_sibling_linears(view, (arg1_1, arg3_1, arg5_1), (arg2_1, arg4_1, arg6_1), (None, None, None), scale_after_matmul=True)
int8_linear_default_sibling: bf16[1, 48] = getitem(int8_sibling_linears_default, 0)
int8_linear_default_1_sibling: bf16[1, 16] = getitem(int8_sibling_linears_default, 1)
int8_linear_default_2_sibling: bf16[1, 16] = getitem(int8_sibling_linears_default, 2)
int8_sibling_linears_default_1: (bf16[1, 128], bf16[1, 128]) = fa4.int8_sibling_linears(view_7, (arg7_1, arg9_1), (arg8_1, arg10_1), (None, None), scale_after_matmul=True)
int8_linear_default_3_sibling: bf16[1, 128] = getitem(int8_sibling_linears_default_1, 0)
int8_linear_default_4_sibling: bf16[1, 128] = getitem(int8_sibling_linears_default_1, 1)
int8_linear_default_5: bf16[1, 64] = fa4.int8_linear(view_11, arg11_1, arg12_1, None, scale_after_matmul=True)""")
