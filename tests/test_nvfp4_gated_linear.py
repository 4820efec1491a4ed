"""`fa4::nvfp4_gated_linear` (kernels/nvfp4_gated_linear.py) and the rewrite that emits it
(lowering/gated_linears.py): act(x @ gate^T) * (x @ up^T) of two NVFP4 linears as one op (act SiLU or tanh-GELU),
bit for bit the separate ops' outputs put through the activation and the product in x's dtype. The kernel's
numerics: `test_gpu_w4a16.py -k gated`."""

import expecttest
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fa4_inductor
from fa4_inductor import nvfp4
from fa4_inductor.kernels import NVFP4_GATED_LINEAR, NVFP4_LINEAR
from fa4_inductor.kernels import nvfp4_gated_linear as gated_op
from fa4_inductor.report import collecting
from helpers import PostGradCompiled, tiny
from test_nvfp4_linear import OPCHECK_TESTS, blocked, float64_dequantized, random_nvfp4

K, N = 64, 128
GATED = fa4_inductor.backend(nvfp4_linear=True)  # gated_linears is on by default
pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # the graphs are captured in our pass


def weights(n=N, k=K, seed=0):
    """(gate, up), each (w_fp4, block, global_scale), fresh random."""
    return random_nvfp4(n, k, seed=seed), random_nvfp4(n, k, seed=seed + 1)


