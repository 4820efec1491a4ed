"""CPU tier of the Blackwell W4A4 NVFP4 path (`kernels/nvfp4_blackwell.py`,
`kernels/cute/nvfp4_quantize_activation.py`): the quantize kernel compiles for sm_100a and sm_120a without a GPU;
the blocked scale layout, the rounding and the emulation of the kernel's arithmetic hold; the op and the family
route to it only when asked. Numerics on the device are in `test_gpu_nvfp4_blackwell.py` (skipped without an
sm100 / sm120 GPU: not run on our H200)."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import nvfp4
from fa4_inductor.kernels import NVFP4_LINEAR, prepared_weights
from fa4_inductor.kernels import nvfp4_blackwell as bw
from fa4_inductor.kernels import nvfp4_linear as nvfp4_op
from helpers import PostGradCompiled

ARCHS = ("sm_100a", "sm_120a")


@pytest.fixture(scope="module")
def cute_dsl():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # the CPU suite's other compile tests' arch; ours pass --gpu-arch
    pytest.importorskip("cutlass")
    pytest.importorskip("tvm_ffi", reason="the kernel compiles with --enable-tvm-ffi")


FAST_VARIANTS = [(torch.bfloat16, "row", "sm_100a"), (torch.float16, "row", "sm_120a"),
                 (torch.bfloat16, "given", "sm_120a")]
SLOW_VARIANTS = [(torch.float16, "row", "sm_100a"), (torch.bfloat16, "row", "sm_120a"),
                 (torch.float16, "given", "sm_100a"), (torch.bfloat16, "given", "sm_100a"),
                 (torch.float16, "given", "sm_120a")]


def _ids(v):
    return "-".join(map(str, v)).replace("torch.", "")


@pytest.mark.parametrize("variant", FAST_VARIANTS, ids=_ids)
def test_quantize_kernel_compiles_for_blackwell(cute_dsl, variant):
    key = bw._Key(*variant)
    assert callable(bw.compiled(key)) and bw.compiled(key) is bw.compiled(key)


@pytest.mark.slow
@pytest.mark.parametrize("variant", SLOW_VARIANTS, ids=_ids)
def test_more_quantize_variants_compile(cute_dsl, variant):
    assert callable(bw.compiled(bw._Key(*variant)))


PTX_PROBE = """
import sys, torch
from fa4_inductor.kernels import nvfp4_blackwell as bw
ptx = bw.compiled(bw._Key(torch.bfloat16, "row", sys.argv[1])).__ptx__
ops = set()
for line in ptx.splitlines():
    for part in line.replace("{", ";").split(";"):
        if part.strip().startswith(("cvt.", "div.", "mul.", "st.global", "ld.global", ".target")):
            ops.add(part.split()[0])
