"""CPU tier of the weight-only decode GEMM (`kernels/w4a16_decode.py`, `kernels/cute/w4a16_decode_gemm.py`):
CuTe DSL compiles its variants for sm_90a without a GPU; the weight layout and the kernel's bit-level
decode, emulated in PyTorch, reproduce the weights exactly; the host rules (limits, split count, padding)
hold. Numerics on the device are in `test_gpu_w4a16.py`.
"""

import os
import subprocess
import sys

import pytest
import torch

from fa4_inductor.kernels import nvfp4_linear, w4a16_decode as w4

ARCH = "sm_90a"


@pytest.fixture(scope="module")
def cute_dsl():
    os.environ.setdefault("CUTE_DSL_ARCH", ARCH)
    pytest.importorskip("cutlass")
    pytest.importorskip("tvm_ffi", reason="the kernel compiles with --enable-tvm-ffi")


def _key(kernel, dtype, fmt, m, split, bias, cta="wide"):
    if kernel == "reduce":
        return w4._Key(kernel, dtype, fmt, m, split, bias, ARCH)
    return w4._Key(kernel, dtype, fmt, m, split, bias, ARCH, w4.wide(m) if cta == "wide" else w4.NARROW)


FAST_VARIANTS = [
    ("main", torch.bfloat16, "nvfp4", 8, False, False),
    ("main", torch.bfloat16, "nvfp4", 8, False, False, "narrow"),
    ("main", torch.float16, "int8", 16, True, False),
    ("reduce", torch.bfloat16, "int8", 0, True, True),
]
SLOW_VARIANTS = [
    ("main", torch.float16, "nvfp4", 16, True, False),
    ("main", torch.bfloat16, "nvfp4", 16, True, False, "narrow"),
    ("main", torch.bfloat16, "int8", 8, False, True),
    ("main", torch.bfloat16, "int8", 8, True, False, "narrow"),
    ("main", torch.float16, "int8", 8, False, False),
    ("reduce", torch.float16, "nvfp4", 0, True, False),
]


def _ids(v):
    return "-".join(map(str, v)).replace("torch.", "")


@pytest.mark.parametrize("variant", FAST_VARIANTS, ids=_ids)
def test_variant_compiles(cute_dsl, variant):
    key = _key(*variant)
    assert callable(w4.compiled(key))
    assert w4.compiled(key) is w4.compiled(key)


@pytest.mark.slow
@pytest.mark.parametrize("variant", SLOW_VARIANTS, ids=_ids)
def test_more_variants_compile(cute_dsl, variant):
    assert callable(w4.compiled(_key(*variant)))


@pytest.mark.slow
def test_warmup_compiles_every_variant_of_a_format(cute_dsl):
    w4.warmup(torch.bfloat16, "nvfp4", (1, 3), device="cpu")
    assert w4.warmup(torch.bfloat16, "nvfp4", (1, 3), device="cpu") == 0
    with pytest.raises(ValueError):
        w4.warmup(torch.float32, "nvfp4")


