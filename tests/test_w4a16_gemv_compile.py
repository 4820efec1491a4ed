"""CPU tier of the CUDA-core W4A16 GEMV (`kernels/cute/w4a16_gemv.py`, routed by `kernels/w4a16_decode.py` for
M <= 4 when FA4_INDUCTOR_W4A16_GEMV=1): CuTe DSL compiles its variants for sm_90a without a GPU, without spills;
its decode, emulated in PyTorch, reproduces every weight exactly; the host rules hold. Numerics on the device are in
`test_gpu_w4a16.py` (the `gemv` tests).
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from fa4_inductor.kernels import switches, w4a16_decode as w4
from test_w4a16_compile import DTYPES, _exact_nvfp4, _random_nvfp4, cute_dsl  # noqa: F401 (a fixture)

ARCH = "sm_90a"




# ------------------------------------------------------------------------------- decode (PyTorch)


def test_nvfp4_gemv_decode_covers_every_code_and_finite_scale():
    """Every e2m1 code in every position of a word, in even and odd pieces (the scale word's bytes 0, 1 and 2, 3),
    against every finite e4m3 byte (subnormals, zero, both signs): the GEMV's shifts, merges, splats, packed fma and
    fp32 halves give the exact weight."""
    scale_bytes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    n = scale_bytes.numel()
    g = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randperm(16, generator=g) for _ in range(4 * n)]).reshape(n, 64).to(torch.uint8)
    w_fp4 = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scales = scale_bytes.repeat_interleave(4).reshape(n, 4).view(torch.float8_e4m3fn)
    got = w4.decode_nvfp4_gemv(w4.nvfp4_words(w_fp4), w4.nvfp4_block_words(scales, 64), 64)
    assert torch.equal(got, _exact_nvfp4(w_fp4, scales))
    mixed = scales.view(torch.uint8).roll(1, dims=0).view(torch.float8_e4m3fn)  # other bytes in each block slot
    mixed = torch.cat([scales[:, :2], mixed[:, 2:]], dim=1)
    got = w4.decode_nvfp4_gemv(w4.nvfp4_words(w_fp4), w4.nvfp4_block_words(mixed, 64), 64)
    assert torch.equal(got, _exact_nvfp4(w_fp4, mixed))


@pytest.mark.parametrize("n, k", [(5, 64), (3, 48), (17, 16), (2, 4096), (4, 2064)])
def test_nvfp4_gemv_layout_decodes_exactly(n, k):
    w_fp4, scales = _random_nvfp4(n, k, seed=n * 1000 + k)
    words, blocks = w4.nvfp4_words(w_fp4), w4.nvfp4_block_words(scales, k)
    assert words.shape[1] % 4 == 0  # whole 16-byte pieces
    assert torch.equal(w4.decode_nvfp4_gemv(words, blocks, k), _exact_nvfp4(w_fp4, scales))
    kp = w4.padded_k("nvfp4", k)
    if kp > k:
        assert not w4.decode_nvfp4_gemv(words, blocks, kp)[:, k:].any()


def test_int8_gemv_decode_covers_every_byte():
    w_int8 = torch.arange(-128, 128, dtype=torch.int8).reshape(8, 32)
    assert torch.equal(w4.decode_int8_gemv(w4.byte_words(w_int8), 32), w_int8.double())
    g = torch.Generator().manual_seed(1)
    w_int8 = torch.randint(-128, 128, (7, 40), dtype=torch.int8, generator=g)
    assert torch.equal(w4.decode_int8_gemv(w4.byte_words(w_int8), 40), w_int8.double())


def test_prmt_emulation():
    a = torch.tensor([0x80C1E2F3], dtype=torch.int64)
    assert w4._prmt(a, 0x4B000000, 0x7540).item() == 0x4B0000F3
    assert w4._prmt(a, 0x4B000000, 0x7543).item() == 0x4B000080
    assert w4._prmt(a, 0x4B000000, 0x3210).item() == 0x80C1E2F3
    assert w4._prmt(a, 0x4B000000, 0x0008 | 0x7540).item() == 0x4B0000FF  # sign of byte 0 replicated


def test_gemv_products_are_exact_in_fp32():
    """x (bf16 / f16) times a decoded weight (e2m1 * e4m3 * 2^-7, at most 5 significant bits; int8) is exact in
    fp32: the GEMV's only roundings are the fp32 sums and the output's."""
    for dtype in DTYPES:
        x = torch.randn(4096, dtype=torch.float32).to(dtype).double()
        w_fp4, scales = _random_nvfp4(1, 4096, seed=9)
        wd = _exact_nvfp4(w_fp4, scales)[0] * 2.0 ** -7
        assert torch.equal((x * wd).float().double(), x * wd)
        w8 = torch.randint(-128, 128, (4096,), dtype=torch.int8).double()
        assert torch.equal((x * w8).float().double(), x * w8)


# ------------------------------------------------------------------------------- host rules


def test_gemv_switch_is_read():
    assert switches.read({}).w4a16_gemv is None
    assert switches.read({"FA4_INDUCTOR_W4A16_GEMV": "auto"}).w4a16_gemv is None
    assert switches.read({"FA4_INDUCTOR_W4A16_GEMV": "1"}).w4a16_gemv == w4.GEMV_MAX_M
    assert switches.read({"FA4_INDUCTOR_W4A16_GEMV": "off"}).w4a16_gemv == 0
    with pytest.raises(ValueError, match="auto, on or off"):
        switches.read({"FA4_INDUCTOR_W4A16_GEMV": "2"})


def test_gemv_takes_one_row_by_default(monkeypatch):
    monkeypatch.delenv(switches.W4A16_GEMV, raising=False)
    switches.reset()
    assert w4.configured_gemv_rows() == w4.GEMV_AUTO_ROWS == 1
    assert [w4.gemv_rows(g) for g in (None, True, False, (2, 2))] == [1, 4, 0, 4]
    for value, rows in (("on", 4), ("off", 0)):
        monkeypatch.setenv(switches.W4A16_GEMV, value)
        switches.reset()
        assert w4.configured_gemv_rows() == w4.gemv_rows(None) == rows
    monkeypatch.delenv(switches.W4A16_GEMV)
    switches.reset()


def test_gemv_warps_k():
    """K warps doubled while N * warps_k < 16384 and each K warp keeps a 32-piece step (pieces: Kp / 32 NVFP4,
    Kp / 16 int8)."""
    assert w4.gemv_warps_k(8192, 8192 // 32) == 2
    assert w4.gemv_warps_k(16384, 4096 // 32) == 1
    assert w4.gemv_warps_k(2048, 8192 // 32) == 4
    assert w4.gemv_warps_k(2048, 2048 // 32) == 2  # 64 pieces: two steps
    assert w4.gemv_warps_k(512, 2048 // 16) == 4
    assert w4.gemv_warps_k(512, 32) == 1  # one step a row
    assert w4.gemv_warps_k(3, 48 // 16) == 1
    for n in (1, 7, 333, 1000, 8192, 128256):
        for pieces in (1, 31, 64, 129, 512):
            assert w4.gemv_warps_k(n, pieces) in w4.GEMV_WARPS_K


def test_gemv_shape():
    """Rows a warp halved while the CTAs (4 warps: 4 / warps_k row groups) number fewer than the SMs; split
    (FA4_INDUCTOR_GEMV_SPLIT), K split in 2..8 where the CTAs are fewer than 3 a SM."""
    assert w4.gemv_shape(8192, 8192 // 32, 132) == (4, 2, 1)
    assert w4.gemv_shape(8192, 2048 // 32, 132) == (4, 2, 1)
    assert w4.gemv_shape(2048, 8192 // 32, 132) == (4, 4, 1)  # 512 CTAs
    assert w4.gemv_shape(2048, 2048 // 32, 132) == (4, 2, 1)
    assert w4.gemv_shape(512, 2048 // 32, 132) == (1, 2, 1)  # 256 CTAs of 2 rows
    assert w4.gemv_shape(512, 2048 // 16, 132) == (2, 4, 1)  # int8: 256 CTAs
    assert w4.gemv_shape(3, 48 // 32 + 1, 132) == (1, 1, 1)
    assert w4.gemv_shape(2048, 8192 // 32, 132, split=True) == (4, 4, 1)  # 512 CTAs already
    assert w4.gemv_shape(512, 2048 // 16, 132, split=True) == (2, 4, 1)  # 128 pieces: one step a K warp
    assert w4.gemv_shape(512, 8192 // 16, 132, split=True) == (2, 4, 2)  # int8 512 x 8192: 256 CTAs -> 512
    for n in (1, 7, 333, 1000, 8192, 128256):
        for pieces in (1, 31, 64, 129, 512):
            for split in (False, True):
                rows, wk, splits = w4.gemv_shape(n, pieces, 132, split)
                assert rows in w4.GEMV_ROW_CHOICES and wk in w4.GEMV_WARPS_K and splits in w4.GEMV_SPLITS
                assert pieces >= splits * 64 * wk or splits == 1


def test_gemv_keys_are_checked():
    key = w4.gemv_key(torch.bfloat16, "int8", 3, True, ARCH, 2, scale_dtype=torch.float16)
    assert (key.m, key.bias, key.warps_k, key.scale_dtype, key.rows) == (3, True, 2, torch.float16, w4.GEMV_ROWS)
    with pytest.raises(ValueError, match="1..4 rows"):
        w4.gemv_key(torch.bfloat16, "nvfp4", 5, False, ARCH, 1)
    with pytest.raises(ValueError, match="nvfp4 scales of dtype torch.bfloat16"):
        w4.gemv_key(torch.bfloat16, "nvfp4", 1, False, ARCH, 1, scale_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="no W4A16 GEMV"):
        w4.gemv_key(torch.bfloat16, "nvfp4", 1, True, ARCH, 1)
    with pytest.raises(ValueError, match="no W4A16 GEMV"):
        w4.gemv_key(torch.bfloat16, "int8", 1, False, ARCH, 8)
    with pytest.raises(ValueError, match="16 rows a warp"):
        w4.gemv_key(torch.bfloat16, "int8", 4, False, ARCH, 1, rows=16)  # one lane a (row, x row) to store
    with pytest.raises(ValueError, match="3 splits"):
        w4.gemv_key(torch.bfloat16, "int8", 1, False, ARCH, 1, splits=3)
    assert w4.gemv_key(torch.bfloat16, "int8", 1, False, ARCH, 1, splits=4).splits == 4
    assert w4._gemv_shape((2, 4)) == (2, 4) and w4._gemv_shape(True) is None


def test_the_matmuls_take_a_gemv_argument():
    import inspect

    assert "gemv" in inspect.signature(w4.nvfp4_matmul).parameters
    assert "gemv" in inspect.signature(w4.int8_matmul).parameters
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):  # the checks come first, on either route
        w4.int8_matmul(x, torch.zeros(4, 64, dtype=torch.int8), torch.ones(4), gemv=True)


# ------------------------------------------------------------------------------- compiles


def test_gemv_variants_compile(cute_dsl):
    for key in (w4.gemv_key(torch.bfloat16, "nvfp4", 1, False, ARCH, 2),
                w4.gemv_key(torch.float16, "int8", 4, True, ARCH, 1, scale_dtype=torch.bfloat16),
                w4.gemv_key(torch.bfloat16, "int8", 1, False, ARCH, 1, True)._replace(weights=3),
                w4.gemv_key(torch.float16, "int8", 2, False, ARCH, 2, scale_dtype=torch.float16)._replace(weights=2),
                w4.gemv_key(torch.bfloat16, "int8", 1, True, ARCH, 4, True, rows=2, splits=2),
                w4.gemv_key(torch.bfloat16, "nvfp4", 1, False, ARCH, 1, splits=8)):
        assert callable(w4.compiled_gemv(key)) and w4.compiled_gemv(key) is w4.compiled_gemv(key)


@pytest.mark.slow
def test_gemv_warmup(cute_dsl):
    w4.warmup(torch.bfloat16, "nvfp4", (1,), device="cpu", gemv=True)
    assert w4.warmup(torch.bfloat16, "nvfp4", (1,), device="cpu", gemv=True) == 0
    for rows in w4.GEMV_ROW_CHOICES:
        assert w4.gemv_key(torch.bfloat16, "nvfp4", 1, False, ARCH, 4, switches.current().w4a16_pdl,
                           rows=rows) in w4.compiled_gemv._compiled


GEMV_PTX_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
for i, spec in enumerate(sys.argv[1:]):
    dtype, fmt, m, bias, wk, scale, pdl, rows = spec.split(",")
    key = w.gemv_key(getattr(torch, dtype), fmt, int(m), bias == "1", "sm_90a", int(wk), pdl == "1",
                     getattr(torch, scale), int(rows))
    open(f"kernel{i}.ptx", "w").write(w.compiled_gemv(key).__ptx__)
"""


def _gemv_specs(dtype):
    """Every M, both formats, int8 with and without bias and each scale dtype, every K-warp count, PDL and not; the
    default rows a warp, the 2 and 1 `gemv_shape` falls back to, and 8 (`tests/bench_w4a16.py --gemv 8x1`)."""
    rows = w4.GEMV_ROWS
    specs = []
    for m in range(1, w4.GEMV_MAX_M + 1):
        wk = w4.GEMV_WARPS_K[m % len(w4.GEMV_WARPS_K)]
        specs.append(f"{dtype},nvfp4,{m},0,{wk},float32,{m % 2},{rows}")
        for bias in (0, 1):
            scale = ("float32", "bfloat16", "float16")[(m + bias) % 3]
            specs.append(f"{dtype},int8,{m},{bias},{w4.GEMV_WARPS_K[(m + bias) % 3]},{scale},{bias},{rows}")
    for fmt in ("nvfp4", "int8"):
        specs += [f"{dtype},{fmt},1,0,1,float32,1,8", f"{dtype},{fmt},4,0,2,float32,1,2",
                  f"{dtype},{fmt},3,0,4,float32,0,1", f"{dtype},{fmt},2,0,1,float32,1,2"]
    return specs


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gemv_variants_compile_without_spills(cute_dsl, dtype, tmp_path):
    """Each variant compiles for sm_90a; its PTX loads the weight and x in 16-byte vectors, sums in fp32 FMAs with no
    flush to zero and no tensor-core op, and, where ptxas is found, it does not spill (registers printed: `-s`)."""
    specs = _gemv_specs(dtype)
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    subprocess.run([sys.executable, "-c", GEMV_PTX_PROBE, *specs], env=env, cwd=tmp_path, check=True,
                   capture_output=True, text=True)
    ptxas = shutil.which("ptxas")
    for i, spec in enumerate(specs):
        text = (tmp_path / f"kernel{i}.ptx").read_text()
        assert "ld.global.v4.b32" in text and "fma.rn.f32" in text, spec
        assert "ftz" not in text and "mma." not in text, spec
        assert ("griddepcontrol.wait" in text) == (spec.split(",")[6] == "1"), spec
        if ptxas:
            info = subprocess.run([ptxas, f"-arch={ARCH}", "-v", str(tmp_path / f"kernel{i}.ptx"), "-o", os.devnull],
                                  check=True, capture_output=True, text=True).stderr
            print(spec, [line.strip() for line in info.splitlines() if "registers" in line])
            assert "0 bytes spill stores" in info and "0 bytes spill loads" in info, (spec, info)


@pytest.mark.slow
def test_sass_stats_reports_the_gemv(cute_dsl):
    """docs/scripts/sass_stats.py compiles a GEMV variant and reads its register count from the cubin."""
    script = os.path.join(os.path.dirname(__file__), "..", "docs", "scripts", "sass_stats.py")
    out = subprocess.run([sys.executable, script, "gemv", "int8", "1", "2"], check=True, capture_output=True,
                         text=True).stdout
    print(out)
    assert "registers [" in out


GEMV_PDL_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
key = w.gemv_key(torch.bfloat16, sys.argv[1], 1, False, "sm_90a", 2, pdl=True)
ptx = w.compiled_gemv(key).__ptx__
body = ptx[ptx.index(".entry"):]
wait = body.find("griddepcontrol.wait")
print(body.find("ld.global.v4"), wait, body.find("griddepcontrol.launch_dependents"),
      body.find("ld.global.v4", body.find("griddepcontrol.launch_dependents")), body.count("ld.global.v4", 0, wait))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["nvfp4", "int8"])
def test_gemv_pdl_loads_only_weights_before_its_wait(cute_dsl, fmt, tmp_path):
    """With PDL the first weight piece of each of the warp's rows is loaded before `griddepcontrol.wait` (16-byte
    loads, one a row: no x), the dependents' trigger comes after it, and the x loads after both."""
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    first, wait, trigger, after, before = map(int, subprocess.run(
        [sys.executable, "-c", GEMV_PDL_PROBE, fmt], env=env, cwd=tmp_path, check=True, capture_output=True,
        text=True).stdout.split())
    assert 0 <= first < wait < trigger < after, (first, wait, trigger, after)
    assert before == w4.GEMV_ROWS, before
