"""CPU tier of the weight-only decode GEMM (`kernels/w4a16_decode.py`, `kernels/cute/w4a16_decode_gemm.py`):
CuTe DSL compiles its variants for sm_90a without a GPU; the weight layout and the kernel's bit-level
decode, emulated in PyTorch, reproduce the weights exactly; the host rules (limits, split count, padding)
hold. Numerics on the device are in `test_gpu_w4a16.py`.
"""

import os
import shutil
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


def bulk_cta(m):
    """The 2 x 4-warp CTA the bulk path was tuned on: two row tiles a warp up to 8 rows, one above."""
    return w4.HALF_WIDE if w4.m_bucket(m) > 8 else w4.WIDE


def _key(kernel, dtype, fmt, m, split, bias, cta="wide", load="registers", scale_dtype=torch.float32):
    if kernel == "reduce":
        return w4._Key(kernel, dtype, fmt, m, split, bias, ARCH, scale_dtype=scale_dtype)
    return w4._Key(kernel, dtype, fmt, m, split, bias, ARCH, w4.WIDE if cta == "wide" else w4.NARROW, False, load,
                   scale_dtype)


FAST_VARIANTS = [
    ("main", torch.bfloat16, "nvfp4", 8, False, False),
    ("main", torch.bfloat16, "nvfp4", 8, False, False, "narrow"),
    ("main", torch.float16, "int8", 16, True, False),
    ("reduce", torch.bfloat16, "int8", 0, True, True),
    ("main", torch.bfloat16, "int8", 8, False, True, "narrow", "registers", torch.bfloat16),
]
SLOW_VARIANTS = [
    ("main", torch.bfloat16, "fp8", 16, False, True, "narrow", "rolling"),
    ("main", torch.float16, "nvfp4", 16, True, False),
    ("main", torch.bfloat16, "nvfp4", 16, True, False, "narrow"),
    ("main", torch.bfloat16, "int8", 8, False, True),
    ("main", torch.bfloat16, "int8", 8, True, False, "narrow"),
    ("main", torch.float16, "int8", 8, False, False),
    ("reduce", torch.float16, "nvfp4", 0, True, False),
    ("reduce", torch.float16, "int8", 0, True, True, "wide", "registers", torch.float16),
    ("main", torch.float16, "int8", 16, True, False, "narrow", "registers", torch.float16),
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


def test_scale_dtypes_of_the_variants():
    """int8's per-channel scales pick a variant by dtype; NVFP4's global scale is always fp32."""
    cta = w4.NARROW
    assert [k.scale_dtype for k in w4.keys(torch.bfloat16, "int8", 3, True, True, ARCH, cta,
                                           scale_dtype=torch.bfloat16)] == [torch.bfloat16] * 2
    assert w4.keys(torch.float16, "int8", 3, False, True, ARCH, cta)[0].scale_dtype == torch.float32
    with pytest.raises(ValueError, match="nvfp4 scales of dtype torch.bfloat16"):
        w4.keys(torch.bfloat16, "nvfp4", 3, False, False, ARCH, cta, scale_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="int8 scales of dtype torch.float64"):
        w4.keys(torch.bfloat16, "int8", 3, False, False, ARCH, cta, scale_dtype=torch.float64)


@pytest.mark.slow
def test_warmup_compiles_every_variant_of_a_format(cute_dsl):
    w4.warmup(torch.bfloat16, "nvfp4", (1, 3), device="cpu")
    assert w4.warmup(torch.bfloat16, "nvfp4", (1, 3), device="cpu") == 0
    with pytest.raises(ValueError):
        w4.warmup(torch.float32, "nvfp4")


PTX_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
key = w.keys(torch.bfloat16, sys.argv[1], 8, False, False, "sm_90a", w.WIDE)[0]
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


# ------------------------------------------------------------------------------- the rolling load path

# dtype, format, M bucket, split, bias, load spec, CTA, layout: both formats and M buckets, both CTAs, split and
# bias, PDL, the packed and tiled NVFP4 layouts, the register cap
ROLLING = [
    (torch.bfloat16, "nvfp4", 16, False, False, "rolling", w4.WIDE, False, False),
    (torch.float16, "int8", 8, True, True, "rolling", w4.NARROW, False, False),
    (torch.bfloat16, "nvfp4", 8, True, False, "rolling+2ctas", w4.WIDE, True, False),
    (torch.float16, "nvfp4", 16, False, False, "rolling+2ctas", w4.NARROW, "tiles", True),
    (torch.bfloat16, "int8", 16, False, True, "rolling", w4.NARROW, False, True),
    (torch.bfloat16, "nvfp4", 16, True, False, "rolling", w4.PACKED_WIDE, True, False),
]

ROLLING_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
dtype, fmt, m, split, bias, spec, cta, pack, pdl = eval(sys.argv[1], {"torch": torch, "w4": w})
key = w.keys(dtype, fmt, m, split, bias, "sm_90a", cta, pdl, spec, pack=pack)[0]
assert key.load == spec and key.pack == bool(pack) and key.tiled == (pack == "tiles"), key
ptx = w.compiled(key).__ptx__
open("kernel.ptx", "w").write(ptx)
print(" ".join(l.split()[0].rstrip(";") for l in ptx.splitlines() if l.strip()[:1].isalpha() or l.startswith(".")))
"""


@pytest.mark.slow
@pytest.mark.parametrize("variant", ROLLING, ids=_ids)
def test_rolling_variant_streams_16_byte_pieces_a_step_ahead(cute_dsl, variant, tmp_path):
    """The rolling load path compiles for each format, CTA, layout, split, bias and PDL; its weight and x loads
    stay 128-bit (16-byte pieces); "+2ctas" caps the registers for two CTAs a SM (.minnctapersm 2); and,
    where ptxas is found, no variant spills in its K loop (the cap may spill a few words outside it)."""
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    ops = subprocess.run([sys.executable, "-c", ROLLING_PROBE, repr(variant).replace("CtaShape", "w4.CtaShape")],
                         env=env, cwd=tmp_path, check=True, capture_output=True, text=True).stdout.split()
    fmt, m, spec, cta = variant[1], variant[2], variant[5], variant[6]
    text = " ".join((tmp_path / "kernel.ptx").read_text().split())
    assert ("minnctapersm 2" in text) == spec.endswith("+2ctas"), spec
    assert ops.count("ld.global.v4.b32") >= 2 * cta.row_tiles * 2 + m // 8 * w4.CHUNK_VALUES[fmt] * 2 // 16, ops
    assert not any(op.startswith("cp.async") for op in ops)
    assert ("griddepcontrol.wait" in ops) == variant[8]
    ptxas = shutil.which("ptxas")
    if ptxas and not spec.endswith("+2ctas"):
        info = subprocess.run([ptxas, f"-arch={ARCH}", "-v", str(tmp_path / "kernel.ptx"), "-o", os.devnull],
                              check=True, capture_output=True, text=True).stderr
        assert "0 bytes spill stores" in info, info


def test_auto_load_rule():
    """"auto": at 9..16 rows rolling on CTAs of two row tiles a warp, the capped rolling path on the others; up to 8
    rows rolling on CTAs of more than 16 rows and, for int8, on 16-row CTAs over short K; the register path on 16-row
    CTAs otherwise (docs/benchmarks.md, sessions 36 and 37)."""
    k_short, k_long = w4.ROLLING_MAX_NARROW_K, w4.ROLLING_MAX_NARROW_K + 32
    for fmt in ("nvfp4", "int8"):
        assert [w4.auto_load(m, k_long, cta, fmt) for m, cta in ((9, w4.HALF_WIDE), (16, w4.NARROW))] == \
            ["rolling+2ctas"] * 2
        assert [w4.auto_load(m, k, w4.WIDE, fmt) for m in (1, 4, 8, 9, 16) for k in (k_short, k_long)] == \
            ["rolling"] * 10
        assert [w4.auto_load(m, k_long, w4.NARROW, fmt) for m in (1, 8)] == ["registers"] * 2
    assert [w4.auto_load(m, k_short, w4.NARROW, "int8") for m in (1, 8)] == ["rolling"] * 2
    assert [w4.auto_load(m, k_short, w4.NARROW, "nvfp4") for m in (1, 8)] == ["registers"] * 2
    assert w4.resolve_load("bulk:3", 16, k_long, w4.WIDE, "int8") == "bulk:3"
    assert w4.resolve_load("auto", 16, k_long, w4.HALF_WIDE, "nvfp4") == "rolling+2ctas"


def test_auto_xsmem_options():
    """On CTAs of one K warp "auto" gives plain NVFP4 the rotated decode, and on 1 x 16 x 1 x's copy permuted for the
    MMAs too (`xsmem_auto_spec`, docs/benchmarks.md session 50); int8, fp8 and the packed layouts take plain xsmem."""
    k = 8192
    assert [w4.auto_load(m, k, w4.XSMEM_WIDE, "nvfp4") for m in (2, 8, 16)] == ["xsmem+xperm+rot"] * 3
    assert [w4.auto_load(m, k, w4.XSMEM_NARROW, "nvfp4") for m in (8, 16)] == ["xsmem+rot"] * 2
    assert w4.auto_load(16, k, w4.CtaShape(2, 8, 1), "nvfp4") == "xsmem+rot"
    assert [w4.auto_load(16, k, w4.XSMEM_WIDE, fmt) for fmt in ("int8", "fp8")] == ["xsmem"] * 2
    assert [w4.resolve_load("auto", 16, k, w4.XSMEM_WIDE, "nvfp4", pack) for pack in (True, "tiles")] == ["xsmem"] * 2
    assert w4.resolve_load("xsmem", 16, k, w4.XSMEM_WIDE, "nvfp4") == "xsmem"


def test_warmup_compiles_what_auto_picks(monkeypatch):
    """warmup with "auto" asks for the variants `auto_load` can give each M and CTA (both sides of the K rule)."""
    class Recorder(list):
        def __call__(self, key):
            self.append(key)

    asked = Recorder()
    monkeypatch.setattr(w4, "compiled", asked)
    monkeypatch.setattr(w4, "compiled_gemv", Recorder())
    w4.warmup(torch.bfloat16, "int8", (1, 16), bias=False, device="cpu", load="auto", gemv=False)
    loads = {(k.m_max, k.cta, k.load) for k in asked if k.kernel == "main"}
    assert loads == {(8, w4.NARROW, "rolling"), (8, w4.NARROW, "registers"), (8, w4.WIDE, "rolling"),
                     (16, w4.NARROW, "rolling+2ctas"), (16, w4.HALF_WIDE, "rolling+2ctas"), (16, w4.WIDE, "rolling"),
                     (16, w4.XSMEM_NARROW, "xsmem:2")}, loads
    asked.clear()
    w4.warmup(torch.bfloat16, "nvfp4", (1,), device="cpu", load="auto", gemv=False)
    assert {(k.cta, k.load) for k in asked if k.kernel == "main"} == {(w4.NARROW, "registers"),
                                                                       (w4.WIDE, "rolling")}
    asked.clear()
    w4.warmup(torch.bfloat16, "nvfp4", (16,), device="cpu", load="auto", gemv=False)
    xsmem = {(k.cta, k.load, k.x_steps, k.split) for k in asked if k.kernel == "main" and k.x_steps}
    assert xsmem == {(cta, spec, steps, split) for cta, spec in ((w4.XSMEM_WIDE, "xsmem+xperm+rot:2"),
                                                                  (w4.XSMEM_NARROW, "xsmem+rot:2"))
                     for steps in (2, 4, 8, 16) for split in (False, True)}, xsmem
    asked.clear()
    w4.warmup(torch.bfloat16, "nvfp4", (16,), device="cpu", load="auto", gemv=False, pack=True)
    assert {k.load for k in asked if k.kernel == "main" and k.x_steps} == {"xsmem:2"}


def test_rolling_keys():
    """The rolling paths keep their spec as the key's load (no depth), the tiled layout runs on them, and
    the register cap is compiled as its own variant."""
    cta = w4.WIDE
    key = lambda spec, pack=False: w4.keys(torch.bfloat16, "nvfp4", 16, False, False, ARCH, cta, False, spec,  # noqa
                                           pack=pack)[0]
    assert key("rolling").load == "rolling" and key("rolling+2ctas").load == "rolling+2ctas"
    assert key("rolling", "tiles").tiled and key("rolling+2ctas", "tiles").tiled
    assert len({key("registers"), key("rolling"), key("rolling+2ctas")}) == 3
    with pytest.raises(ValueError, match="register load paths only"):
        key("bulk", "tiles")


# ------------------------------------------------------------------------------- the bulk load path

# dtype, format, M bucket, split, bias, load spec: both formats, both M buckets, split and not, int8 bias,
# the default depth, a given depth, +ahead, +prefetch and +scales
BULK_FAST = [
    (torch.bfloat16, "nvfp4", 8, False, False, "bulk"),
    (torch.float16, "int8", 16, True, False, "bulk"),
    (torch.bfloat16, "nvfp4", 16, True, False, "bulk+prefetch"),
    (torch.bfloat16, "nvfp4", 8, True, False, "bulk+scales"),
    (torch.bfloat16, "nvfp4", 8, False, False, "bulk", w4.NARROW),
]
BULK_SLOW = [
    (torch.float16, "nvfp4", 16, True, False, "bulk"),
    (torch.bfloat16, "nvfp4", 16, False, False, "bulk:3"),
    (torch.bfloat16, "nvfp4", 8, True, False, "bulk+ahead"),
    (torch.float16, "nvfp4", 8, False, False, "bulk+ahead+prefetch:4"),
    (torch.bfloat16, "int8", 8, False, True, "bulk"),
    (torch.float16, "int8", 8, True, False, "bulk:2"),
    (torch.bfloat16, "int8", 16, False, True, "bulk+ahead:4"),
    (torch.float16, "nvfp4", 16, False, False, "bulk+ahead+prefetch+scales"),
    (torch.float16, "int8", 16, False, True, "bulk", w4.NARROW),
    (torch.bfloat16, "nvfp4", 16, True, False, "bulk+scales", w4.NARROW),
]


def _bulk_key(dtype, fmt, m, split, bias, spec, cta=None):
    cta = cta or bulk_cta(m)
    key = w4.keys(dtype, fmt, m, split, bias, ARCH, cta, False, spec)[0]
    path, depth = w4.parse_load(spec)
    scales = "+scales" in path
    assert key.load == f"{path}:{depth or w4.bulk_stages(m, cta, None, scales)}" and key.m_max == m
    assert key.bias == bias and key.cta == cta
    return key


def test_int8_keys_drop_the_block_scale_options():
    def load(fmt, m, spec):
        return w4.keys(torch.bfloat16, fmt, m, False, fmt == "int8", ARCH, bulk_cta(m), False, spec)[0].load

    assert load("int8", 3, "bulk+ahead+prefetch+scales:3") == "bulk+ahead:3"
    assert load("int8", 3, "bulk+scales") == f"bulk:{w4.bulk_stages(8, w4.WIDE)}"
    assert load("nvfp4", 9, "bulk+scales") == "bulk+scales:10"


@pytest.mark.slow  # ~5 s a variant: the fast tier's 5 minutes (test_variant_compiles stays)
@pytest.mark.parametrize("variant", BULK_FAST, ids=_ids)
def test_bulk_variant_compiles(cute_dsl, variant):
    key = _bulk_key(*variant)
    assert callable(w4.compiled(key)) and w4.compiled(key) is not w4.compiled(key._replace(load="registers"))


@pytest.mark.slow
@pytest.mark.parametrize("variant", BULK_SLOW, ids=_ids)
def test_more_bulk_variants_compile(cute_dsl, variant):
    assert callable(w4.compiled(_bulk_key(*variant)))


BULK_PTX_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
m = int(sys.argv[2])
key = w.keys(torch.bfloat16, sys.argv[1], m, False, sys.argv[1] == "int8", "sm_90a",
           w.HALF_WIDE if m > 8 else w.WIDE, False, sys.argv[3])[0]
ptx = w.compiled(key).__ptx__
open("kernel.ptx", "w").write(ptx)
print(" ".join(l.split()[0].rstrip(";") for l in ptx.splitlines() if l.strip()[:1].isalpha()))
"""


def _bulk_ptx(fmt, m, spec, tmp_path):
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    ops = subprocess.run([sys.executable, "-c", BULK_PTX_PROBE, fmt, str(m), spec], env=env, cwd=tmp_path,
                         check=True, capture_output=True, text=True).stdout.split()
    return ops, tmp_path / "kernel.ptx"


@pytest.mark.slow
@pytest.mark.parametrize("fmt, m, spec", [("nvfp4", 8, "bulk"), ("int8", 16, "bulk"), ("nvfp4", 16, "bulk+prefetch"),
                                          ("nvfp4", 8, "bulk+scales"), ("nvfp4", 16, "bulk+prefetch+scales")])
def test_bulk_ptx_copies_codes_through_the_ring(cute_dsl, fmt, m, spec, tmp_path):
    """The weight codes arrive by bulk copies completing on mbarriers and leave shared memory in 16-byte loads
    (the only vector global loads left are x's); the K slices' reduction syncs the consumers alone (named
    barrier 1); +prefetch prefetches the scale rows into L2, one per row; +scales copies the scale words with
    4-byte cp.async tracked by the stage's mbarrier, and the consumers load no scale from global memory (the
    one 4-byte global load left is the global scale); and, where ptxas is found, the variant does not spill
    (9 warps a CTA: at most 168 registers)."""
    ops, ptx = _bulk_ptx(fmt, m, spec, tmp_path)
    count = lambda op: sum(o == op for o in ops)  # noqa: E731
    cta = bulk_cta(m)
    prefetches = count("cp.async.bulk.prefetch.L2.global")
    assert prefetches >= cta.rows // 32 if "prefetch" in spec else prefetches == 0
    if "scales" in spec:
        assert count("cp.async.ca.shared.global") >= cta.rows * 16 // 32, ops
        assert count("cp.async.mbarrier.arrive.noinc.shared.b64") >= 1 and count("ld.global.b32") == 1, ops
    else:
        assert count("cp.async.ca.shared.global") == 0 and count("cp.async.mbarrier.arrive.noinc.shared.b64") == 0
    rt, groups = cta.row_tiles, m // 8
    assert count("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes") >= cta.rows // 32
    assert count("mbarrier.arrive.expect_tx.shared.b64") >= 1 and count("mbarrier.arrive.shared.b64") >= 1
    assert count("mbarrier.init.shared.b64") == 2 * w4.bulk_stages(m, cta, None, "scales" in spec)
    x_loads_per_step = groups * w4.CHUNK_VALUES[fmt] * 2 // 16
    w_reads_per_step = 2 * rt * 2
    assert count("ld.shared.v4.b32") % w_reads_per_step == 0 and count("ld.shared.v4.b32") > 0, ops
    assert count("ld.global.v4.b32") % x_loads_per_step == 0, ops
    assert "bar.sync 1, 256;" in " ".join(ptx.read_text().split())
    ptxas = shutil.which("ptxas")
    if ptxas:
        info = subprocess.run([ptxas, f"-arch={ARCH}", "-v", str(ptx), "-o", os.devnull], check=True,
                              capture_output=True, text=True).stderr
        assert "0 bytes spill stores" in info, info


def test_bulk_stage_reads_are_bank_conflict_free_and_copies_aligned(cute_dsl):
    """Each 8-lane wavefront of the consumers' 16-byte shared loads (lane 4g + t: rows g and g + 8 of a tile,
    chunk 4 wk + t, both halves) covers the 32 banks once; every row segment a bulk copy writes starts on 16
    bytes, and the stage holds every row's segment without overlap."""
    from fa4_inductor.kernels.cute.w4a16_decode_gemm import BulkStage

    for rows, warps_k in [(64, 4), (32, 4), (32, 2), (64, 1)]:
        st = BulkStage(rows, warps_k)
        assert st.pitch % 16 == 0 and st.pitch >= st.chunks * 32 and st.bytes == rows * st.pitch
        for wk in range(warps_k):
            for tile in range(rows // 16):
                for row8 in range(2):
                    for half in range(2):
                        for wave in range(4):
                            at = [st.offset(16 * tile + 8 * row8 + lane // 4, 4 * wk + lane % 4, half)
                                  for lane in range(8 * wave, 8 * wave + 8)]
                            banks = sorted((a // 4 + w) % 32 for a in at for w in range(4))
                            assert banks == list(range(32)), (rows, warps_k, wk, tile, row8, half, wave)
        segments = sorted((st.offset(r, 0, 0), st.offset(r, 0, 0) + st.chunks * 32) for r in range(rows))
        assert all(a % 16 == 0 for a, _ in segments)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(segments, segments[1:])) and segments[-1][1] <= st.bytes
        # +scales: the block-scale words after the codes, a warp's 4-byte reads (rows g, chunks 4 wk + t) on 32 banks
        sc = BulkStage(rows, warps_k, scales=True)
        assert sc.scales_at >= segments[-1][1] and sc.scale_offset(rows - 1, sc.chunks - 1) + 4 <= sc.bytes
        assert sc.bytes % 16 == 0
        for wk in range(warps_k):
            for row in range(0, rows, 8):
                at = [sc.scale_offset(row + lane // 4, 4 * wk + lane % 4) for lane in range(32)]
                assert sorted(a // 4 % 32 for a in at) == list(range(32)), (rows, warps_k, wk, row)


def test_bulk_ring_depths(cute_dsl):
    """The default depth fills BULK_SMEM_BUDGET (wide CTAs, M <= 8: 64 rows x 528 bytes a stage; M <= 16: 32 rows;
    narrow: 16 rows x 1040 bytes); a given depth must fit sm90's shared memory."""
    from fa4_inductor.kernels.cute.w4a16_decode_gemm import bulk_smem_bytes

    wide8, wide16 = bulk_cta(8), bulk_cta(16)
    assert (w4.bulk_stages(8, wide8), w4.bulk_stages(16, wide16)) == (5, 11)
    assert (w4.bulk_stages(8, wide8, None, True), w4.bulk_stages(16, wide16, None, True)) == (5, 10)
    for m in w4.M_BUCKETS:
        for cta in (bulk_cta(m), w4.NARROW):
            for scales in (False, True):
                stage, red = w4._bulk_layout(m, cta, scales)
                rows = cta.rows
                assert stage.bytes == rows * (cta.warps_k * 4 * 32 + 16) + (
                    rows * (cta.warps_k * 4 + 4) * 4 if scales else 0)
                depth = w4.bulk_stages(m, cta, None, scales)
                fits = bulk_smem_bytes(stage, depth, red) <= w4.BULK_SMEM_BUDGET
                assert fits and (depth == w4.MAX_STAGES or bulk_smem_bytes(stage, depth + 1, red) > w4.BULK_SMEM_BUDGET)
    assert w4.load_key("bulk:6", 8, "nvfp4", wide8) == "bulk:6"
    assert w4.load_key("bulk+ahead", 16, "nvfp4", wide16) == "bulk+ahead:11"
    with pytest.raises(ValueError, match="7-stage bulk ring at M <= 8 needs"):
        w4.bulk_stages(8, wide8, 7)
    with pytest.raises(ValueError, match="give the ring's depth"):
        w4.compiled(_key("main", torch.bfloat16, "nvfp4", 8, False, False, load="bulk"))


def test_load_spec_is_checked(monkeypatch):
    assert w4.parse_load("registers") == ("registers", None)
    assert w4.parse_load("bulk") == ("bulk", None)
    assert w4.parse_load(" bulk+ahead:4 ") == ("bulk+ahead", 4)
    assert w4.parse_load("bulk+ahead+prefetch") == ("bulk+ahead+prefetch", None)
    assert w4.parse_load("bulk+prefetch+scales:2") == ("bulk+prefetch+scales", 2)
    assert w4.parse_load("rolling") == ("rolling", None)
    assert w4.parse_load("rolling+2ctas") == ("rolling+2ctas", None)
    assert w4.parse_load("xsmem") == ("xsmem", None)
    assert w4.parse_load("xsmem:3") == ("xsmem", 3)
    assert w4.parse_load("xsmem+2ctas:3") == ("xsmem+2ctas", 3)
    assert w4.parse_load("xsmem+prefetch") == ("xsmem+prefetch", None)
    assert w4.parse_load("xsmem+2ctas+prefetch6:3") == ("xsmem+2ctas+prefetch6", 3)
    assert w4.parse_load("xsmem+2ctas+prefetch+parts4:2") == ("xsmem+2ctas+prefetch+parts4", 2)
    assert w4.xsmem_options(["2ctas", "prefetch6"]) == (True, 6, w4.XSMEM_PARTS, False, False)
    assert w4.xsmem_options(["prefetch"]) == (False, 4, w4.XSMEM_PARTS, False, False)
    assert w4.xsmem_options(["parts3"]).parts == 3 and w4.xsmem_options(["parts1"]).parts == 1
    assert w4.parse_load("xsmem+2ctas+xperm:3") == ("xsmem+2ctas+xperm", 3)
    assert w4.xsmem_options(["xperm"]) == (False, 0, 1, True, False)
    assert not w4.xsmem_options(["prefetch"]).permute
    assert w4.parse_load("xsmem+xperm+rot:2") == ("xsmem+xperm+rot", 2)
    assert w4.parse_load("rolling+2ctas+rot") == ("rolling+2ctas+rot", None)
    assert w4.parse_load("registers+rot") == ("registers+rot", None)
    assert w4.parse_load("rolling+rot") == ("rolling+rot", None)
    assert w4.xsmem_options(["parts2", "rot"]) == (False, 0, 2, False, True)
    for bad in ("ring", "Bulk", "bulk:0", "bulk:x", "registers:2", "bulk:", "bulk+ahead:-1", "registers+ahead",
                "bulk+prefetch+ahead", "bulk+scales+ahead", "bulk+ahead+ahead", "bulk+", "bulk-ahead", "rolling:2",
                "rolling+ahead", "registers+2ctas", "rolling+3ctas", "rolling+2ctas+2ctas", "bulk+2ctas", "xsmem:1",
                "xsmem+ahead", "xsmem:", "xsmem+3ctas", "xsmem+2ctas:1", "xsmem+prefetch:3", "xsmem+prefetch0",
                "xsmem+prefetch+2ctas", "xsmem+prefetch+prefetch", "xsmem+prefetchx", "xsmem+parts", "xsmem+parts0",
                "xsmem+parts2+prefetch", "xsmem+parts2+parts2", "rolling+parts2", "xsmem+parts2+xperm",
                "xsmem+xperm+parts2", "xsmem+xperm+xperm", "xsmem+xperm+2ctas", "rolling+xperm", "bulk+xperm",
                "xsmem+rot+xperm", "xsmem+rot+rot", "rolling+rot+2ctas", "registers+rot+rot", "registers+rot:2",
                "bulk+rot", "xsmem+wring"):
        with pytest.raises(ValueError, match="load path .* is registers, rolling, rolling.2ctas, bulk, bulk with .* or "
                                             "xsmem .options .2ctas, .prefetch.*. with its weights' register sets"):
            w4.parse_load(bad)
    from fa4_inductor.kernels import switches

    monkeypatch.setenv(switches.W4A16_LOAD, "tma")
    switches.reset()
    with pytest.raises(ValueError, match="FA4_INDUCTOR_W4A16_LOAD or `load`.*got 'tma'"):
        w4.configured_load()
    with pytest.raises(ValueError, match="got 'tma'"):
        w4.warmup(torch.bfloat16, "nvfp4", (1,), device="cpu")
    monkeypatch.setenv(switches.W4A16_LOAD, "bulk:3")
    switches.reset()
    assert w4.configured_load() == "bulk:3"
    monkeypatch.delenv(switches.W4A16_LOAD)
    switches.reset()
    assert w4.configured_load() == "auto"


@pytest.mark.slow
def test_warmup_compiles_the_configured_load_path(cute_dsl, monkeypatch):
    from fa4_inductor.kernels import switches

    monkeypatch.setenv(switches.W4A16_LOAD, "bulk:2")
    switches.reset()
    w4.warmup(torch.float16, "int8", (16,), bias=False, device="cpu")
    assert w4.warmup(torch.float16, "int8", (16,), bias=False, device="cpu", load="bulk:2") == 0
    assert w4.warmup(torch.float16, "int8", (16,), bias=False, device="cpu", load="registers") >= 1


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


@pytest.mark.parametrize("rotated", [False, True], ids=["shifted", "rotated"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, k", [(5, 64), (3, 48), (17, 16), (2, 4096)])
def test_nvfp4_layout_decodes_to_the_weight_exactly(n, k, dtype, rotated):
    w_fp4, scales = _random_nvfp4(n, k, seed=n * 1000 + k)
    words, blocks = w4.nvfp4_words(w_fp4), w4.nvfp4_block_words(scales, k)
    kp = w4.padded_k("nvfp4", k)
    assert words.dtype == torch.int32 and tuple(words.shape) == (n, kp // 8)
    assert blocks.dtype == torch.int32 and tuple(blocks.shape) == (n, kp // 64)
    assert torch.equal(w4.decode_nvfp4_words(words, blocks, k, dtype, rotated), _exact_nvfp4(w_fp4, scales))
    if kp > k:  # the padding decodes to zeros
        assert not w4.decode_nvfp4_words(words, blocks, kp, dtype, rotated)[:, k:].any()


@pytest.mark.parametrize("rotated", [False, True], ids=["shifted", "rotated"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nvfp4_decode_covers_every_code_and_finite_scale(dtype, rotated):
    """Every e2m1 code in every position of a word against every finite e4m3 byte (subnormals, both
    signs): the kernel's shifts, merges and scale splats (for bf16 and f16 x), and its rotated decode ("+rot")."""
    scale_bytes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    n = scale_bytes.numel()
    g = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randperm(16, generator=g) for _ in range(4 * n)]).reshape(n, 64).to(torch.uint8)
    w_fp4 = codes[:, 0::2] | (codes[:, 1::2] << 4)  # each row: every code 4 times, in shuffled positions
    scales = scale_bytes.repeat_interleave(4).reshape(n, 4).view(torch.float8_e4m3fn)
    got = w4.decode_nvfp4_words(w4.nvfp4_words(w_fp4), w4.nvfp4_block_words(scales, 64), 64, dtype, rotated)
    assert torch.equal(got, _exact_nvfp4(w_fp4, scales))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, k", [(7, 32), (3, 16), (4, 40), (9, 200)])
def test_int8_layout_decodes_to_the_weight_exactly(n, k, dtype):
    g = torch.Generator().manual_seed(k)
    w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    w_int8[0, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    words = w4.byte_words(w_int8)
    assert words.dtype == torch.int32 and words.shape[1] * 4 == w4.padded_k("int8", k)
    assert torch.equal(w4.decode_int8_words(words, k, dtype), w_int8.double())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_decode_covers_every_byte(dtype):
    w_int8 = torch.arange(-128, 128, dtype=torch.int8).reshape(8, 32)
    assert torch.equal(w4.decode_int8_words(w4.byte_words(w_int8), 32, dtype), w_int8.double())


def test_layout_is_a_view_when_nothing_needs_padding():
    w_fp4, scales = _random_nvfp4(4, 64, seed=1)
    words, blocks = w4.prepare_nvfp4(w_fp4, scales)
    assert words.data_ptr() == w_fp4.data_ptr() and blocks.data_ptr() == scales.data_ptr()
    w_int8 = torch.zeros(4, 32, dtype=torch.int8)
    assert w4.prepare_bytes(w_int8).data_ptr() == w_int8.data_ptr()


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
    # Inductor's one-row activations (row stride 0) are restrided, not copied: a copy is a launch per call
    inductor_row = torch.randn(64, dtype=torch.bfloat16).as_strided((1, 64), (0, 1))
    viewed = w4.prepare_x(inductor_row, 64)
    assert viewed.stride() == (64, 1) and viewed.data_ptr() == inductor_row.data_ptr()
    assert torch.equal(viewed, inductor_row)


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
    return ("wide" if shape == w4.WIDE else "half wide" if shape == w4.HALF_WIDE else "narrow" if shape == w4.NARROW
            else shape,
            w4.num_splits(n, w4.padded_k(fmt, k), fmt, shape, 132))


def test_cta_shape_and_splits():
    """NVFP4 weights whose wide CTAs cover a quarter of the SMs keep them (and split K below half); at 9..16 rows
    the half-wide CTAs where those are too few; fewer rows take the narrow 16-row CTAs, which cover the SMs without a
    split for Llama-1B's 2048-row projections; int8 is always narrow (the H200 rows of docs/benchmarks.md, session
    10 run 2, and the H100 rows of session 37)."""
    assert _plan(128256, 4096, 1) == ("wide", 1)
    assert _plan(14336, 4096, 1) == ("wide", 1)
    assert _plan(8192, 8192, 1) == ("wide", 1)
    assert _plan(8192, 2048, 1) == ("wide", 1)
    assert _plan(4096, 14336, 1) == ("wide", 2)  # 64 wide CTAs
    assert _plan(4096, 14336, 16) == ("wide", 2)
    assert _plan(2048, 8192, 1) == ("narrow", 1)
    assert _plan(2048, 8192, 16) == ("half wide", 2)  # 32 wide CTAs are too few at M > 8: 64 of 32 rows
    assert _plan(2048, 2048, 1) == ("narrow", 1)
    assert _plan(512, 2048, 1) == ("narrow", 1)  # 32 CTAs; K too short for 2 steps a warp in a split
    assert _plan(512, 8192, 1) == ("narrow", 2)
    assert _plan(8192, 8192, 1, "int8") == ("narrow", 1)
    assert _plan(8192, 2048, 16, "int8") == ("narrow", 1)
    assert w4.cta_shape(8192, 1, 132, forced=(1, 2, 4)) == w4.CtaShape(1, 2, 4)
    # the packed layout (pairs) at 9..16 rows: four row tiles a warp, 8 warps along K (session 37 run 5)
    assert [w4.cta_shape(8192, m, 132, pack=True) for m in (8, 16)] == [w4.WIDE, w4.PACKED_WIDE]
    assert w4.cta_shape(8192, 16, 132, pack="tiles") == w4.WIDE
    assert w4.cta_shape(2048, 16, 132, pack=True) == w4.HALF_WIDE
    assert w4.HALF_WIDE == w4.CtaShape(1, 2, 4) and w4.WIDE.rows == 64 and w4.NARROW.rows == 16


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


# ------------------------------------------------------------------------------- the packed NVFP4 layout (`pack`)


def _same_or_nan(a, b):
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_packed_decode_covers_every_code_and_scale(dtype):
    """Every e2m1 code in every position of a word against every e4m3 byte (subnormals, both signs, zero, NaN):
    the packed kernel's shifts, masks, merges and scale mads (for bf16 and f16 x) give the exact weight."""
    scale_bytes = torch.arange(256, dtype=torch.uint8)
    n = scale_bytes.numel()
    g = torch.Generator().manual_seed(1)
    codes = torch.stack([torch.randperm(16, generator=g) for _ in range(4 * n)]).reshape(n, 64).to(torch.uint8)
    w_fp4 = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scales = scale_bytes.repeat_interleave(4).reshape(n, 4).view(torch.float8_e4m3fn)
    words, blocks = w4.pack_nvfp4(w_fp4, scales, dtype)
    assert _same_or_nan(w4.decode_packed_nvfp4_words(words, blocks, 64, dtype), _exact_nvfp4(w_fp4, scales))


def test_packed_bit_places_cover_each_word_once():
    """Each packed word holds its 8 codes' 32 bits once; pair P is codes 2P, 2P + 1 (the k slots of one x word)."""
    for f16 in (False, True):
        sources = w4._pack_bit_sources(f16)
        assert sorted(sources) == [(c, b) for c in range(8) for b in range(4)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, k", [(5, 64), (3, 48), (17, 16), (2, 4096)])
def test_packed_layout_round_trip(n, k, dtype):
    """pack_nvfp4 then unpack_nvfp4: the same codes and scales byte for byte where the scales are positive (a
    quantizer's), the same weights for any finite scales; the padding decodes to zeros."""
    w_fp4, scales = _random_nvfp4(n, k, seed=n * 1000 + k)
    kp = w4.padded_k("nvfp4", k)
    words, blocks = w4.pack_nvfp4(w_fp4, scales, dtype)
    assert words.dtype == torch.int32 and tuple(words.shape) == (n, kp // 8)
    assert blocks.dtype == torch.int32 and tuple(blocks.shape) == (n, kp // 64)
    assert torch.equal(w4.decode_packed_nvfp4_words(words, blocks, k, dtype), _exact_nvfp4(w_fp4, scales))
    w_back, s_back = w4.unpack_nvfp4(words, blocks, dtype)
    assert torch.equal(_exact_nvfp4(w_back, s_back)[:, :k], _exact_nvfp4(w_fp4, scales))
    assert not _exact_nvfp4(w_back, s_back)[:, k:].any()
    magnitude = scales.view(torch.uint8) & 0x7F
    positive = torch.where(magnitude == 0, 1, magnitude).to(torch.uint8).view(torch.float8_e4m3fn)
    words, blocks = w4.pack_nvfp4(w_fp4, positive, dtype)
    w_back, s_back = w4.unpack_nvfp4(words, blocks, dtype)
    assert torch.equal(w_back[:, : k // 2], w_fp4) and not w_back[:, k // 2:].any()
    assert torch.equal(s_back[:, : k // 16].view(torch.uint8), positive.view(torch.uint8))


def test_packed_weights_are_prepared_once_per_dtype_and_scales():
    from fa4_inductor.kernels import prepared_weights

    w_fp4, scales = _random_nvfp4(4, 128, seed=4)
    first = w4.prepare_nvfp4_packed(w_fp4, scales, torch.bfloat16)
    assert w4.prepare_nvfp4_packed(w_fp4, scales, torch.bfloat16) is first
    assert w4.prepare_nvfp4_packed(w_fp4, scales, torch.float16) is not first
    assert any(kind == ("w4a16_nvfp4_packed", torch.bfloat16) for _, kind, _ in prepared_weights.report())
    assert w4.prepare_nvfp4_packed(w_fp4, scales.view(4, 8)[:].view(4, 8), torch.bfloat16) is first  # a view: kept
    other = scales.clone()
    assert w4.prepare_nvfp4_packed(w_fp4, other, torch.bfloat16) is not first  # another scale tensor: rebuilt
    again = w4.prepare_nvfp4_packed(w_fp4, other, torch.bfloat16)
    assert again is w4.prepare_nvfp4_packed(w_fp4, other, torch.bfloat16)
    other.view(torch.uint8)[0, 0] ^= 1  # changed in place: rebuilt
    assert w4.prepare_nvfp4_packed(w_fp4, other, torch.bfloat16) is not again


def test_pack_keys_and_switch():
    from fa4_inductor.kernels import switches

    cta = w4.WIDE
    assert w4.keys(torch.bfloat16, "nvfp4", 3, True, False, ARCH, cta, pack=True)[0].pack
    assert not w4.keys(torch.bfloat16, "nvfp4", 3, True, False, ARCH, cta)[0].pack
    assert not w4.keys(torch.bfloat16, "nvfp4", 3, True, False, ARCH, cta, pack=True)[1].pack  # the reduce
    with pytest.raises(ValueError, match="packed layout is NVFP4's"):
        w4.keys(torch.bfloat16, "int8", 3, False, False, ARCH, cta, pack=True)
    assert switches.read({"FA4_INDUCTOR_W4A16_PACK": "1"}).w4a16_pack
    assert not switches.read({}).w4a16_pack and not switches.read({"FA4_INDUCTOR_W4A16_PACK": "off"}).w4a16_pack


def _pack_key(dtype, m, split, cta="wide", tiled=False):
    return w4._Key("main", dtype, "nvfp4", m, split, False, ARCH, w4.WIDE if cta == "wide" else w4.NARROW, False,
                   "registers", pack=True, tiled=tiled)


@pytest.mark.slow  # 8 s: the fast tier's 5 minutes
def test_packed_variant_compiles(cute_dsl):
    key = _pack_key(torch.bfloat16, 8, False)
    assert callable(w4.compiled(key)) and w4.compiled(key) is not w4.compiled(key._replace(pack=False))
    tiled = _pack_key(torch.float16, 16, True, "narrow", tiled=True)
    assert callable(w4.compiled(tiled)) and w4.compiled(tiled) is not w4.compiled(tiled._replace(tiled=False))


@pytest.mark.parametrize("n, k", [(5, 64), (17, 192), (32, 128)])
def test_tiled_words_round_trip(n, k):
    """tile_words puts row n's chunk c at (n // 16 * chunks + c) * 16 + n % 16, zeros past N; untile_words undoes it."""
    w_fp4, scales = _random_nvfp4(n, k, seed=k)
    words, _ = w4.pack_nvfp4(w_fp4, scales)
    chunks = words.shape[1] // 8
    tiled = w4.tile_words(words)
    assert tiled.shape == (-(-n // 16) * chunks * 16, 8)
    for row in range(n):
        for c in range(chunks):
            assert torch.equal(tiled[(row // 16 * chunks + c) * 16 + row % 16], words[row, 8 * c:8 * c + 8])
    assert torch.equal(w4.untile_words(tiled, n, chunks), words)
    assert tiled.abs().sum() == words.abs().sum()


def test_tiled_keys():
    from fa4_inductor.kernels import switches

    key = w4.keys(torch.bfloat16, "nvfp4", 3, False, False, ARCH, w4.WIDE, pack="tiles")[0]
    assert key.pack and key.tiled
    with pytest.raises(ValueError, match="register load paths only"):
        w4.keys(torch.bfloat16, "nvfp4", 3, False, False, ARCH, w4.WIDE, load="bulk", pack="tiles")
    with pytest.raises(ValueError, match="NVFP4 layout"):
        w4.keys(torch.bfloat16, "nvfp4", 3, False, False, ARCH, w4.WIDE, pack="rows")
    assert switches.read({"FA4_INDUCTOR_W4A16_PACK": "tiles"}).w4a16_pack == "tiles"
    with pytest.raises(ValueError, match="off, on or tiles"):
        switches.read({"FA4_INDUCTOR_W4A16_PACK": "tile"})


PACK_PTX_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
for i, spec in enumerate(sys.argv[1:]):
    dtype, m, split, cta, tiled = spec.split(",")
    key = w._Key("main", getattr(torch, dtype), "nvfp4", int(m), split == "1", False, "sm_90a",
                 w.WIDE if cta == "wide" else w.NARROW, False, "registers", pack=True, tiled=tiled == "1")
    open(f"kernel{i}.ptx", "w").write(w.compiled(key).__ptx__)
"""


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_packed_variants_compile_without_spills(cute_dsl, dtype, tmp_path):
    """Both M buckets (M = 1..8 and 9..16), split and not, both CTA shapes: the packed variants compile for sm_90a
    and, where ptxas is found, do not spill; the tiled ones too (unsplit)."""
    specs = [f"{dtype},{m},{split},{cta},0" for m in (8, 16) for split in (0, 1) for cta in ("wide", "narrow")]
    specs += [f"{dtype},{m},0,{cta},1" for m in (8, 16) for cta in ("wide", "narrow")]
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    subprocess.run([sys.executable, "-c", PACK_PTX_PROBE, *specs], env=env, cwd=tmp_path, check=True,
                   capture_output=True, text=True)
    ptxas = shutil.which("ptxas")
    for i, spec in enumerate(specs):
        ptx = tmp_path / f"kernel{i}.ptx"
        text = ptx.read_text()
        assert "mma.sync.aligned.m16n8k16" in text and "mad.lo.u32" in text, spec
        if ptxas:
            info = subprocess.run([ptxas, f"-arch={ARCH}", "-v", str(ptx), "-o", os.devnull], check=True,
                                  capture_output=True, text=True).stderr
            assert "0 bytes spill stores" in info and "0 bytes spill loads" in info, (spec, info)


# ------------------------------------------------------------------------------- fp8 (e4m3) weights

FP8_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
dtype = getattr(torch, sys.argv[1])
main, reduce = w.keys(dtype, "fp8", 9, True, True, "sm_90a", w.WIDE, row_scale=True)
unsplit = w.keys(dtype, "fp8", 3, False, True, "sm_90a", w.NARROW, load="rolling", row_scale=True)[0]
for key in (main, reduce, unsplit):
    ptx = w.compiled(key).__ptx__
    ops = sorted({l.split()[0].rstrip(";") for l in ptx.splitlines() if l.strip().startswith(("cvt.", "mma.", "ld."))})
    print(key.kernel, key.row_scale, int("local" in ptx), " ".join(ops))
"""


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fp8_variants_compile_and_decode_with_the_e4m3_cvt(cute_dsl, dtype, tmp_path):
    """fp8 weights compile on both load paths and split or not; each code pair becomes a 16-bit pair through
    `cvt.rn.f16x2.e4m3x2` (exact, NaN kept), bf16 x through fp32 (`cvt.rn.bf16x2.f32`); x's scales reach the kernel
    that writes the output (the reduce when split, the main kernel when not); no local memory."""
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    lines = subprocess.run([sys.executable, "-c", FP8_PROBE, dtype], env=env, cwd=tmp_path, check=True,
                           capture_output=True, text=True).stdout.splitlines()
    (main, main_row, main_local, *main_ops), (red, red_row, red_local, *red_ops), (_, one_row, one_local, *one_ops) = (
        line.split() for line in lines)
    assert (main, main_row, red, red_row, one_row) == ("main", "False", "reduce", "True", "True")
    assert main_local == red_local == one_local == "0"
    for ops in (main_ops, one_ops):
        assert "cvt.rn.f16x2.e4m3x2" in ops and any(op.startswith("mma.sync.aligned.m16n8k16") for op in ops), ops
        assert ("cvt.rn.bf16x2.f32" in ops) == (dtype == "bfloat16"), ops


def test_fp8_keys_and_argument_checks():
    cta = w4.NARROW
    main, reduce = w4.keys(torch.bfloat16, "fp8", 3, True, True, ARCH, cta, row_scale=True)
    assert (main.row_scale, main.bias, reduce.row_scale, reduce.bias) == (False, False, True, True)
    assert w4.keys(torch.bfloat16, "fp8", 3, False, False, ARCH, cta, row_scale=True)[0].row_scale
    with pytest.raises(ValueError, match="x's scales are fp8's"):
        w4.keys(torch.bfloat16, "int8", 3, False, False, ARCH, cta, row_scale=True)
    with pytest.raises(ValueError, match="fp8 scales of dtype torch.bfloat16"):
        w4.keys(torch.bfloat16, "fp8", 3, False, False, ARCH, cta, scale_dtype=torch.bfloat16)
    w = torch.randn(64, 32).to(torch.float8_e4m3fn)
    x = torch.randn(2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        w4.fp8_matmul(x, w.view(torch.int8), torch.ones(64))
    with pytest.raises(ValueError, match="x_scale of 1 or 2 elements"):
        w4.fp8_matmul(x, w, torch.ones(64), torch.ones(3))
    with pytest.raises(ValueError, match="runs on CUDA"):
        w4.fp8_matmul(x, w, torch.ones(1), torch.ones(2))
    assert w4.unsupported_reason(x, "fp8", 64, 32) == "the W4A16 decode GEMM runs on CUDA, not cpu"


def test_fp8_words_are_the_codes():
    """The kernel's words are the e4m3 bytes as they are (code j of a word in byte j), K padded with +0."""
    w = torch.randn(5, 40).to(torch.float8_e4m3fn)
    words = w4.byte_words(w)
    assert words.shape == (5, 16) and words.dtype == torch.int32
    codes = words.view(torch.uint8)
    assert torch.equal(codes[:, :40], w.view(torch.uint8)) and not codes[:, 40:].any()


XSMEM_PROBE = """
import sys, torch
from fa4_inductor.kernels import w4a16_decode as w
print(w.compiled(eval(sys.argv[1], {"torch": torch, "w4": w})).__ptx__)
"""


def _ptx_of(key, tmp_path):
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH)
    text = repr(key).replace("_Key(", "w4._Key(").replace("CtaShape(", "w4.CtaShape(")
    return subprocess.run([sys.executable, "-c", XSMEM_PROBE, text], env=env, cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout


XSMEM_VARIANTS = [  # (format, M bucket, pack, CTA, load, x steps)
    ("nvfp4", 16, True, (2, 4, 1), "xsmem:2", 16),
    ("nvfp4", 8, False, (4, 2, 1), "xsmem:3", 2),
    ("int8", 16, False, (1, 8, 1), "xsmem:2", 32),
    ("fp8", 16, False, (2, 4, 1), "xsmem:3", 4),
]


@pytest.mark.slow
@pytest.mark.parametrize("variant", XSMEM_VARIANTS, ids=_ids)
def test_xsmem_variant_compiles_without_spills_or_x_registers(cute_dsl, variant, tmp_path):
    """The xsmem path (x's CTA range in shared memory): its MMAs take x from 16-byte shared loads (none from global
    memory in the K loop) and it copies x with 16-byte cp.async; no local memory."""
    fmt, m, pack, cta, load, x_steps = variant
    key = w4._Key("main", torch.bfloat16, fmt, m, False, fmt != "nvfp4", ARCH, w4.CtaShape(*cta), False, load,
                  pack=pack, row_scale=fmt == "fp8", x_steps=x_steps)
    ptx = _ptx_of(key, tmp_path)
    assert "ld.shared.v4.b32" in ptx and "cp.async.cg.shared.global" in ptx and ", 16, " in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx
    x_loads = ptx.count("ld.shared.v4.b32")
    mmas = ptx.count("mma.sync.aligned.m16n8k16")
    groups, words_a_block = m // 8, 1 if fmt == "nvfp4" else 2
    # one 16-byte shared load a group for each 4-word block of x, for every MMA of the block's words and row tiles
    per_block_mmas = groups * cta[0] * words_a_block * (2 if fmt == "nvfp4" else 1)
    assert mmas == x_loads * per_block_mmas // groups, (mmas, x_loads)


@pytest.mark.slow
@pytest.mark.parametrize("fmt, load, without, burst", [("nvfp4", "xsmem+prefetch:2", "xsmem:2", 4),
                                                        ("int8", "xsmem+2ctas+prefetch6:3", "xsmem+2ctas:3", 6)])
def test_xsmem_prefetch_requests_each_rows_burst_into_l2(cute_dsl, fmt, load, without, burst, tmp_path):
    """"xsmem+prefetch": the K loop asks L2 for `burst` lines (steps) of the lane's burst rows (one of the four rows
    of its lane group at two row tiles) a burst, and NVFP4 for the line of their block scales, beside the path's own
    loads (the same MMAs and x loads); no local memory."""
    cta = (2, 8, 1)
    key = lambda spec: w4._Key("main", torch.bfloat16, fmt, 16, False, False, ARCH, w4.CtaShape(*cta), False,  # noqa
                               spec, x_steps=4)
    ptx, plain = _ptx_of(key(load), tmp_path), _ptx_of(key(without), tmp_path)
    rows = -(-2 * cta[0] // 4)  # the lane's rows of the burst: its lane group's rows t, t + 4, ...
    assert ptx.count("prefetch.global.L2") == rows * (burst + (fmt == "nvfp4")), ptx.count("prefetch.global.L2")
    assert "prefetch.global.L2" not in plain
    for op in ("mma.sync.aligned.m16n8k16", "ld.shared.v4.b32", "cp.async.cg.shared.global"):
        assert ptx.count(op) == plain.count(op), op
    assert "ld.local" not in ptx and "st.local" not in ptx


@pytest.mark.slow
@pytest.mark.parametrize("fmt, load, without, parts", [("nvfp4", "xsmem+parts4:2", "xsmem:2", 4),
                                                        ("int8", "xsmem+parts3:3", "xsmem:3", 3)])
def test_xsmem_in_parts_waits_for_each_part_on_its_own_mbarrier(cute_dsl, fmt, load, without, parts, tmp_path):
    """"xsmem+parts<n>": x's copy is issued part by part, every thread arriving on the part's mbarrier once its copies
    land (`cp.async.mbarrier.arrive.noinc`), and the K loop waits on a part's mbarrier where it starts, with no
    `cp.async.wait_group` and no CTA barrier after the copy (one before it, for the mbarriers' init); the same MMAs
    and x loads as the path in one part; no local memory."""
    key = lambda spec: w4._Key("main", torch.bfloat16, fmt, 16, False, False, ARCH, w4.CtaShape(2, 8, 1), False,  # noqa
                               spec, x_steps=16)
    ptx, whole = _ptx_of(key(load), tmp_path), _ptx_of(key(without), tmp_path)
    assert ptx.count("cp.async.mbarrier.arrive.noinc") == parts and "cp.async.mbarrier.arrive" not in whole
    assert ptx.count("mbarrier.init") == parts and "mbarrier.init" not in whole
    assert "mbarrier.try_wait" in ptx
    assert "cp.async.wait_group" not in ptx and "cp.async.wait_group" in whole
    assert ptx.count("bar.sync") == whole.count("bar.sync"), (ptx.count("bar.sync"), whole.count("bar.sync"))
    # each part's copy loop is its own (unrolled further by LLVM where its trip count is short)
    assert ptx.count("cp.async.cg.shared.global") >= parts * whole.count("cp.async.cg.shared.global")
    for op in ("mma.sync.aligned.m16n8k16", "ld.shared.v4.b32"):
        assert ptx.count(op) == whole.count(op), op
    assert "ld.local" not in ptx and "st.local" not in ptx


@pytest.mark.slow
@pytest.mark.parametrize("m, cta", [(16, (1, 16, 1)), (8, (2, 8, 1))])
def test_xsmem_permuted_x_takes_the_mmas_x_operands_as_loaded(cute_dsl, m, cta, tmp_path):
    """"xsmem+xperm" (plain NVFP4): x's shared copy is rewritten once (`permute_x`: a 16-byte load, four prmt and a
    16-byte store a block), and the K loop feeds the MMAs x's words as loaded: two prmt a MMA of one row tile fewer, the
    same MMAs, the rewrite's shared loads beside the loop's; no local memory. int8 and the packed layout ignore it."""
    key = lambda spec, fmt="nvfp4", pack=False: w4._Key(  # noqa: E731
        "main", torch.bfloat16, fmt, m, False, False, ARCH, w4.CtaShape(*cta), False, spec, pack=pack, x_steps=4)
    ptx, plain = _ptx_of(key("xsmem+xperm:2"), tmp_path), _ptx_of(key("xsmem:2"), tmp_path)
    mmas = plain.count("mma.sync.aligned.m16n8k16")
    assert ptx.count("mma.sync.aligned.m16n8k16") == mmas
    rewrites = ptx.count("st.shared.v4.b32")  # the rewrite's loop body, as many times as LLVM unrolls it
    assert rewrites >= 1 and "st.shared.v4.b32" not in plain
    fewer = plain.count("prmt.b32") - ptx.count("prmt.b32")
    assert fewer == 2 * mmas // cta[0] - 4 * rewrites, (fewer, mmas, rewrites)  # a warp's row tiles share x's operands
    assert ptx.count("ld.shared.v4.b32") == plain.count("ld.shared.v4.b32") + rewrites
    assert ptx.count("bar.sync") == plain.count("bar.sync") + 1
    assert "ld.local" not in ptx and "st.local" not in ptx
    for other in (dict(fmt="int8"), dict(pack=True)):
        assert _ptx_of(key("xsmem+xperm:2", **other), tmp_path) == _ptx_of(key("xsmem:2", **other), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m, cta, spec, x_steps", [(16, (1, 16, 1), "xsmem:2", 4), (8, (2, 2, 4), "rolling", 0),
                                                   (8, (1, 1, 8), "registers", 0)])
def test_rotated_decode_is_two_instructions_a_word_fewer(cute_dsl, dtype, m, cta, spec, x_steps, tmp_path):
    """"+rot" (plain NVFP4, on the xsmem, rolling and register paths): each weight word rotated once (`shf.l.wrap`) for
    its pairs' signs, and each pair one lop3 and one shift or rotation (`nvfp4_rotated_pair`): the PTX's shifts and
    rotations (shl, shr, shf) a word two fewer, the same MMAs; no local memory. int8 ignores it. (The decode's bits:
    the emulation tests, `decode_nvfp4_words(..., rotated=True)`.)"""
    key = lambda spec, fmt="nvfp4": w4._Key(  # noqa: E731
        "main", dtype, fmt, m, False, False, ARCH, w4.CtaShape(*cta), False, spec, x_steps=x_steps)
    base, _, sets = spec.partition(":")
    rotated = base + "+rot" + (":" + sets if sets else "")
    ptx, plain = _ptx_of(key(rotated), tmp_path), _ptx_of(key(spec), tmp_path)
    mmas = plain.count("mma.sync.aligned.m16n8k16")
    words = 2 * mmas // (2 * (m // 8))  # a word pair (rows g, g + 8) feeds two MMAs a row group
    shifts = lambda t: sum(t.count(op) for op in ("shl.b32", "shr.s32", "shr.u32", "shf."))  # noqa: E731
    assert ptx.count("mma.sync.aligned.m16n8k16") == mmas
    assert shifts(plain) - shifts(ptx) == 2 * words, (shifts(plain), shifts(ptx), words)
    from fa4_inductor.kernels.cute.w4a16_decode_gemm import nvfp4_rotated_pair

    rotations = 1 + sum(nvfp4_rotated_pair(j, dtype == torch.float16)[2] < 0 for j in range(4))  # the word's, pairs'
    assert ptx.count("shf.l.wrap.b32") == rotations * words
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert _ptx_of(key(rotated, "int8"), tmp_path) == _ptx_of(key(spec, "int8"), tmp_path)


def test_xsmem_permuted_x_blocks_are_the_plain_words_x_operands():
    """`permute_x`'s block order is what the plain NVFP4 word's MMAs read: block word 2q + s = prmt(x word q, x word
    q + 2, X_PAIR_SELECTORS[s]), the operands `word_products` builds without "+xperm" (emulated prmt)."""
    from fa4_inductor.kernels.cute.w4a16_decode_gemm import PERMUTED_X, X_PAIR_SELECTORS

    g = torch.Generator().manual_seed(7)
    w = [int(v) for v in torch.randint(0, 2 ** 32, (4,), generator=g, dtype=torch.int64)]
    permuted = [int(w4._prmt(w[a], w[b], X_PAIR_SELECTORS[s])) for a, b, s in PERMUTED_X]
    for q in range(2):
        for s in range(2):
            assert permuted[2 * q + s] == int(w4._prmt(w[q], w[q + 2], X_PAIR_SELECTORS[s]))


def test_xsmem_parts_are_whole_k_loop_iterations():
    from fa4_inductor.kernels.cute.w4a16_decode_gemm import W4A16DecodeGemm

    part_steps = lambda x_steps, parts, sets: W4A16DecodeGemm(  # noqa: E731
        None, "nvfp4", 2, True, False, 2, 8, 1, load="xsmem", x_steps=x_steps, sets=sets, x_parts=parts).part_steps
    assert part_steps(8, 4, 2) == 2 and part_steps(16, 4, 2) == 4 and part_steps(16, 3, 3) == 6
    assert part_steps(2, 4, 2) == 2 and part_steps(16, 1, 2) == 16 and part_steps(8, 3, 2) == 4


def test_xsmem_plan_raises_splits_until_x_fits_shared_memory():
    from fa4_inductor.kernels.cute import w4a16_decode_gemm as g  # noqa: F401  (XSmemLayout's sizes)

    assert w4.xsmem_max_steps(16, "nvfp4") == 16 and w4.xsmem_max_steps(8, "nvfp4") == 32
    assert w4.xsmem_max_steps(16, "int8") == 32 and w4.xsmem_max_steps(8, "fp8") == 64
    shape = w4.CtaShape(2, 4, 1)  # 128 rows a CTA
    # 8192 x 8192 NVFP4 at 16 rows: 64 CTAs, the rule's 2 splits (66 chunks of 64 -> 16 steps: fits)
    assert w4.xsmem_plan(16, 8192, 8192, "nvfp4", shape, 132, None) == (2, 16)
    # 4096 x 14336: the rule's 4 splits hold 56 chunks = 14 steps -> a 16-step copy
    assert w4.xsmem_plan(16, 4096, 14336, "nvfp4", shape, 132, None) == (4, 16)
    # 16384 rows cover the SMs unsplit, but 14336 columns (224 chunks, 56 steps) do not fit: raised to 4 splits
    assert w4.xsmem_plan(16, 16384, 14336, "nvfp4", shape, 132, None) == (4, 16)
    assert w4.xsmem_plan(3, 512, 2048, "int8", shape, 132, 1) == (1, 16)
    with pytest.raises(ValueError, match="2 splits leave 28 steps of x a CTA; the xsmem path holds 16"):
        w4.xsmem_plan(16, 8192, 14336, "nvfp4", shape, 132, 2)
    with pytest.raises(ValueError, match="takes CTAs of one warp along K"):
        w4.xsmem_plan(16, 8192, 8192, "nvfp4", w4.WIDE, 132, None)
    with pytest.raises(ValueError, match="one warp along K and its x steps"):
        w4.keys(torch.bfloat16, "nvfp4", 16, False, False, ARCH, w4.WIDE, load="xsmem", x_steps=4)
    with pytest.raises(ValueError, match="one warp along K and its x steps"):
        w4.keys(torch.bfloat16, "nvfp4", 16, False, False, ARCH, shape, load="xsmem")
    assert w4.xsmem_buckets("xsmem:3", 16, "nvfp4", shape) == (2, 4, 8, 16)
    assert w4.xsmem_buckets("rolling", 16, "nvfp4", w4.WIDE) == (0,)
    with pytest.raises(ValueError, match="FA4_INDUCTOR_W4A16_CTA=RTxWNx1"):
        w4.xsmem_buckets("xsmem", 16, "nvfp4", w4.WIDE)


def test_auto_takes_x_from_shared_memory_over_large_weights():
    """`xsmem_cta`: on the "auto" load path, NVFP4 calls of 9..16 rows take CTAs of one K warp and the xsmem path over
    weights with K of at least 4096 (1 x 16 x 1 from 4096 rows, 1 x 8 x 1 over fewer), from 2048 rows at K >= 2048
    (1 x 8 x 1) and over long ones (14336 along N or K, from 4096 rows) at any K; 2..8 rows over the same wide weights
    (plain layout) but those whose 64-row CTAs fill one wave of the SMs; int8 calls of 9..16 rows over fewer than 4096
    rows with K >= 4096; split as `xsmem_plan` says, plain NVFP4 with `xsmem_auto_spec`'s options. The rest keep their
    CTAs."""
    wide, narrow = "xsmem+xperm+rot", "xsmem+rot"
    def plan(n, k, m, fmt="nvfp4", pack=False):
        shape, load, splits, _ = w4.call_plan(m, n, w4.padded_k(fmt, k), fmt, 132, load="auto", pack=pack)
        return "x".join(map(str, shape)), load, splits

    assert plan(8192, 8192, 16) == ("1x16x1", wide, 4)
    assert plan(8192, 8192, 9, pack=True) == ("1x16x1", "xsmem", 4)
    assert plan(4096, 8192, 9, pack=True) == ("1x16x1", "xsmem", 8)
    assert plan(14336, 4096, 12) == ("1x16x1", wide, 2)
    assert plan(4096, 14336, 16) == plan(4096, 4096, 16) == ("1x16x1", wide, 8)
    assert plan(128256, 4096, 16) == plan(128256, 2048, 9) == ("1x16x1", wide, 1)
    assert plan(14336, 2048, 16) == ("1x16x1", wide, 2)
    assert plan(8192, 8192, 16, pack="tiles") == ("2x2x4", "rolling", 1)
    assert plan(8192, 2048, 16) == ("2x2x4", "rolling", 1)
    assert plan(2048, 8192, 16) == ("1x8x1", narrow, 8)
    assert plan(2048, 14336, 9) == ("1x8x1", narrow, 8)
    assert plan(1024, 4096, 16)[:2] == plan(512, 4096, 9)[:2] == ("1x8x1", narrow)
    assert plan(1024, 2048, 16) == plan(512, 2048, 16) == ("1x1x8", "rolling+2ctas", 1)
    assert plan(2048, 2048, 16)[:2] == plan(2048, 4096, 9)[:2] == ("1x8x1", narrow)
    assert plan(2048, 1024, 16) == ("1x2x4", "rolling+2ctas", 1)
    assert plan(2048, 8192, 8) == ("1x1x8", "registers", 1)
    assert plan(8192, 8192, 8) == ("2x2x4", "rolling", 1)
    assert plan(14336, 4096, 5) == plan(14336, 4096, 8) == ("1x16x1", wide, 2)
    assert plan(4096, 14336, 8) == plan(4096, 4096, 5) == ("1x16x1", wide, 8)
    assert plan(14336, 2048, 8)[:2] == ("1x16x1", wide)
    assert plan(8192, 2048, 5)[:2] == ("2x2x4", "rolling")
    assert [w4.wide_ctas_fill_one_wave(n, 132) for n in (6336, 6400, 8192, 8448, 8512)] == [
        False, True, True, True, False]
    assert plan(128256, 4096, 8) == plan(128256, 2048, 5) == ("1x16x1", wide, 1)
    assert plan(14336, 4096, 4) == plan(14336, 4096, 2) == ("1x16x1", wide, 2)
    assert plan(128256, 2048, 3) == ("1x16x1", wide, 1)
    assert plan(14336, 4096, 1)[:2] == plan(14336, 4096, 8, pack=True)[:2] == plan(8192, 4096, 4)[:2] == (
        "2x2x4", "rolling")
    assert w4.XSMEM_WIDE in w4.auto_ctas(2) and w4.XSMEM_WIDE not in w4.auto_ctas(1) + w4.auto_ctas(8, pack=True)
    assert [c for c in w4.auto_ctas(16, fmt="int8") + w4.auto_ctas(8, fmt="int8") if c.warps_k == 1] == [
        w4.XSMEM_NARROW]
    assert all(c.warps_k > 1 for c in w4.auto_ctas(16, fmt="fp8") + w4.auto_ctas(16, pack="tiles"))
    assert plan(8192, 8192, 16, "int8") == ("1x1x8", "rolling+2ctas", 1)
    assert plan(1024, 4096, 16, "int8")[:2] == plan(2048, 8192, 9, "int8")[:2] == ("1x8x1", "xsmem")
    assert plan(2048, 2048, 16, "int8") == ("1x1x8", "rolling+2ctas", 1)
    assert plan(1024, 4096, 8, "int8")[:2] == ("1x1x8", "rolling")
    assert plan(1024, 4096, 16, "fp8")[:2] == ("1x1x8", "rolling+2ctas")
    # a forced load path keeps the former CTAs (`cta_shape` sees K only on "auto")
    assert w4.cta_shape(8192, 16, 132) == w4.WIDE


def test_xsmem_layout_reads_are_bank_conflict_free():
    """Each 8-lane phase of the K loop's 16-byte shared loads (lanes 4 g + t: row g, the step's chunk t) covers the 32
    banks once, for every format and x copy size; the copy's 16-byte stores (consecutive pieces of a chunk) too."""
    from fa4_inductor.kernels.cute.w4a16_decode_gemm import LANES_K, XSmemLayout

    for x_words in (32, 16):
        for steps in (1, 2, 4, 16, 64):
            pitch, chunk = XSmemLayout.pitch(steps, x_words), XSmemLayout.chunk_words(x_words)
            assert pitch % 4 == 0 and chunk % 4 == 0 and pitch >= steps * LANES_K * chunk
            for phase in range(4):
                lanes = range(8 * phase, 8 * phase + 8)
                banks = {(lane // 4 * pitch + lane % 4 * chunk) % 32 // 4 for lane in lanes}
                assert len(banks) == 8, (x_words, steps, phase, banks)


@pytest.mark.slow
def test_pdl_split_call_waits_in_its_reduce_and_copies_x_after_the_wait(cute_dsl, tmp_path):
    """A split call under PDL: the reduce kernel is a dependent too, and reads the partials only after
    `griddepcontrol.wait`; the xsmem main kernel issues its first weight loads before its wait and copies x after it."""
    main, reduce = w4.keys(torch.bfloat16, "nvfp4", 16, True, False, ARCH, w4.XSMEM_WIDE, True, "xsmem", x_steps=4)
    assert reduce.kernel == "reduce" and reduce.pdl and main.pdl
    ptx = _ptx_of(reduce, tmp_path)
    body = ptx[ptx.index(".entry"):]
    assert 0 <= body.find("griddepcontrol.wait") < body.find("ld.global"), body[:2000]
    ptx = _ptx_of(main, tmp_path)
    body = ptx[ptx.index(".entry"):]
    assert 0 <= body.find("ld.global.v4") < body.find("griddepcontrol.wait") < body.find("cp.async.cg")
    assert not w4.keys(torch.bfloat16, "nvfp4", 16, True, False, ARCH, w4.WIDE, False)[1].pdl