def op_args(gate, up):
    return [gate[0], up[0]], [gate[1], up[1]], [gate[2], up[2]]


ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("layout", ["rowmajor", "blocked"])
def test_opcheck(layout, activation):
    gate, up = weights()
    if layout == "blocked":
        gate, up = ((w, blocked(b), g) for w, b, g in (gate, up))
    for x in (torch.randn(2, 3, K), torch.randn(K, 5).t(), torch.randn(1, K, dtype=torch.bfloat16)):
        torch.library.opcheck(NVFP4_GATED_LINEAR, (x, *op_args(gate, up)),
                              {"scale_layout": layout, "activation": activation}, test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_the_separate_ops_activation_and_product_bit_for_bit_and_near_float64(dtype, activation):
    gate, up = weights(seed=3)
    x = torch.randn(2, 3, K, dtype=dtype)
    act = ACTIVATIONS[activation]
    out = NVFP4_GATED_LINEAR(x, *op_args(gate, up), activation=activation)
    assert torch.equal(out, act(NVFP4_LINEAR(x, *gate)) * NVFP4_LINEAR(x, *up))
    g64, u64 = (x.double() @ float64_dequantized(*w).T for w in (gate, up))
    expected = act(g64) * u64
    tol = {torch.float32: 1e-5, torch.bfloat16: 3 * 2 ** -8, torch.float16: 3 * 2 ** -11}[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol * expected.abs().max().item(), rtol=tol)


def test_the_op_and_the_kernel_name_the_same_activations():
    from fa4_inductor.kernels.cute import nvfp4_int_gemv as kern

    assert sorted(gated_op.ACTIVATIONS) == sorted(kern.ACTIVATIONS) == sorted(ACTIVATIONS)


@pytest.mark.parametrize("change, message", [
    (lambda g, u: ([g[0]], [g[1]], [g[2]]), "takes two weights"),
    (lambda g, u: op_args(g, random_nvfp4(N // 2, K)), "of one shape"),
    (lambda g, u: op_args(g, random_nvfp4(N, 2 * K)), "of one shape"),
])
def test_calls_it_cannot_take_are_errors(change, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        NVFP4_GATED_LINEAR(torch.randn(1, K), *change(*weights()))
    with pytest.raises((ValueError, RuntimeError), match="takes the activations"):
        NVFP4_GATED_LINEAR(torch.randn(1, K), *op_args(*weights()), activation="relu")


def test_the_cuda_path_runs_one_launch_where_the_siblings_would(monkeypatch):
    """`_nvfp4_gated_linear_cuda` on CPU tensors, its kernels replaced by references: one launch of the gated GEMV
    where `fa4::nvfp4_sibling_linears` would run one launch (blocked scales un-blocked first), else the siblings,
    then silu and the product."""
    calls = []

    def run_gated(x2d, gate, up, activation):
        calls.append(("gated", tuple(x2d.shape), activation))
        return ACTIVATIONS[activation](NVFP4_LINEAR(x2d, *gate)) * NVFP4_LINEAR(x2d, *up)

    def siblings(x, w_fp4, block, scale, bias, layout):
        calls.append(("siblings", tuple(x.shape)))
        return [NVFP4_LINEAR(x, *operands, None, scale_layout=layout) for operands in zip(w_fp4, block, scale)]

    monkeypatch.setattr(gated_op.nvfp4_int_gemv, "run_gated", run_gated)
    monkeypatch.setattr(gated_op.nvfp4_sibling_linears, "_nvfp4_sibling_linears_cuda", siblings)
    gate, up = weights(seed=7)
    x = torch.randn(1, 1, K, dtype=torch.bfloat16)
    expected = NVFP4_GATED_LINEAR(x, *op_args(gate, up), activation="gelu_tanh")
    for one_launch in (True, False):
        monkeypatch.setattr(gated_op.nvfp4_sibling_linears, "one_launch", lambda x2d, w_fp4: one_launch)
        out = gated_op._nvfp4_gated_linear_cuda(x, *op_args(*((w, blocked(b), g) for w, b, g in (gate, up))),
                                                scale_layout="blocked", activation="gelu_tanh")
        assert torch.equal(out, expected) and out.shape == (1, 1, N)
    assert calls == [("gated", (1, K), "gelu_tanh"), ("siblings", (1, 1, K))]


class MLP(nn.Module):
    """A gated MLP (Llama's) of NVFP4 linears, its activation `act`."""

    def __init__(self, dtype=torch.bfloat16, act=F.silu):
        super().__init__()
        torch.manual_seed(0)
        self.gate, self.up, self.down = (nvfp4.NVFP4Linear.from_linear(nn.Linear(k, n, bias=False).to(dtype))
                                         for n, k in ((N, K), (N, K), (K, N)))
        self.act = act

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


def compiled_mlp(x, backend=GATED, **kwargs):
    mlp = MLP(x.dtype, **kwargs)
    with torch.no_grad():
        return PostGradCompiled(mlp, x, backend=backend), mlp(x)


class TestRewrittenGraphs(expecttest.TestCase):
    def test_a_decode_step_of_batch_one(self):
        """One row of x: gate / up siblings and silu's product become the op; the output is eager's bit for bit
        (each rounding in x's dtype as eager's; Inductor's own fused silu and product rounds once)."""
        compiled, eager = compiled_mlp(torch.randn(1, 1, K, dtype=torch.bfloat16))
        ops = [line for line in "\n".join(compiled.graphs).splitlines() if "fa4." in line or "mul" in line]
        self.assertExpectedInline("\n".join(ops), """\
nvfp4_gated_linear_default: bf16[1, 128] = fa4.nvfp4_gated_linear(view_3, (arg2_1, arg6_1), (arg1_1, arg5_1), (arg0_1, arg4_1), activation='silu')
nvfp4_linear_default_2: bf16[1, 64] = fa4.nvfp4_linear(view_13, arg9_1, arg8_1, arg7_1, None)""")
        assert [d for ok, d in compiled.details if ok and "gated" in d] == [
            f"fa4.nvfp4_gated_linear(x[1x{K}], silu(gate[{N}x{K}]) * up[{N}x{K}])"]
        assert torch.equal(compiled.out, eager)

    def test_gemmas_gelu(self):
        """Gemma's MLP (GELU, tanh approximation) takes the op with that activation."""
        compiled, eager = compiled_mlp(torch.randn(1, 1, K, dtype=torch.bfloat16),
                                       act=lambda t: F.gelu(t, approximate="tanh"))
        ops = [line for line in "\n".join(compiled.graphs).splitlines() if "gated" in line]
        self.assertExpectedInline("\n".join(ops), """\
nvfp4_gated_linear_default: bf16[1, 128] = fa4.nvfp4_gated_linear(view_3, (arg2_1, arg6_1), (arg1_1, arg5_1), (arg0_1, arg4_1), activation='gelu_tanh')
reshape_default: bf16[1, 1, 128] = aten.reshape(nvfp4_gated_linear_default, (1, 1, 128))""")
        torch.testing.assert_close(compiled.out, eager, atol=2e-2 * eager.abs().max().item(), rtol=2e-2)


@pytest.mark.parametrize("case", ["two rows", "option off", "exact gelu", "float32"])
def test_what_keeps_the_siblings_and_the_product(case):
    """More rows of x (the op would run the product unfused there), the option off, an activation
    the op has not (GELU without the tanh approximation), a dtype without a finite-value probe: the sibling op and
    Inductor's product stay."""
    x = torch.randn(2 if case == "two rows" else 1, 1, K, dtype=torch.float32 if case == "float32" else torch.bfloat16)
    backend = fa4_inductor.backend(nvfp4_linear=True, gated_linears=False) if case == "option off" else GATED
    act = F.gelu if case == "exact gelu" else F.silu
    compiled, eager = compiled_mlp(x, backend=backend, act=act)
    summary = "\n".join(compiled.graphs)
    assert "fa4.nvfp4_gated_linear" not in summary and "fa4.nvfp4_sibling_linears" in summary
    assert not any("gated" in d for _, d in compiled.details)
    torch.testing.assert_close(compiled.out, eager, atol=2e-2 * eager.abs().max().item(), rtol=2e-2)


def test_silu_is_told_by_running_it():
    """A spelling of silu Inductor did not write (x * sigmoid(x)) is taken; a function that is not silu is not."""
    def spelled(t):
        return t * torch.sigmoid(t)

    compiled, eager = compiled_mlp(torch.randn(1, 1, K, dtype=torch.bfloat16), act=spelled)
    assert "fa4.nvfp4_gated_linear" in "\n".join(compiled.graphs)
    torch.testing.assert_close(compiled.out, eager, atol=2e-2 * eager.abs().max().item(), rtol=2e-2)
    compiled, _ = compiled_mlp(torch.randn(1, 1, K, dtype=torch.bfloat16), act=lambda t: t * torch.sigmoid(2 * t))
    assert "fa4.nvfp4_gated_linear" not in "\n".join(compiled.graphs)


@pytest.mark.slow  # two compiles of a quantized model a case (18 s for Llama on the CPU); the fast tier keeps the op's
# tests and `TestRewrittenGraphs`' decode step of a layer
@pytest.mark.parametrize("name, activation", [("llama", "silu"), ("gemma3_text", "gelu_tanh")])
def test_hf_decoders_one_row_forward(name, activation):
    """HF decoders quantized to NVFP4 (`nvfp4.quantize`), one token: every layer's MLP takes the op with its
    activation, logits as close to eager's as the option off gives them."""
    model = tiny(name, "sdpa").model.to(torch.bfloat16)
    nvfp4.quantize(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 1))
    logits = {}
    for on in (True, False):
        torch._dynamo.reset()
        with torch.no_grad(), collecting() as records:
            logits[on] = torch.compile(model, backend=fa4_inductor.backend(gated_linears=on))(
                input_ids=ids, use_cache=False).logits.float()
        gated = [r.detail for r in records if r.family == "gated_linears"]
        assert len(gated) == (model.config.num_hidden_layers if on else 0), gated
        assert all(f"{activation}(gate[" in d for d in gated), gated
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False).logits.float()
    scale = eager.abs().max().item()
    assert (logits[True] - eager).abs().max().item() <= max(2 * (logits[False] - eager).abs().max().item(),
                                                             2 ** -7 * scale)