print(" ".join(sorted(ops)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_rounds_with_the_blackwell_conversions_and_keeps_subnormals(cute_dsl, arch, tmp_path):
    """The codes and scales come from the RNE saturating conversions, divisions are IEEE (div.rn), multiplies never
    flush (.ftz), loads and code stores are 16 bytes wide."""
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1")
    ops = subprocess.run([sys.executable, "-c", PTX_PROBE, arch], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout.split()
    for op in ("cvt.rn.satfinite.e2m1x2.f32", "cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.f16x2.e4m3x2", "div.rn.f32",
               "mul.rn.f32", "ld.global.v4.b32", "st.global.v4.b32"):
        assert op in ops, (op, ops)
    assert not any("ftz" in op or "approx" in op for op in ops), ops


# ------------------------------------------------------------------------------------------- the scale layout


@pytest.mark.parametrize("rows, cols", [(1, 2), (3, 6), (128, 4), (130, 9), (257, 16)])
def test_blocked_layout_is_the_kernels_formula_and_round_trips(rows, cols):
    g = torch.Generator().manual_seed(rows * 100 + cols)
    s = torch.randint(1, 256, (rows, cols), dtype=torch.uint8, generator=g)
    flat = bw.to_blocked(s)
    rp, cp = bw.blocked_shape(rows, cols)
    assert flat.shape == (rp * cp,) and rp % 128 == 0 and cp % 4 == 0
    assert torch.equal(bw.from_blocked(flat, rows, cols), s)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    scattered = torch.zeros(rp * cp, dtype=torch.uint8)
    scattered[bw.blocked_offset(r, c, cols).reshape(-1)] = s.reshape(-1)
    assert torch.equal(scattered, flat)  # the kernel's index formula, padding zeros
    assert int((flat != 0).sum()) == rows * cols


def test_blocked_layout_is_torchaos():
    mx_utils = pytest.importorskip("torchao.prototype.mx_formats.utils")
    s = torch.randint(0, 256, (130, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(bw.to_blocked(s), mx_utils.to_blocked(s))


def test_weight_scales_are_swizzled_once():
    block = (torch.rand(32, 8) * 4 + 0.1).to(torch.float8_e4m3fn)
    first = bw.weight_scales(block)
    assert first is bw.weight_scales(block) and prepared_weights.holds(block, bw.KIND)
    assert torch.equal(bw.from_blocked(first.view(torch.uint8), 32, 8), block.view(torch.uint8))
    block.view(torch.uint8)[0, 0] ^= 1  # an in-place update: built again
    assert not prepared_weights.holds(block, bw.KIND) and bw.weight_scales(block) is not first


# ---------------------------------------------------------------------------------------------- the rounding

GRID = torch.tensor(bw.E2M1_GRID, dtype=torch.float64)


def _nearest_even(v: float) -> float:
    """Round |v| to the e2m1 grid by brute force: nearest, ties to the value whose code is even, past 6: 6."""
    a = min(abs(v), 6.0)
    dist = (GRID - a).abs()
    best = [i for i in range(8) if dist[i] == dist.min()]
    i = best[0] if len(best) == 1 else next(j for j in best if j % 2 == 0)
    return float(GRID[i])


def test_e2m1_rounds_to_nearest_even_and_saturates():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    g = torch.Generator().manual_seed(3)
    values = torch.cat([torch.tensor(ties), torch.tensor(bw.E2M1_GRID), torch.rand(2000, generator=g) * 8,
                        torch.tensor([6.5, 1e6, 1e-30, 0.0])]).float()
    values = torch.cat([values, -values, torch.nextafter(values, torch.tensor(float("inf")))])
    codes = bw.e2m1_codes(values)
    table = torch.cat([GRID, -GRID])
    for v, c in zip(values.tolist(), codes.tolist()):
        assert table[c].item() == (_nearest_even(v) if v >= 0 else -_nearest_even(v)), (v, c)
    assert bw.e2m1_codes(torch.tensor([-0.1, -0.0])).tolist() == [8, 8]  # the sign stays on zeros, as cvt's


def test_e4m3_scale_rounding_saturates_and_keeps_subnormals():
    t = torch.tensor([448.0, 460.0, 1e9, 2.0 ** -9, 2.0 ** -11, 0.0, 3.0 * 2 ** -9, 17.0])
    assert bw.e4m3_rn(t).float().tolist() == [448.0, 448.0, 448.0, 2.0 ** -9, 0.0, 0.0, 3.0 * 2 ** -9, 16.0]


# ------------------------------------------------------------------------------------- the quantization math


def _half_gap(q: torch.Tensor) -> torch.Tensor:
    """The largest rounding error of |q| on the e2m1 grid (past 6: the excess)."""
    return torch.where(q <= 2, 0.25, torch.where(q <= 4, 0.5, 1.0)) + (q - 6).clamp(min=0)


@pytest.mark.parametrize("m, k, seed", [(3, 64, 0), (5, 4096, 1), (130, 96, 2)])
def test_quantized_activations_are_within_the_nvfp4_bound(m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10).to(torch.bfloat16)
    x[0, 5] = 0.0
    q = bw.quantize_emulated(x)
    assert q.codes.shape == (m, k // 2) and q.scales.shape == (m, k // 16) and q.row_scale.shape == (m,)
    xf = x.double()
    assert torch.equal(q.row_scale, x.float().abs().amax(-1) / 2688.0)
    xd = bw.dequantize_emulated(q)
    d = (q.scales.double() * q.row_scale.double()[:, None]).repeat_interleave(16, dim=1)
    assert (d > 0).all()
    allowed = d * _half_gap(xf.abs() / d) * (1 + 1e-6)
    assert ((xd - xf).abs() <= allowed).all()
    # each row's largest element is kept: its block's scale is the e4m3 maximum, it maps to +-6
    top = xf.abs().argmax(-1)
    torch.testing.assert_close(xd.gather(1, top[:, None]), xf.gather(1, top[:, None]), rtol=1e-6, atol=0)
    rel = (xd - xf).norm() / xf.norm()
    assert 0.03 < rel < bw.ACTIVATION_RMS_BOUND, rel


def test_zero_blocks_and_zero_rows_quantize_to_zero():
    x = torch.randn(3, 64, dtype=torch.float16)
    x[1] = 0
    x[2, 16:32] = 0
    q = bw.quantize_emulated(x)
    assert q.row_scale[1] == 0 and not q.scales[1].float().any() and not q.codes[1].any()
    assert q.scales[2, 1].float() == 0 and not (q.codes[2, 8:16] & 7).any()
    assert bw.dequantize_emulated(q).isfinite().all()


def test_a_given_scale_saturates_blocks_it_is_too_small_for():
    x = torch.tensor([[1000.0] + [1.0] * 15 + [0.01] * 16], dtype=torch.bfloat16)
    q = bw.quantize_emulated(x, torch.tensor(0.01))
    assert q.row_scale.tolist() == [pytest.approx(0.01)]
    assert q.scales.float()[0, 0] == 448.0  # 1000 / (6 * 0.01) > 448
    assert bw.dequantize_emulated(q)[0, 0] == pytest.approx(6 * 448 * 0.01)


@pytest.mark.parametrize("m, n, k", [(4, 32, 256), (17, 48, 1024)])
def test_emulated_w4a4_against_the_float64_weight_only_reference(m, n, k):
    g = torch.Generator().manual_seed(m + n + k)
    w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    block = (torch.rand(n, k // 16, generator=g) * 6 + 0.05).to(torch.float8_e4m3fn)
    w_global = torch.tensor(0.0037)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    ref = x.double() @ nvfp4_op.dequantize(w_fp4, block, w_global, torch.float64).T
    got = bw.emulate(x, w_fp4, block, w_global)
    rel = (got - ref).norm() / ref.norm()
    assert 0.02 < rel < bw.ACTIVATION_RMS_BOUND, rel
    # and exactly the quantized activations times the exact weight
    xq = bw.dequantize_emulated(bw.quantize_emulated(x))
    exact_w = nvfp4_op.decode(w_fp4).double() * block.double().repeat_interleave(16, 1) * w_global.double()
    torch.testing.assert_close(got, xq @ exact_w.T, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------ host rules


def test_limits():
    bf16 = torch.bfloat16
    assert "sm90" in bw.limits_reason((9, 0), bf16, 2, 1, 64, 64)
    assert "float32" in bw.limits_reason((10, 0), torch.float32, 2, 1, 64, 64)
    assert bw.limits_reason((10, 0), bf16, 2, 1, 64, 48) == \
        "torch._scaled_mm's fp4 operands need K a multiple of 32; K is 48"
    assert bw.limits_reason((12, 0), bf16, 2, 1, 24, 64) == \
        "torch._scaled_mm's fp4 operands need N a multiple of 16; N is 24"
    assert bw.limits_reason((10, 0), bf16, 2, 0, 64, 64) == "x has no rows"
    if bw.FP4X2 is not None and bw._cutlass_reason() is None:
        assert bw.limits_reason((10, 0), bf16, 2, 7, 64, 4096) is None
        assert bw.limits_reason((12, 1), torch.float16, 2, 1, 16, 32) is None
    assert "CUDA" in bw.unsupported_reason(torch.zeros(1, 64, dtype=bf16), 64, 64)


def test_op_routes_to_w4a4_only_when_asked(monkeypatch):
    w_fp4 = torch.zeros(64, 32, dtype=torch.uint8)
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(nvfp4_op.quack_w4a16, "unsupported_reason", lambda *a: "stand-in: no quack")
    monkeypatch.setattr(nvfp4_op.nvfp4_blackwell, "unsupported_reason", lambda x2d, n, k: None)
    assert nvfp4_op.kernel_for(x, w_fp4, quantize_activations=True) == ("nvfp4_blackwell", "")
    assert nvfp4_op.kernel_for(x, w_fp4) == ("dequantize", "stand-in: no quack")
    monkeypatch.setattr(nvfp4_op.nvfp4_blackwell, "unsupported_reason", lambda x2d, n, k: "stand-in: not Blackwell")
    assert nvfp4_op.kernel_for(x, w_fp4, quantize_activations=True) == \
        ("dequantize", "stand-in: not Blackwell; stand-in: no quack")


def test_opcheck_with_quantize_activations():
    g = torch.Generator().manual_seed(0)
    w_fp4 = torch.randint(0, 256, (16, 32), dtype=torch.uint8, generator=g)
    block = (torch.rand(16, 4, generator=g) * 4 + 0.1).to(torch.float8_e4m3fn)
    args = (torch.randn(3, 64), w_fp4, block, torch.tensor(0.02), None)
    torch.library.opcheck(NVFP4_LINEAR, args, {"quantize_activations": True},
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    # the reference (CPU) keeps x as it is: the flag only permits the Blackwell path
    assert torch.equal(NVFP4_LINEAR(*args, quantize_activations=True), NVFP4_LINEAR(*args))


@pytest.mark.usefixtures("without_fx_graph_cache")
def test_the_family_emits_the_flag_under_the_option():
    torch.manual_seed(0)
    layer = nvfp4.NVFP4Linear.from_linear(nn.Linear(64, 48).to(torch.bfloat16))
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = PostGradCompiled(layer, x, backend=fa4_inductor.backend(nvfp4_linear=True, nvfp4_activations=True))
        torch.testing.assert_close(compiled.out, layer(x), atol=0, rtol=0)  # on CPU the reference runs
    assert "torch.ops.fa4.nvfp4_linear.default(" in compiled.code and "quantize_activations=True)" in compiled.code
    assert compiled.details == [(True, "fa4.nvfp4_linear(x[5x64] bfloat16, w[48x32] uint8, block_scale[48x4] e4m3, "
                                       "global scale, bias[48]) [activations to nvfp4 on Blackwell]")]


@pytest.mark.slow
def test_host_module_imports_no_cutlass():
    code = "import sys, fa4_inductor.kernels.nvfp4_blackwell; assert 'cutlass' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