PTX_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
key = w.keys(torch.bfloat16, sys.argv[1], 8, False, False, "sm_90a", w.wide(8))[0]
ptx = w.compiled(key).__ptx__
ops = ("ld.global", "cp.async", "mul.", "fma.", "add.", "mma.")
lines = [l.split()[0].rstrip(";") for l in ptx.splitlines() if l.strip().startswith(ops)]
print(" ".join(sorted(set(lines))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["nvfp4", "int8"])
def test_ptx_streams_16_byte_loads_and_keeps_subnormals(cute_dsl, fmt, tmp_path):
    """Weight and x loads are 128-bit, straight to registers (no cp.async), the products run on the tensor
    cores, and no multiply flushes subnormals (the bf16 NVFP4 decode multiplies e2m1 0.5 as a subnormal
    pattern)."""
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    out = subprocess.run([sys.executable, "-c", PTX_PROBE, fmt], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout.split()
    assert "ld.global.v4.b32" in out and not any(op.startswith("cp.async") for op in out), out
    assert not any("ftz" in op for op in out), out
    assert "fma.rn.bf16x2" in out, out
    assert any(op.startswith("mma.sync.aligned.m16n8k16") for op in out), out


PDL_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
key = w.keys(torch.bfloat16, sys.argv[1], 8, False, False, "sm_90a", w.NARROW, pdl=True)[0]
ptx = w.compiled(key).__ptx__
body = ptx[ptx.index(".entry"):]
print(body.find("ld.global.v4"), body.find("griddepcontrol.wait"), body.find("griddepcontrol.launch_dependents"),
      body.rfind("ld.global.v4"))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["nvfp4", "int8"])
def test_pdl_variant_loads_weights_before_its_wait(cute_dsl, fmt, tmp_path):
    """With PDL the first weight loads come before `griddepcontrol.wait`, the dependents' trigger after it, and
    the other loads (x, later steps) after both."""
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    first_load, wait, trigger, last_load = map(int, subprocess.run(
        [sys.executable, "-c", PDL_PROBE, fmt], env=env, cwd=tmp_path, check=True, capture_output=True,
        text=True).stdout.split())
    assert 0 <= first_load < wait < trigger < last_load, (first_load, wait, trigger, last_load)


def test_pdl_switch_is_read():
    from fa4_inductor.kernels import switches

    assert switches.read({}).w4a16_pdl and switches.read({"FA4_INDUCTOR_W4A16_PDL": "1"}).w4a16_pdl
    assert not switches.read({"FA4_INDUCTOR_W4A16_PDL": "off"}).w4a16_pdl


# ------------------------------------------------------------------------------- layout and decode (PyTorch)

E2M1 = torch.tensor(nvfp4_linear.E2M1_VALUES, dtype=torch.float64)


def _random_nvfp4(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    scale_bytes = torch.randint(0, 0x7F, (n, k // 16), dtype=torch.uint8, generator=g)  # finite, positive
    scale_bytes[0, 0] = 0x01  # the smallest subnormal e4m3
    scale_bytes |= (torch.rand(n, k // 16, generator=g) < 0.1).to(torch.uint8) << 7  # some negative
    return w_fp4, scale_bytes.view(torch.float8_e4m3fn)


def _exact_nvfp4(w_fp4, scales):
    lo, hi = (w_fp4 & 0xF).long(), (w_fp4 >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(w_fp4.shape[0], -1)
    return E2M1[codes] * scales.double().repeat_interleave(16, dim=1)


DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, k", [(5, 64), (3, 48), (17, 16), (2, 4096)])
def test_nvfp4_layout_decodes_to_the_weight_exactly(n, k, dtype):
    w_fp4, scales = _random_nvfp4(n, k, seed=n * 1000 + k)
    words, blocks = w4.nvfp4_words(w_fp4), w4.nvfp4_block_words(scales, k)
    kp = w4.padded_k("nvfp4", k)
    assert words.dtype == torch.int32 and tuple(words.shape) == (n, kp // 8)
    assert blocks.dtype == torch.int32 and tuple(blocks.shape) == (n, kp // 64)
    assert torch.equal(w4.decode_nvfp4_words(words, blocks, k, dtype), _exact_nvfp4(w_fp4, scales))
    if kp > k:  # the padding decodes to zeros
        assert not w4.decode_nvfp4_words(words, blocks, kp, dtype)[:, k:].any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nvfp4_decode_covers_every_code_and_finite_scale(dtype):
    """Every e2m1 code in every position of a word against every finite e4m3 byte (subnormals, both
    signs): the kernel's shifts, merges and scale splats (for bf16 and f16 x)."""
    scale_bytes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    n = scale_bytes.numel()
    g = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randperm(16, generator=g) for _ in range(4 * n)]).reshape(n, 64).to(torch.uint8)
    w_fp4 = codes[:, 0::2] | (codes[:, 1::2] << 4)  # each row: every code 4 times, in shuffled positions
    scales = scale_bytes.repeat_interleave(4).reshape(n, 4).view(torch.float8_e4m3fn)
    got = w4.decode_nvfp4_words(w4.nvfp4_words(w_fp4), w4.nvfp4_block_words(scales, 64), 64, dtype)
    assert torch.equal(got, _exact_nvfp4(w_fp4, scales))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, k", [(7, 32), (3, 16), (4, 40), (9, 200)])
def test_int8_layout_decodes_to_the_weight_exactly(n, k, dtype):
    g = torch.Generator().manual_seed(k)
    w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    w_int8[0, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    words = w4.int8_words(w_int8)
    assert words.dtype == torch.int32 and words.shape[1] * 4 == w4.padded_k("int8", k)
    assert torch.equal(w4.decode_int8_words(words, k, dtype), w_int8.double())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_decode_covers_every_byte(dtype):
    w_int8 = torch.arange(-128, 128, dtype=torch.int8).reshape(8, 32)
    assert torch.equal(w4.decode_int8_words(w4.int8_words(w_int8), 32, dtype), w_int8.double())


def test_layout_is_a_view_when_nothing_needs_padding():
    w_fp4, scales = _random_nvfp4(4, 64, seed=1)
    words, blocks = w4.prepare_nvfp4(w_fp4, scales)
    assert words.data_ptr() == w_fp4.data_ptr() and blocks.data_ptr() == scales.data_ptr()
    w_int8 = torch.zeros(4, 32, dtype=torch.int8)
    assert w4.prepare_int8(w_int8).data_ptr() == w_int8.data_ptr()


def test_padded_weights_are_prepared_once():
    from fa4_inductor.kernels import prepared_weights

    w_fp4, scales = _random_nvfp4(4, 48, seed=2)
    first, _ = w4.prepare_nvfp4(w_fp4, scales)
    again, _ = w4.prepare_nvfp4(w_fp4, scales)
    assert first is again and first.shape[1] == 64 // 8
    assert any(kind == "w4a16_nvfp4" for _, kind, _ in prepared_weights.report())


def test_x_is_zero_padded_to_the_chunk():
    x = torch.randn(3, 48, dtype=torch.bfloat16)
    xp = w4.prepare_x(x, 64)
    assert xp.shape == (3, 64) and torch.equal(xp[:, :48], x) and not xp[:, 48:].any()
    assert w4.prepare_x(x[:, :32].contiguous(), 32).shape == (3, 32)
    one_row = torch.randn(1, 80, dtype=torch.bfloat16)[:, :64]  # "contiguous", but its row stride is 80
    assert w4.prepare_x(one_row, 64).stride() == (64, 1)


# ------------------------------------------------------------------------------------------- host rules


@pytest.mark.parametrize("n, k, fmt, m", [
    (8192, 8192, "nvfp4", 1), (2048, 8192, "nvfp4", 1), (8192, 2048, "int8", 16), (128256, 4096, "nvfp4", 4),
    (16, 16, "int8", 1), (4096, 14336, "nvfp4", 16), (16, 8192, "nvfp4", 1), (512, 2048, "int8", 8),
])
def test_num_splits_is_in_range(n, k, fmt, m):
    kp = w4.padded_k(fmt, k)
    shape = w4.cta_shape(n, m, num_sms=132, fmt=fmt)
    s = w4.num_splits(n, kp, fmt, shape, num_sms=132)
    assert 1 <= s <= w4.MAX_SPLITS
    chunks = kp // w4.CHUNK_VALUES[fmt]
    assert s == 1 or chunks // s >= 4 * shape.warps_k * w4.MIN_STEPS


def _plan(n, k, m, fmt="nvfp4"):
    shape = w4.cta_shape(n, m, 132, fmt=fmt)
    return ("wide" if shape == w4.wide(m) else "narrow" if shape == w4.NARROW else shape,
            w4.num_splits(n, w4.padded_k(fmt, k), fmt, shape, 132))


def test_cta_shape_and_splits():
    """NVFP4 weights whose wide CTAs cover a quarter of the SMs keep them (and split K below half); fewer rows take
    the narrow 16-row CTAs, which cover the SMs without a split for Llama-1B's 2048-row projections; int8 is always
    narrow (the H200 rows of docs/benchmarks.md, session 10 run 2)."""
    assert _plan(128256, 4096, 1) == ("wide", 1)
    assert _plan(14336, 4096, 1) == ("wide", 1)
    assert _plan(8192, 8192, 1) == ("wide", 1)
    assert _plan(8192, 2048, 1) == ("wide", 1)
    assert _plan(4096, 14336, 1) == ("wide", 2)  # 64 wide CTAs
    assert _plan(4096, 14336, 16) == ("wide", 1)  # 32 rows a CTA at M > 8: 128 wide CTAs
    assert _plan(2048, 8192, 1) == ("narrow", 1)
    assert _plan(2048, 8192, 16) == ("wide", 2)
    assert _plan(2048, 2048, 1) == ("narrow", 1)
    assert _plan(512, 2048, 1) == ("narrow", 1)  # 32 CTAs; K too short for 2 steps a warp in a split
    assert _plan(512, 8192, 1) == ("narrow", 2)
    assert _plan(8192, 8192, 1, "int8") == ("narrow", 1)
    assert _plan(8192, 2048, 16, "int8") == ("narrow", 1)
    assert w4.cta_shape(8192, 1, 132, forced=(1, 2, 4)) == w4.CtaShape(1, 2, 4)
    assert w4.wide(16) == w4.CtaShape(1, 2, 4) and w4.wide(8).rows == 64 and w4.NARROW.rows == 16


def test_cta_switch_is_read_and_checked():
    from fa4_inductor.kernels import switches

    assert switches.read({"FA4_INDUCTOR_W4A16_CTA": "1x2x8"}).w4a16_cta == (1, 2, 8)
    assert switches.read({}).w4a16_cta is None
    with pytest.raises(ValueError, match="RTxWNxWK"):
        switches.read({"FA4_INDUCTOR_W4A16_CTA": "1x8"})


def test_declines_off_gpu_and_outside_its_limits():
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    assert "CUDA" in w4.unsupported_reason(x, "nvfp4", 16, 64)
    assert "formats" in w4.unsupported_reason(x, "mxfp4", 16, 64)
    assert w4.shape_reason(2, 17, 16, 64) == "the W4A16 decode GEMM takes 1..16 rows of x, got 17"
    assert "multiple of 16" in w4.shape_reason(2, 1, 16, 40)
    assert w4.shape_reason(2, 16, 16, 64) is None


def test_matmuls_check_their_operands():
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    w_fp4, scales = _random_nvfp4(4, 64, seed=3)
    with pytest.raises(ValueError, match="block scales"):
        w4.nvfp4_matmul(x, w_fp4, scales.view(torch.uint8), torch.tensor(1.0))
    with pytest.raises(ValueError, match="CUDA"):
        w4.nvfp4_matmul(x, w_fp4, scales, torch.tensor(1.0))
    with pytest.raises(ValueError, match="per-channel"):
        w4.int8_matmul(x, torch.zeros(4, 64, dtype=torch.int8), torch.ones(8))


@pytest.mark.slow
def test_host_module_imports_no_cutlass():
    code = "import sys, fa4_inductor.kernels.w4a16_decode; assert 'cutlass' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
