"""GPU tier of the weight-only decode GEMM (`kernels/w4a16_decode.py`): run with `pytest -m gpu` on the H200.

Numerics against the float64 exact dequantization on fresh random inputs: the max abs error is at most
2x PyTorch's own error (the weight dequantized to x's dtype, then cuBLAS) plus 1e-5 of the output's
scale. Every case prints its shape, split count, load path and errors (`-s` shows them), so a failure says
where it is. The numerics tests run on the load paths (`LOADS`; the rolling path's register cap, the bulk ring's
wrap-around at depth 2 and the bulk options in the split, short-K and large-weight tests), and the NVFP4 ones on
both layouts (`PACKS`: plain, and packed once by `w4a16_decode.pack_nvfp4`, for bf16 and f16 x). The `gemv` tests
run the CUDA-core GEMV (`gemv=True`, FA4_INDUCTOR_W4A16_GEMV=1) on M = 1..4; the `int_gemv` ones the integer one-row
NVFP4 GEMV (`kernels/nvfp4_int_gemv.py`), also against its arithmetic emulated on the CPU.
"""

import pytest
import torch
import torch.nn.functional as F

from fa4_inductor.kernels import switches, w4a16_decode as w4
from gpu_helpers import capture
from test_nvfp4_linear import float64_dequantized, random_nvfp4

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LOADS = ["registers", "rolling", "bulk"]
MORE_LOADS = LOADS + ["rolling+2ctas", "bulk:2", "bulk+ahead+prefetch", "bulk+scales:3"]  # rings wrapping often
PACKS = [False, True, "tiles"]
PACK_IDS = ["plain", "packed", "tiles"]


def skip_tiles_off_registers(pack, load):
    if pack == "tiles" and load.startswith("bulk"):
        pytest.skip("the tiled layout runs on the register load paths only")


def report(name, out, ref, pytorch):
    err = (out.double() - ref).abs()
    pt_err = (pytorch.double() - ref).abs().max().item()
    worst = divmod(err.argmax().item(), ref.shape[1])
    scale = ref.abs().max().item()
    print(f"{name}: max|err| {err.max().item():.3g} at (m, n) = {worst} (out {out[worst].item():.5g} ref "
          f"{ref[worst].item():.5g}), PyTorch {pt_err:.3g}, |ref| max {scale:.3g}, "
          f"rows with err > bound: {(err > 2 * pt_err + 1e-5 * scale).any(1).nonzero().flatten().tolist()[:8]}")
    assert out.isfinite().all(), f"{name}: non-finite values at {(~out.isfinite()).nonzero()[:8].tolist()}"
    assert err.max().item() <= 2 * pt_err + 1e-5 * scale, name


def plan(n, k, fmt, m, splits, cta, load, pack=False):
    shape, load, splits, _ = w4.call_plan(m, n, w4.padded_k(fmt, k), fmt, w4._num_sms(0), cta, load, splits, pack)
    return f"cta {'x'.join(map(str, shape))} splits {splits} {load}{' packed' if pack else ''}"


def gemv_plan(n, k, fmt, gemv=True):
    rows, warps_k, splits = (*gemv, 1)[:3] if isinstance(gemv, tuple) else w4.gemv_shape(
        n, w4.padded_k(fmt, k) // w4.CHUNK_VALUES[fmt] * 2, w4._num_sms(0))
    return f"gemv rows {rows} warps_k {warps_k}" + (f" splits {splits}" if splits > 1 else "")


def nvfp4_case(m, n, k, dtype, splits=None, seed=0, load="registers", cta=None, pack=False, gemv=False):
    w_fp4, block, global_scale = random_nvfp4(n, k, seed=seed, device="cuda")
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    out = w4.nvfp4_matmul(x, w_fp4, block, global_scale, splits=splits, load=load, cta=cta, pack=pack, gemv=gemv)
    assert out.shape == (m, n) and out.dtype == dtype
    wd = float64_dequantized(w_fp4, block, global_scale)
    ref = x.double() @ wd.T
    pytorch = F.linear(x, wd.to(dtype))
    how = gemv_plan(n, k, "nvfp4", gemv) if gemv and m <= w4.GEMV_MAX_M else plan(n, k, 'nvfp4', m, splits, cta, load,
                                                                                     pack)
    report(f"nvfp4 {str(dtype)[6:]} m{m} n{n} k{k} {how}", out, ref, pytorch)


def int8_case(m, n, k, dtype, bias, splits=None, seed=0, load="registers", cta=None, scale_dtype=torch.float32,
              gemv=False):
    g = torch.Generator().manual_seed(seed)
    w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g).cuda()
    scale = (torch.rand(n, generator=g) / 100 + 1e-3).to(scale_dtype).cuda()
    b = torch.randn(n, dtype=dtype, device="cuda") if bias else None
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    out = w4.int8_matmul(x, w_int8, scale, b, splits=splits, load=load, cta=cta, gemv=gemv)
    assert out.shape == (m, n) and out.dtype == dtype
    wd = w_int8.double() * scale.double()[:, None]
    ref = x.double() @ wd.T + (b.double() if bias else 0)
    pytorch = F.linear(x, wd.to(dtype), b)
    how = gemv_plan(n, k, "int8", gemv) if gemv and m <= w4.GEMV_MAX_M else plan(n, k, 'int8', m, splits, cta, load)
    report(f"int8 {str(dtype)[6:]} m{m} n{n} k{k} bias {bias} scales {str(scale_dtype)[6:]} {how}", out, ref,
           pytorch)


@pytest.mark.parametrize("pack", PACKS, ids=PACK_IDS)
@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("m", range(1, 17))
def test_nvfp4_every_m(m, load, pack):
    skip_tiles_off_registers(pack, load)
    nvfp4_case(m, 1000, 2064, torch.bfloat16, seed=m, load=load, pack=pack)  # N, K not multiples of 16 rows, 64


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("m", range(1, 17))
def test_int8_every_m(m, load):
    int8_case(m, 1000, 2064, torch.bfloat16, bias=m % 2 == 1, seed=m, load=load)  # N, K not multiples of 64


@pytest.mark.parametrize("load", MORE_LOADS)
@pytest.mark.parametrize("fmt", ["nvfp4", "int8"])
@pytest.mark.parametrize("splits", [1, 2, 7])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_forced_splits_and_dtypes(fmt, splits, dtype, load):
    if fmt == "nvfp4":
        nvfp4_case(5, 333, 4096, dtype, splits=splits, seed=splits, load=load)
    else:
        int8_case(5, 333, 4096, dtype, bias=True, splits=splits, seed=splits, load=load)


@pytest.mark.parametrize("load", MORE_LOADS)
@pytest.mark.parametrize("splits", [1, 2, 7])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("pack", [True, "tiles"], ids=["packed", "tiles"])
def test_packed_splits_and_dtypes(splits, dtype, load, pack):
    skip_tiles_off_registers(pack, load)
    nvfp4_case(5, 333, 4096, dtype, splits=splits, seed=splits, load=load, pack=pack)


def signed_scale_case(m, n, k, dtype):
    """x [m, k] and an NVFP4 weight [n, k] whose block scales are every e4m3 byte but NaN (negative, zero, subnormal),
    with a float32 global scale."""
    g = torch.Generator().manual_seed(m)
    w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g).cuda()
    scale_bytes = torch.randint(0, 256, (n, k // 16), dtype=torch.uint8, generator=g)
    scale_bytes = torch.where(scale_bytes & 0x7F == 0x7F, 0x38, scale_bytes)  # NaN -> 1.0
    block = scale_bytes.view(torch.float8_e4m3fn).cuda()
    return torch.randn(m, k, dtype=dtype, device="cuda"), w_fp4, block, torch.tensor(3e-3, device="cuda")


@pytest.mark.parametrize("pack", PACKS, ids=PACK_IDS)
@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_nvfp4_signed_zero_and_subnormal_block_scales(dtype, m, pack):
    """Block scales of every e4m3 byte but NaN (negative, zero, subnormal: the packed layout folds signs into the
    codes and zeroes zero-scaled blocks), odd N and K."""
    n, k = 333, 4160
    x, w_fp4, block, global_scale = signed_scale_case(m, n, k, dtype)
    for splits in (None, 3):
        out = w4.nvfp4_matmul(x, w_fp4, block, global_scale, splits=splits, pack=pack)
        wd = float64_dequantized(w_fp4, block, global_scale)
        report(f"nvfp4 signed scales {str(dtype)[6:]} m{m} {plan(n, k, 'nvfp4', m, splits, None, 'registers', pack)}",
               out, x.double() @ wd.T, F.linear(x, wd.to(dtype)))


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_int8_scales_read_in_their_own_dtype(dtype, scale_dtype, splits):
    """bf16 / fp16 per-channel scales (torchao's, gpt-fast's) go to a kernel variant that widens them where it
    reads them: no fp32 copy a call, and the same sums as the fp32 copy of the same scales."""
    int8_case(3, 700, 1024, dtype, bias=True, splits=splits, seed=splits, scale_dtype=scale_dtype)
    g = torch.Generator().manual_seed(7)
    w_int8 = torch.randint(-128, 128, (512, 1024), dtype=torch.int8, generator=g).cuda()
    scale = (torch.rand(512, generator=g) / 100 + 1e-3).to(scale_dtype).cuda()
    x = torch.randn(2, 1024, dtype=dtype, device="cuda")
    assert torch.equal(w4.int8_matmul(x, w_int8, scale, splits=splits), w4.int8_matmul(x, w_int8, scale.float(),
                                                                                        splits=splits))


@pytest.mark.parametrize("pack", PACKS, ids=PACK_IDS)
@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("cta", [(1, 1, 8), (2, 2, 4), (1, 2, 8), (2, 1, 2), (4, 2, 4), (4, 1, 8)],
                         ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("m", [1, 9])
def test_forced_cta_shapes(cta, m, load, pack):
    """Every CTA shape the rule or FA4_INDUCTOR_W4A16_CTA can pick: odd N and K, split and not."""
    skip_tiles_off_registers(pack, load)
    for splits in (None, 3):
        nvfp4_case(m, 333, 4160, torch.bfloat16, splits=splits, seed=m, cta=cta, load=load, pack=pack)
        nvfp4_case(m, 333, 4160, torch.float16, splits=splits, seed=m + 1, cta=cta, load=load, pack=pack)
        if not pack:
            int8_case(m, 333, 4128, torch.float16, bias=True, splits=splits, seed=m, cta=cta, load=load)


XSMEM_CTAS = [(2, 4, 1), (1, 8, 1), (4, 2, 1)]


@pytest.mark.parametrize("load", ["xsmem", "xsmem:3", "xsmem+2ctas", "xsmem+prefetch", "xsmem+parts4",
                                  "xsmem+parts3:3", "xsmem+xperm", "xsmem+prefetch6+xperm:3", "xsmem+rot",
                                  "xsmem+xperm+rot"])
@pytest.mark.parametrize("cta", XSMEM_CTAS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_x_from_shared_memory(m, cta, load):
    """The "xsmem" load path (the CTA's range of x copied to shared memory once, read 16 bytes a lane as the MMAs
    need it; two or three register sets of weights): every format, both NVFP4 layouts, N and K off the tiles."""
    nvfp4_case(m, 1000, 2064, torch.bfloat16, seed=m, load=load, cta=cta)
    nvfp4_case(m, 333, 4160, torch.float16, seed=m + 1, load=load, cta=cta, pack=True)
    int8_case(m, 1000, 2064, torch.bfloat16, bias=m % 2 == 1, seed=m, load=load, cta=cta)
    fp8_case(m, 700, 2080, torch.float16, bias=True, seed=m, load=load, cta=cta)


def xsmem_fits(fmt, m, k, splits, cta):
    try:
        w4.xsmem_plan(m, 500, w4.padded_k(fmt, k), fmt, w4.CtaShape(*cta), w4._num_sms(0), splits)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("k", [16, 208, 4096, 14336])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_x_from_shared_memory_k_ranges_and_splits(k, splits):
    """CTA ranges shorter than a step, a partial last step, the split count raised until x's range fits shared memory
    (None), and forced counts whose ranges do not fit refused; the L2 bursts' ends too, x's copy in parts (parts
    past a short range: nothing to copy, still arrived on) and rewritten into the MMA's operand pairs ("+xperm")."""
    for fmt, m, load, cta in (("nvfp4", 16, "xsmem", (2, 4, 1)), ("int8", 9, "xsmem:3", (1, 8, 1)),
                              ("nvfp4", 12, "xsmem+prefetch", (1, 8, 1)), ("int8", 16, "xsmem+prefetch6:3", (2, 4, 1)),
                              ("nvfp4", 16, "xsmem+parts4", (2, 8, 1)), ("int8", 11, "xsmem+parts3:3", (1, 8, 1)),
                              ("nvfp4", 13, "xsmem+xperm", (1, 16, 1)), ("nvfp4", 7, "xsmem+xperm+rot:3", (1, 8, 1))):
        case = (lambda: nvfp4_case(m, 500, k, torch.bfloat16, splits=splits, seed=k, load=load, cta=cta)) \
            if fmt == "nvfp4" else \
            (lambda: int8_case(m, 500, k, torch.float16, bias=True, splits=splits, seed=k, load=load, cta=cta))
        if splits is not None and not xsmem_fits(fmt, m, k, splits, cta):
            with pytest.raises(ValueError, match="the xsmem path holds"):
                case()
        else:
            case()


@pytest.mark.parametrize("m, n, k, pack", [(16, 4096, 14336, False), (9, 8192, 4160, True), (12, 14336, 4096, False),
                                           (16, 2048, 8192, True), (11, 1000, 8224, False), (16, 2048, 2048, False),
                                           (10, 3000, 2080, True), (5, 14336, 4096, False), (8, 15000, 4160, False),
                                           (13, 600, 4160, False), (7, 4100, 14400, False), (16, 14400, 2080, False),
                                           (2, 14336, 4096, False), (4, 4100, 14400, False), (3, 14400, 2080, False)])
def test_auto_takes_x_from_shared_memory_over_large_weights(m, n, k, pack):
    """`xsmem_cta`'s NVFP4 calls (9..16 rows over weights with K of at least 4096, narrow ones from 2048 rows at K >=
    2048, long ones at any K; 2..8 rows over wide weights other than 8192-row ones) on the default load path (plain
    NVFP4: `xsmem_auto_spec`'s options)."""
    assert w4.xsmem_cta(n, m, w4.padded_k("nvfp4", k), w4._num_sms(0), pack) is not None
    nvfp4_case(m, n, k, torch.bfloat16, seed=m, load="auto", pack=pack)
    nvfp4_case(m, n, k, torch.float16, seed=m + 1, load="auto", pack=pack)


@pytest.mark.parametrize("m, n, k", [(16, 1024, 4096), (9, 600, 8224), (12, 2048, 14336)])
def test_auto_takes_x_from_shared_memory_over_narrow_int8_weights(m, n, k):
    """`xsmem_cta`'s int8 calls: 9..16 rows over fewer than 4096 rows with K of at least 4096, with and without a
    bias, bf16 and fp16."""
    assert w4.xsmem_cta(n, m, w4.padded_k("int8", k), w4._num_sms(0), fmt="int8") == w4.XSMEM_NARROW
    int8_case(m, n, k, torch.bfloat16, True, seed=m, load="auto")
    int8_case(m, n, k, torch.float16, False, seed=m + 1, load="auto")


@pytest.mark.parametrize("load, cta", [("registers", (1, 1, 8)), ("rolling", (2, 2, 4)), ("rolling+2ctas", (1, 2, 4)),
                                       ("xsmem", (1, 16, 1)), ("xsmem+xperm", (1, 8, 1))])
@pytest.mark.parametrize("m", [1, 8, 9, 16])
def test_rotated_decode_gives_the_same_outputs(m, load, cta):
    """"+rot" (each word's pair signs from one rotation of it) feeds the MMAs the same operands: outputs equal, bit for
    bit, to the same path without it (bf16 and f16, N and K off the tiles, split), and within the reference's bounds."""
    for dtype, seed in ((torch.bfloat16, m), (torch.float16, m + 1)):
        w_fp4, block, global_scale = random_nvfp4(1000, 4160, seed=seed, device="cuda")
        x = torch.randn(m, 4160, dtype=dtype, device="cuda")
        run = lambda spec: w4.nvfp4_matmul(x, w_fp4, block, global_scale, load=spec, cta=cta, gemv=False)  # noqa: E731
        assert torch.equal(run(load + "+rot"), run(load)), (load, cta, m, dtype)
        nvfp4_case(m, 1000, 4160, dtype, seed=seed, load=load + "+rot", cta=cta)


def test_x_from_shared_memory_in_a_cuda_graph(monkeypatch):
    monkeypatch.setenv(switches.W4A16_CTA, "2x4x1")
    switches.reset()
    try:
        n, k, m = 4096, 8192, 16
        w_fp4, block, global_scale = random_nvfp4(n, k, device="cuda")
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        w4.warmup(torch.bfloat16, "nvfp4", (m,), bias=False, load="xsmem")
        replays_match_eager(x, lambda: w4.nvfp4_matmul(x, w_fp4, block, global_scale, load="xsmem"),
                            float64_dequantized(w_fp4, block, global_scale), f"graph xsmem m{m}")
    finally:
        monkeypatch.undo()
        switches.reset()


@pytest.mark.parametrize("m, n, k", [(16, 4096, 8192), (3, 14336, 4096), (12, 2048, 8192)])
def test_auto_load_in_a_cuda_graph(m, n, k):
    """The default path of `xsmem_cta`'s calls ("xsmem+xperm+rot" on 1 x 16 x 1, "xsmem+rot" on 1 x 8 x 1), warmed
    up as a model would be, replays a captured graph with the eager call's values."""
    w_fp4, block, global_scale = random_nvfp4(n, k, device="cuda")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    assert w4.call_plan(m, n, w4.padded_k("nvfp4", k), "nvfp4", w4._num_sms(0)).load.startswith("xsmem+")
    w4.warmup(torch.bfloat16, "nvfp4", (m,), bias=False)
    replays_match_eager(x, lambda: w4.nvfp4_matmul(x, w_fp4, block, global_scale),
                        float64_dequantized(w_fp4, block, global_scale), f"graph auto m{m} {n}x{k}")


def replays_match_eager(x, call, wd, name):
    """`call` captured in a CUDA graph, replayed on fresh values of x: the eager call's outputs, bit for bit, within
    PyTorch's error of x @ wd^T in float64."""
    graph, out = capture(call)
    for i in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call()), f"{name} replay {i}"
        report(f"{name} replay {i}", out, x.double() @ wd.T, F.linear(x, wd.to(x.dtype)))


@pytest.mark.parametrize("pack", PACKS, ids=PACK_IDS)
@pytest.mark.parametrize("load", MORE_LOADS)
@pytest.mark.parametrize("m", [1, 8, 9, 16])
def test_short_k_ranges(m, load, pack):
    """Warps with 0, 1 or 2 steps of K (fewer than the two register sets a warp loads ahead; bulk: CTAs with 0,
    1 or 2 stages, the last one short) and a tail step with lanes past the range."""
    skip_tiles_off_registers(pack, load)
    for k in (64, 320, 1088):
        nvfp4_case(m, 70, k, torch.bfloat16, seed=k, load=load, pack=pack)
        if not pack:
            int8_case(m, 70, k, torch.float16, bias=True, seed=k, load=load)
    nvfp4_case(m, 333, 4096, torch.bfloat16, splits=7, seed=m, load=load, pack=pack)


@pytest.mark.parametrize("pack", PACKS, ids=PACK_IDS)
@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("n, k", [(16, 16), (3, 48), (2048, 8192), (8192, 2048)])
def test_shapes(n, k, load, pack):
    skip_tiles_off_registers(pack, load)
    nvfp4_case(3, n, k, torch.bfloat16, load=load, pack=pack)
    if not pack:
        int8_case(3, n, k, torch.bfloat16, bias=False, load=load)


@pytest.mark.parametrize("pack", PACKS, ids=PACK_IDS)
@pytest.mark.parametrize("load", MORE_LOADS)
def test_a_large_weight(load, pack):
    skip_tiles_off_registers(pack, load)
    nvfp4_case(1, 8192, 8192, torch.bfloat16, load=load, pack=pack)
    nvfp4_case(8, 8192, 8192, torch.float16, load=load, pack=pack)
    if not pack:
        int8_case(16, 8192, 8192, torch.bfloat16, bias=True, load=load)


@pytest.mark.parametrize("spec", ["rolling", "rolling+2ctas"])
@pytest.mark.parametrize("pack", PACKS, ids=PACK_IDS)
def test_rolling_loads_are_the_register_path_bit_for_bit(spec, pack):
    """The rolling load path changes when operands arrive, not the arithmetic: each accumulator takes the same
    MMAs in the same order, so its output is the register path's bit for bit, for every M bucket, split or not,
    both CTAs and 2 or 4 row tiles a warp (the packed layout's 4 x 1 x 8 at 9..16 rows too), NVFP4 in each layout and int8 with a bias, K not a multiple of a warp's
    steps."""
    w_fp4, block, global_scale = random_nvfp4(333, 4160, seed=7, device="cuda")
    w_int8 = torch.randint(-128, 128, (333, 4160), dtype=torch.int8, device="cuda")
    scale, bias = torch.rand(333, device="cuda") / 64, torch.randn(333, dtype=torch.bfloat16, device="cuda")
    for m in (1, 5, 8, 9, 16):
        x = torch.randn(m, 4160, dtype=torch.bfloat16, device="cuda")
        for splits, cta in ((1, None), (3, None), (1, tuple(w4.NARROW)), (1, (2, 2, 4)), (2, (4, 2, 4)),
                            (1, (4, 1, 8))):
            def nvfp4(load):
                return w4.nvfp4_matmul(x, w_fp4, block, global_scale, splits=splits, cta=cta, load=load, pack=pack,
                                      gemv=False)

            def int8(load):
                return w4.int8_matmul(x, w_int8, scale, bias, splits=splits, cta=cta, load=load, gemv=False)

            for run in (nvfp4, int8) if not pack else (nvfp4,):
                registers, rolling = run("registers"), run(spec)
                assert torch.equal(rolling, registers), (run.__name__, m, splits, cta, spec, pack)


def test_load_path_from_the_environment(monkeypatch):
    """FA4_INDUCTOR_W4A16_LOAD picks the variant calls without `load` get: the bulk one's output, bit for bit
    (the kernels are deterministic)."""
    w_fp4, block, global_scale = random_nvfp4(512, 1024, seed=5, device="cuda")
    x = torch.randn(4, 1024, dtype=torch.bfloat16, device="cuda")
    bulk = w4.nvfp4_matmul(x, w_fp4, block, global_scale, load="bulk")
    monkeypatch.setenv(switches.W4A16_LOAD, "bulk")
    switches.reset()
    assert w4.configured_load() == "bulk"
    assert torch.equal(w4.nvfp4_matmul(x, w_fp4, block, global_scale), bulk)


def test_pack_from_the_environment(monkeypatch):
    """FA4_INDUCTOR_W4A16_PACK=1: calls without `pack` take the packed layout (prepared once), bit for bit the
    `pack=True` call's output."""
    from fa4_inductor.kernels import prepared_weights

    w_fp4, block, global_scale = random_nvfp4(512, 1024, seed=6, device="cuda")
    x = torch.randn(4, 1024, dtype=torch.bfloat16, device="cuda")
    packed = w4.nvfp4_matmul(x, w_fp4, block, global_scale, pack=True)
    monkeypatch.setenv(switches.W4A16_PACK, "1")
    switches.reset()
    assert w4.configured_pack()
    assert torch.equal(w4.nvfp4_matmul(x, w_fp4, block, global_scale), packed)
    assert prepared_weights.holds(w_fp4, ("w4a16_nvfp4_packed", torch.bfloat16))
    tiles = w4.nvfp4_matmul(x, w_fp4, block, global_scale, pack="tiles")
    monkeypatch.setenv(switches.W4A16_PACK, "tiles")
    switches.reset()
    assert torch.equal(w4.nvfp4_matmul(x, w_fp4, block, global_scale), tiles)
    assert prepared_weights.holds(w_fp4, ("w4a16_nvfp4_tiled", torch.bfloat16))


@pytest.mark.parametrize("pack", PACKS, ids=PACK_IDS)
@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("m", [1, 16])
def test_cuda_graph_capture_and_replay(m, load, pack):
    """Captured after a warm-up (which compiles the variants and, packed, prepares the weight), replayed on new x."""
    skip_tiles_off_registers(pack, load)
    n, k = 4096, 4096
    w_fp4, block, global_scale = random_nvfp4(n, k, device="cuda")
    w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    scale = torch.rand(n, device="cuda") / 100
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    w4.warmup(torch.bfloat16, "nvfp4", (m,), bias=False, load=load, pack=pack)
    w4.warmup(torch.bfloat16, "int8", (m,), bias=False, load=load)
    graph, (out4, out8) = capture(lambda: (w4.nvfp4_matmul(x, w_fp4, block, global_scale, load=load, pack=pack),
                                           w4.int8_matmul(x, w_int8, scale, load=load)))
    for i in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out4, w4.nvfp4_matmul(x, w_fp4, block, global_scale, load=load, pack=pack)), \
            f"nvfp4 replay {i}"
        assert torch.equal(out8, w4.int8_matmul(x, w_int8, scale, load=load)), f"int8 replay {i}"
        wd = float64_dequantized(w_fp4, block, global_scale)
        report(f"graph nvfp4 m{m} replay {i}", out4, x.double() @ wd.T, F.linear(x, wd.to(x.dtype)))


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("m", [1, 9])
def test_pdl_chain_equals_plain_launches(monkeypatch, m, load):
    """PDL launches (FA4_INDUCTOR_W4A16_PDL=1) of a chain in which each GEMM reads the previous one's output (the
    dependency `griddepcontrol.wait` must honour), then siblings over one x (the overlap PDL is for), eagerly and
    replayed in a CUDA graph: bit for bit the plain launches' results; each GEMM against float64 on its input."""
    sizes = [(2048, 2048), (8192, 2048), (2048, 8192), (512, 2048), (333, 2048)]  # narrow, wide, narrow, split
    ws = [random_nvfp4(n, k, seed=i, device="cuda") for i, (n, k) in enumerate(sizes)]
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")

    def step():
        h1 = w4.nvfp4_matmul(x, *ws[0], load=load)
        h2 = w4.nvfp4_matmul(h1, *ws[1], load=load)
        h3 = w4.nvfp4_matmul(h2, *ws[2], load=load)
        return h1, h2, h3, w4.nvfp4_matmul(h3, *ws[3], load=load), w4.nvfp4_matmul(h3, *ws[4], splits=3, load=load)

    check_pdl_chain(monkeypatch, f"pdl chain m{m} gemm", step, x, ws,
                    lambda x, out: [x, out[0], out[1], out[2], out[2]])


def check_pdl_chain(monkeypatch, name, step, x, ws, inputs_of):
    """`step()` (one call per weight of `ws`, each reading x or an earlier output: `inputs_of(x, outputs)`) with PDL
    launches and without, eagerly and replayed in a CUDA graph after x changed: bit for bit the same; each output
    against float64 on its input."""
    def launches(pdl):
        monkeypatch.setenv("FA4_INDUCTOR_W4A16_PDL", pdl)
        switches.reset()
        return step()

    try:
        first = launches("1")
        assert all(torch.equal(a, b) for a, b in zip(first, launches("0")))
        launches("1")
        graph, static = capture(step)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        plain = launches("0")
        for i, (a, b) in enumerate(zip(static, plain)):
            assert torch.equal(a, b), f"replayed output {i}"
        assert not torch.equal(first[0], plain[0])  # x changed before the replay
        for i, (inp, out, w) in enumerate(zip(inputs_of(x, plain), plain, ws)):
            wd = float64_dequantized(*w)
            report(f"{name} {i}", out, inp.double() @ wd.T, F.linear(inp, wd.to(inp.dtype)))
    finally:
        monkeypatch.delenv("FA4_INDUCTOR_W4A16_PDL", raising=False)
        switches.reset()


# ------------------------------------------------------------------------------- the CUDA-core GEMV (M <= 4)

GEMV_SHAPES = [(1000, 2064), (333, 4160), (70, 64), (3, 48), (16, 16), (8192, 2048), (2048, 8192), (512, 2048),
               (5, 8256), (4099, 1040)]  # N, K off the warp's rows and 32-piece step; every shape `gemv_shape` picks


@pytest.mark.parametrize("shape", [(4, 1), (4, 2), (4, 4), (2, 1), (2, 4), (1, 1), (1, 2), (8, 1)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_forced_shapes(m, shape):
    """Every (rows a warp, K warps) `gemv_shape` can pick, and 8 rows (tuning), N and K odd: `gemv=(rows, K warps)`."""
    for fmt_case, kw in ((nvfp4_case, {}), (int8_case, {"bias": True})):
        fmt_case(m, 333, 4160, torch.bfloat16, seed=m, gemv=shape, **kw)


def assert_replays_equal(step, x):
    """`step` captured in a CUDA graph (`capture`), replayed three times on new values of its input x: each output
    bit for bit a fresh call's."""
    graph, captured = capture(step)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, step())


@pytest.mark.parametrize("shape", [(4, 1, 2), (4, 4, 2), (2, 2, 4), (1, 1, 8), (4, 1, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("m, n, k", [(1, 333, 4160), (3, 512, 8192), (1, 2048, 8256), (4, 5, 1040)])
def test_gemv_split_k(m, n, k, shape):
    """The CUDA-core GEMV with K split among a cluster's CTAs (`gemv=(rows, K warps, splits)`; a split past the last
    piece where K is short): NVFP4 and int8 with a bias within the bounds; a CUDA graph's replays on new x equal the
    eager call bit for bit."""
    if shape[0] * m > 32:
        pytest.skip("one lane a (row, x row) to store")
    nvfp4_case(m, n, k, torch.bfloat16, seed=m + n, gemv=shape)
    int8_case(m, n, k, torch.float16, bias=True, seed=m + k, gemv=shape)
    g = torch.Generator().manual_seed(2)
    w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g).cuda()
    scale = (torch.rand(n, generator=g) / 100 + 1e-3).cuda()
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    assert_replays_equal(lambda: w4.int8_matmul(x, w_int8, scale, gemv=shape), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m", range(1, 5))
def test_gemv_every_m(m, dtype):
    nvfp4_case(m, 1000, 2064, dtype, seed=m, gemv=True)
    int8_case(m, 1000, 2064, dtype, bias=m % 2 == 1, seed=m, gemv=True)


@pytest.mark.parametrize("n, k", GEMV_SHAPES)
@pytest.mark.parametrize("m", [1, 4])
def test_gemv_shapes(m, n, k):
    nvfp4_case(m, n, k, torch.bfloat16, seed=n + k, gemv=True)
    int8_case(m, n, k, torch.float16, bias=True, seed=n + k, gemv=True)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [2, 3])
def test_gemv_int8_scales_and_bias(m, dtype, scale_dtype):
    for bias in (False, True):
        int8_case(m, 700, 1024, dtype, bias=bias, seed=m, scale_dtype=scale_dtype, gemv=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 4])
def test_gemv_signed_zero_and_subnormal_block_scales(dtype, m):
    """Block scales of every e4m3 byte but NaN (negative, zero, subnormal), odd N and K."""
    n, k = 333, 4160
    x, w_fp4, block, global_scale = signed_scale_case(m, n, k, dtype)
    out = w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=True)
    wd = float64_dequantized(w_fp4, block, global_scale)
    report(f"gemv nvfp4 signed scales {str(dtype)[6:]} m{m}", out, x.double() @ wd.T, F.linear(x, wd.to(dtype)))


def test_gemv_from_the_environment(monkeypatch):
    """Calls without `gemv`: by default (auto) one row takes the GEMV and two rows the tensor-core kernel;
    FA4_INDUCTOR_W4A16_GEMV=1 sends M <= 4 to the GEMV, =0 none; M = 5 and packed NVFP4 keep the tensor-core kernel.
    Each routed call's output is bit for bit the forced call's (the GEMV is deterministic). The integer GEMV, which
    would take this one-row NVFP4 call by default, is switched off (its own switch test is below)."""
    monkeypatch.setenv(switches.W4A16_INT_GEMV, "0")
    switches.reset()
    w_fp4, block, global_scale = random_nvfp4(512, 1024, seed=8, device="cuda")
    w_int8 = torch.randint(-128, 128, (512, 1024), dtype=torch.int8, device="cuda")
    scale = torch.rand(512, device="cuda") / 100
    x = torch.randn(5, 1024, dtype=torch.bfloat16, device="cuda")
    routes = []
    run_gemv = w4._run_gemv
    monkeypatch.setattr(w4, "_run_gemv", lambda *args, **kwargs: routes.append(args[1].shape[0]) or run_gemv(*args,
                                                                                                        **kwargs))

    def nvfp4(rows, **kwargs):
        return w4.nvfp4_matmul(x[:rows], w_fp4, block, global_scale, **kwargs)

    gemv1, gemv4, mma1, mma2, mma5 = nvfp4(1, gemv=True), nvfp4(4, gemv=True), nvfp4(1, gemv=False), \
        nvfp4(2, gemv=False), nvfp4(5, gemv=False)
    gemv8 = w4.int8_matmul(x[:4], w_int8, scale, gemv=True)
    packed = nvfp4(4, pack=True)
    assert routes == [1, 4, 4]

    def configure(value):
        if value is None:
            monkeypatch.delenv(switches.W4A16_GEMV, raising=False)
        else:
            monkeypatch.setenv(switches.W4A16_GEMV, value)
        switches.reset()
        routes.clear()

    configure(None)
    assert torch.equal(nvfp4(1), gemv1) and torch.equal(nvfp4(2), mma2) and torch.equal(nvfp4(5), mma5)
    assert routes == [1]
    configure("1")
    assert torch.equal(nvfp4(4), gemv4) and torch.equal(w4.int8_matmul(x[:4], w_int8, scale), gemv8)
    assert torch.equal(nvfp4(5), mma5) and torch.equal(nvfp4(4, pack=True), packed)
    assert routes == [4, 4]
    configure("0")
    assert torch.equal(nvfp4(1), mma1) and routes == []
    monkeypatch.delenv(switches.W4A16_GEMV)
    switches.reset()


@pytest.mark.parametrize("m", [1, 4])
def test_gemv_cuda_graph_capture_and_replay(m):
    """Captured after a warm-up (which compiles the GEMV's variants), replayed on new x: the eager call's output."""
    n, k = 4096, 4096
    w_fp4, block, global_scale = random_nvfp4(n, k, device="cuda")
    w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    scale = torch.rand(n, device="cuda") / 100
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    w4.warmup(torch.bfloat16, "nvfp4", (m,), bias=False, gemv=True)
    w4.warmup(torch.bfloat16, "int8", (m,), gemv=True)
    graph, (out4, out8) = capture(lambda: (w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=True),
                                           w4.int8_matmul(x, w_int8, scale, bias, gemv=True)))
    for i in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out4, w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=True)), f"nvfp4 replay {i}"
        assert torch.equal(out8, w4.int8_matmul(x, w_int8, scale, bias, gemv=True)), f"int8 replay {i}"
        wd = float64_dequantized(w_fp4, block, global_scale)
        report(f"graph gemv nvfp4 m{m} replay {i}", out4, x.double() @ wd.T, F.linear(x, wd.to(x.dtype)))


@pytest.mark.parametrize("m", [1, 4])
def test_gemv_pdl_chain_equals_plain_launches(monkeypatch, m):
    """A chain of GEMVs, each reading the previous one's output, with PDL launches (the default) and without, eagerly
    and replayed in a CUDA graph: bit for bit the same; each against float64 on its input."""
    sizes = [(2048, 2048), (8192, 2048), (2048, 8192), (512, 2048)]
    ws = [random_nvfp4(n, k, seed=i, device="cuda") for i, (n, k) in enumerate(sizes)]
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")

    def step():
        h1 = w4.nvfp4_matmul(x, *ws[0], gemv=True)
        h2 = w4.nvfp4_matmul(h1, *ws[1], gemv=True)
        h3 = w4.nvfp4_matmul(h2, *ws[2], gemv=True)
        return h1, h2, h3, w4.nvfp4_matmul(h3, *ws[3], gemv=True)

    check_pdl_chain(monkeypatch, f"gemv pdl chain m{m} gemm", step, x, ws, lambda x, out: [x, *out[:3]])


# ------------------------------------------------------------------------------- the integer NVFP4 GEMV (M = 1)


def assert_near_emulation(out, emu, what: str):
    """An integer GEMV's output against its arithmetic emulated on the CPU (float64): within the output dtype's
    rounding of each value, plus 1e-6 of the largest (the fp32 sums' order)."""
    rounding = 2.0 ** (-8 if out.dtype == torch.bfloat16 else -10)
    gap = (out.double() - emu).abs()
    assert (gap <= rounding * emu.abs() + 1e-6 * emu.abs().max()).all(), \
        f"{what}: off its emulation by {gap.max().item():.3g} (|emu| max {emu.abs().max().item():.3g})"


def int_gemv_case(n, k, dtype, seed=0, shape=None, x=None, m=1):
    """`nvfp4_int_gemv.matmul` against the float64 product (`report`'s bound) and against its own arithmetic emulated
    on the CPU (`nvfp4_int_gemv.emulate`), which it must equal up to the fp32 sums and the output's rounding."""
    from fa4_inductor.kernels import nvfp4_int_gemv as g

    w_fp4, block, global_scale = random_nvfp4(n, k, seed=seed, device="cuda")
    x = torch.randn(m, k, dtype=dtype, device="cuda") if x is None else x
    out = g.matmul(x, w_fp4, block, global_scale, forced=shape)
    assert out.shape == (x.shape[0], n) and out.dtype == dtype
    wd = float64_dequantized(w_fp4, block, global_scale)
    emu = g.emulate(x.cpu(), w_fp4.cpu(), block.cpu(), global_scale.cpu()).cuda()
    assert_near_emulation(out, emu, f"int gemv m{x.shape[0]} n{n} k{k}")
    report(f"int gemv {str(dtype)[6:]} m{x.shape[0]} n{n} k{k} shape {shape or 'auto'}", out, x.double() @ wd.T,
           F.linear(x, wd.to(dtype)))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n, k", GEMV_SHAPES + [(4096, 14336), (1024, 16384), (8192, 8192)])
def test_int_gemv_shapes(n, k, dtype):
    int_gemv_case(n, k, dtype, seed=n + k)


@pytest.mark.parametrize("shape", [(4, 1), (2, 2), (1, 4)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("k", [1024, 2080, 3104, 4128, 5152])
def test_int_gemv_steps_a_lane(k, shape):
    """1 to 6 32-piece steps a lane (two pieces in flight: even and odd counts, a lane past the last piece)."""
    int_gemv_case(257, k, torch.bfloat16, seed=k, shape=shape)


@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("n, k", [(1000, 2064), (8192, 2048), (3, 48), (4099, 1040)])
def test_int_gemv_more_rows(m, n, k):
    int_gemv_case(n, k, torch.bfloat16, seed=m + n, m=m)


@pytest.mark.parametrize("shape", [(8, 1), (4, 1), (4, 2), (4, 4), (2, 4), (1, 1)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_int_gemv_forced_shapes(shape):
    int_gemv_case(333, 4160, torch.bfloat16, seed=7, shape=shape)
    if shape[0] <= 2:
        int_gemv_case(333, 4160, torch.float16, seed=8, shape=shape, m=4)


@pytest.mark.parametrize("prefetch", [3, 4, 8])
@pytest.mark.parametrize("m, n, k, shape", [(1, 257, 1024, (4, 1)), (1, 257, 5152, (4, 1)), (1, 333, 4160, (1, 4)),
                                            (1, 8192, 8192, None), (2, 1000, 2064, None), (4, 333, 4160, (2, 2)),
                                            (1, 4099, 1040, (2, 2))])
def test_int_gemv_prefetch_window(monkeypatch, prefetch, m, n, k, shape):
    """FA4_INDUCTOR_INT_GEMV_PREFETCH only adds L2 prefetches: the same output, bit for bit, as without it (and
    within the bounds of `int_gemv_case`)."""
    from fa4_inductor.kernels import nvfp4_int_gemv as g

    w_fp4, block, global_scale = random_nvfp4(n, k, seed=n + k, device="cuda")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    plain = g.matmul(x, w_fp4, block, global_scale, forced=shape)
    monkeypatch.setenv("FA4_INDUCTOR_INT_GEMV_PREFETCH", str(prefetch))
    switches.reset()
    assert switches.current().int_gemv_prefetch == prefetch
    assert torch.equal(int_gemv_case(n, k, torch.bfloat16, seed=n + k, shape=shape, x=x), plain)


@pytest.mark.parametrize("shape", [(4, 1, 2), (4, 1, 4), (4, 1, 8), (2, 2, 2), (1, 4, 4), (2, 1, 8), (4, 1, 1, 16),
                                   (4, 1, 4, 16), (4, 1, 1, 8), (4, 1, 2, 8), (2, 2, 2, 8), (1, 4, 1, 16)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("m, n, k", [(1, 2048, 8192), (1, 257, 5152), (1, 333, 1040), (2, 1000, 2064),
                                     (4, 99, 4160), (1, 4096, 16384)])
def test_int_gemv_split_k(shape, m, n, k):
    """K split among the CTAs of a cluster (splits 2, 4, 8; K not a whole number of splits' steps, a split past the
    last piece, N not a multiple of a CTA's rows) and CTAs of 8 and 16 warps: within the bounds of `int_gemv_case`; a
    CUDA graph's replays on new x give the eager call's output bit for bit (the cluster's sums add up in a fixed
    order)."""
    from fa4_inductor.kernels import nvfp4_int_gemv as g

    if shape[0] * m > g.MAX_ROW_PRODUCT:
        pytest.skip("more accumulators than a warp holds")
    int_gemv_case(n, k, torch.bfloat16, seed=n + k + shape[2], shape=shape, m=m)
    w_fp4, block, global_scale = random_nvfp4(n, k, seed=3, device="cuda")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    assert_replays_equal(lambda: g.matmul(x, w_fp4, block, global_scale, forced=shape), x)


def test_int_gemv_split_rule_on_the_down_projection(monkeypatch):
    """FA4_INDUCTOR_GEMV_SPLIT=on: the 2048 x 8192 weight's one-row call runs 4 rows a warp, one K warp, 4 splits
    (on 132 SMs), within the bounds; off: the unsplit shape."""
    from fa4_inductor.kernels import nvfp4_int_gemv as g

    keys, real = [], g.compiled
    monkeypatch.setattr(g, "compiled", lambda key: keys.append(key) or real(key))
    monkeypatch.setenv("FA4_INDUCTOR_GEMV_SPLIT", "on")
    switches.reset()
    try:
        int_gemv_case(2048, 8192, torch.bfloat16, seed=5)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert (keys[-1].rows, keys[-1].warps_k, keys[-1].splits) == g.shape(2048, 1, sms, 256, True)
        assert sms < 132 or keys[-1].splits > 1
    finally:
        monkeypatch.delenv("FA4_INDUCTOR_GEMV_SPLIT")
        switches.reset()


def int8_int_gemv_case(n, k, dtype, seed=0, shape=None, m=1, bias=False, scale_dtype=torch.float32):
    """`w4a16_decode.int8_matmul` on the integer int8 GEMV (`gemv="int"`, or its forced shape) against its own
    arithmetic emulated on the CPU (`int8_int_gemv.emulate`), up to the fp32 sums and the output's rounding, and
    against the float64 product (`report`)."""
    from fa4_inductor.kernels import int8_int_gemv as g8

    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int64).to(torch.int8).cuda()
    scale = (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(scale_dtype).cuda()
    b = torch.randn(n, generator=gen).to(dtype).cuda() if bias else None
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    out = w4.int8_matmul(x, w, scale, b, gemv=(w4.INT_GEMV, *shape) if shape else w4.INT_GEMV)
    assert out.shape == (m, n) and out.dtype == dtype
    emu = g8.emulate(x.cpu(), w.cpu(), scale.cpu(), None if b is None else b.cpu()).cuda()
    assert_near_emulation(out, emu, f"int8 int gemv m{m} n{n} k{k}")
    wd = w.double() * scale.double()[:, None]
    ref = x.double() @ wd.T + (0 if b is None else b.double())
    report(f"int8 int gemv {str(dtype)[6:]} m{m} n{n} k{k} shape {shape or 'auto'}", out, ref,
           F.linear(x, wd.to(dtype), b))
    return out, (x, w, scale, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n, k", GEMV_SHAPES + [(4096, 14336), (1024, 16384), (8192, 8192)])
def test_int8_int_gemv_shapes(n, k, dtype):
    int8_int_gemv_case(n, k, dtype, seed=n + k)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [None, (4, 1), (2, 2), (1, 4), (8, 1), (4, 1, 1, 8), (2, 2, 1, 16)], ids=str)
@pytest.mark.parametrize("n, k", [(1000, 2064), (257, 5152), (3, 48), (4099, 1040)])
def test_int8_int_gemv_rows_and_shapes(m, shape, n, k):
    """1..4 rows of x, forced CTA shapes (1..6 32-piece steps a lane, N off the warp's rows), a bias and bf16 or
    fp16 scales on some; a CUDA graph's replays on new x give the eager call's output bit for bit."""
    if shape and shape[0] * m > 8:
        pytest.skip("more accumulators than a warp holds")
    out, (x, w, scale, b) = int8_int_gemv_case(n, k, torch.bfloat16, seed=m + n, shape=shape, m=m, bias=m % 2 == 1,
                                               scale_dtype=(torch.float32, torch.bfloat16, torch.float16)[m % 3])
    assert_replays_equal(lambda: w4.int8_matmul(x, w, scale, b, gemv=w4.INT_GEMV), x)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [None, (4, 1), (2, 2), (2, 4), (8, 1)], ids=str)
@pytest.mark.parametrize("m, n, k", [(1, 8192, 2048), (1, 14336, 4096), (2, 1000, 2064), (4, 99, 4160), (1, 3, 48)])
def test_int_gemv_gated(m, n, k, shape, activation):
    """`run_gated`: act(x @ gate^T) * (x @ up^T) in one launch against the separate integer-GEMV calls put through
    torch's activation and product in x's dtype (the same roundings): within a few bf16 steps (the fp32 sums of
    another CTA shape can round g or u to the neighbouring bf16 value); CUDA-graph replays on new x bit-equal."""
    from fa4_inductor.kernels.nvfp4_gated_linear import ACTIVATIONS

    from fa4_inductor.kernels import nvfp4_int_gemv as g

    if shape is not None and shape[0] * m > g.MAX_ROW_PRODUCT:
        pytest.skip("more accumulators than a warp holds")
    gate = random_nvfp4(n, k, seed=n + k, device="cuda")
    up = random_nvfp4(n, k, seed=n + k + 1, device="cuda")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    out = g.run_gated(x, gate, up, forced=shape, activation=activation)
    expected = ACTIVATIONS[activation](g.matmul(x, *gate)) * g.matmul(x, *up)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), rtol=2 ** -6, atol=1e-3 * expected.abs().max().item())
    assert_replays_equal(lambda: g.run_gated(x, gate, up, forced=shape, activation=activation), x)


@pytest.mark.parametrize("m", [1, 3])
def test_the_gated_linear_op(m):
    """`fa4::nvfp4_gated_linear` on CUDA: one row of x runs the gated GEMV (within a few bf16 steps of the separate
    ops' silu product), three rows the sibling op, then silu and the product (bit for bit the separate ops')."""
    from fa4_inductor.kernels import NVFP4_GATED_LINEAR, NVFP4_LINEAR

    gate, up = random_nvfp4(8192, 2048, seed=1, device="cuda"), random_nvfp4(8192, 2048, seed=2, device="cuda")
    x = torch.randn(m, 1, 2048, dtype=torch.bfloat16, device="cuda")
    out = NVFP4_GATED_LINEAR(x, [gate[0], up[0]], [gate[1], up[1]], [gate[2], up[2]])
    expected = F.silu(NVFP4_LINEAR(x, *gate)) * NVFP4_LINEAR(x, *up)
    assert out.shape == (m, 1, 8192)
    if m == 1:
        torch.testing.assert_close(out.float(), expected.float(), rtol=2 ** -6, atol=1e-3 * expected.abs().max().item())
    else:
        assert torch.equal(out, expected)


def test_int_gemv_outliers_and_non_finite_x():
    """An outlier (its block's small values round to 2^-15 of it) stays within the bounds; an inf in x makes the
    row NaN (eager gives inf or NaN there)."""
    k = 4096
    x = torch.randn(1, k, device="cuda")
    x[0, ::97] *= 300
    int_gemv_case(1000, k, torch.bfloat16, x=x.to(torch.bfloat16))
    from fa4_inductor.kernels import nvfp4_int_gemv as g

    w_fp4, block, global_scale = random_nvfp4(64, k, device="cuda")
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    x[0, 123] = float("inf")
    assert g.matmul(x, w_fp4, block, global_scale).isnan().all()


def test_int_gemv_through_the_matmul_and_cuda_graph_replay(monkeypatch):
    """`nvfp4_matmul(gemv="int")` takes calls of 1..4 rows to it (and others elsewhere); captured after a warm-up
    call, replayed on new x: the eager call's output."""
    n, k = 4096, 4096
    w_fp4, block, global_scale = random_nvfp4(n, k, device="cuda")
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    from fa4_inductor.kernels import nvfp4_int_gemv as g

    calls, real = [], g.run
    monkeypatch.setattr(g, "run", lambda *a, **kw: calls.append(tuple(a[0].shape)) or real(*a, **kw))
    first = w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=w4.INT_GEMV)
    assert calls == [(1, k)]
    calls.clear()
    assert torch.equal(first, g.matmul(x, w_fp4, block, global_scale)) and calls == [(1, k)]
    nvfp4_case(5, n, k, torch.bfloat16, gemv=w4.INT_GEMV)  # five rows: the tensor-core kernel
    assert calls == [(1, k)]
    monkeypatch.setenv("FA4_INDUCTOR_W4A16_INT_GEMV", "1")
    switches.reset()
    try:
        assert torch.equal(w4.nvfp4_matmul(x, w_fp4, block, global_scale), first) and calls == [(1, k)] * 2
        w4.nvfp4_matmul(torch.randn(6, k, dtype=torch.bfloat16, device="cuda"), w_fp4, block, global_scale)
        assert calls == [(1, k)] * 2  # six rows: as configured without the switch
    finally:
        monkeypatch.delenv("FA4_INDUCTOR_W4A16_INT_GEMV")
        switches.reset()
    assert w4.int_gemv_auto(1, n, k)  # unset (auto): a one-row call over this weight takes it
    assert torch.equal(w4.nvfp4_matmul(x, w_fp4, block, global_scale), first) and calls == [(1, k)] * 3
    monkeypatch.setenv("FA4_INDUCTOR_W4A16_INT_GEMV", "off")
    switches.reset()
    try:
        w4.nvfp4_matmul(x, w_fp4, block, global_scale)
        assert calls == [(1, k)] * 3
    finally:
        monkeypatch.delenv("FA4_INDUCTOR_W4A16_INT_GEMV")
        switches.reset()
    graph, out = capture(lambda: w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=w4.INT_GEMV))
    for i in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, g.matmul(x, w_fp4, block, global_scale)), f"replay {i}"


# ------------------------------------------------------------------ the integer GEMV over sibling weights (one launch)


SIBLINGS = [((2048, 512, 512), 2048), ((333, 40, 17), 4160), ((8192, 8192), 2048), ((257, 1000), 1040),
            ((100, 3), 48)]


@pytest.mark.parametrize("shape", [(4, 1), (2, 2), (1, 4)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rows, k", SIBLINGS)
def test_int_gemv_siblings_equal_each_weights_own_launch(rows, k, shape):
    """`run_siblings` gives each weight's output of `matmul` at the same CTA shape, bit for bit (the same arithmetic,
    one launch): CTAs past a weight's last row, a weight of fewer rows than a CTA, K not a multiple of 32."""
    from fa4_inductor.kernels import nvfp4_int_gemv as g

    ws = [random_nvfp4(n, k, seed=n + k + i, device="cuda") for i, n in enumerate(rows)]
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(1, k, dtype=dtype, device="cuda")
        outs = g.run_siblings(x, ws, forced=shape)
        for out, w in zip(outs, ws):
            assert out.shape == (1, w[0].shape[0]) and torch.equal(out, g.matmul(x, *w, forced=shape))
        wd = float64_dequantized(*ws[-1])
        report(f"int gemv siblings {rows} k{k} {shape}", outs[-1], x.double() @ wd.T, F.linear(x, wd.to(dtype)))


@pytest.mark.parametrize("blocked_scales", [False, True], ids=["rowmajor", "blocked"])
@pytest.mark.parametrize("m", [1, 2])
def test_sibling_linears_op_under_cuda_graph_replay(m, blocked_scales):
    """The op on CUDA, biases on two of three weights, captured once and replayed on new x: each output as
    `fa4::nvfp4_linear`'s within the float64 bound (one row: the one-launch GEMV; two rows: the calls one by one,
    the same kernels as the separate op, bit for bit)."""
    from fa4_inductor.kernels import NVFP4_LINEAR, NVFP4_SIBLING_LINEARS
    from fa4_inductor.kernels import nvfp4_sibling_linears as op
    from test_nvfp4_linear import blocked

    k, rows = 2048, (2048, 512, 512)
    ws = [random_nvfp4(n, k, seed=i, device="cuda") for i, n in enumerate(rows)]
    stored = [(w, blocked(b), s) if blocked_scales else (w, b, s) for w, b, s in ws]
    biases = [torch.randn(rows[0], dtype=torch.bfloat16, device="cuda"), None,
              torch.randn(rows[2], dtype=torch.bfloat16, device="cuda")]
    layout = "blocked" if blocked_scales else "rowmajor"
    x = torch.randn(m, 1, k, dtype=torch.bfloat16, device="cuda")
    args = ([w[0] for w in stored], [w[1] for w in stored], [w[2] for w in stored], biases)
    assert op.one_launch(x.reshape(-1, k), args[0]) == (m == 1)
    graph, static = capture(lambda: NVFP4_SIBLING_LINEARS(x, *args, scale_layout=layout))
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        for out, w, bias in zip(static, ws, biases):
            alone = NVFP4_LINEAR(x, *w, bias)
            if m > 1:
                assert torch.equal(out, alone)
            wd = float64_dequantized(*w)
            ref = x.reshape(m, k).double() @ wd.T + (0 if bias is None else bias.double())
            pytorch = F.linear(x.reshape(m, k), wd.to(x.dtype), bias)
            report(f"sibling op m{m} {layout} n{w[0].shape[0]}", out.reshape(m, -1), ref, pytorch)


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(4, 1), (1, 4)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rows, k", SIBLINGS)
def test_int8_gemv_siblings_equal_each_weights_own_launch(rows, k, shape, scale_dtype):
    """`int8_gemv_siblings` gives each weight's output of the GEMV at the same CTA shape, bit for bit."""
    g = torch.Generator(device="cuda").manual_seed(sum(rows) + k)
    ws = [(torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda", generator=g),
           (torch.rand(n, device="cuda", generator=g) / 64 + 1e-3).to(scale_dtype)) for n in rows]
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(1, k, dtype=dtype, device="cuda")
        outs = w4.int8_gemv_siblings(x, ws, shape)
        for out, (w, s) in zip(outs, ws):
            assert out.shape == (1, w.shape[0]) and torch.equal(out, w4.int8_matmul(x, w, s, gemv=shape))
        w, s = ws[-1]
        wd = w.double() * s.double()[:, None]
        report(f"int8 gemv siblings {rows} k{k} {shape}", outs[-1], x.double() @ wd.T, F.linear(x, wd.to(dtype)))


@pytest.mark.parametrize("m", [1, 2])
def test_int8_sibling_linears_op_under_cuda_graph_replay(m):
    """The op on CUDA, captured once and replayed on new x: each output within the float64 bound (one row: the
    one-launch GEMV; two rows: the calls one by one, `fa4::int8_linear`'s bit for bit)."""
    from fa4_inductor.kernels import INT8_LINEAR, INT8_SIBLING_LINEARS
    from fa4_inductor.kernels import int8_sibling_linears as op

    k, rows = 2048, (2048, 512, 512)
    g = torch.Generator(device="cuda").manual_seed(m)
    ws = [(torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda", generator=g),
           (torch.rand(n, device="cuda", generator=g) / 64 + 1e-3).to(torch.bfloat16)) for n in rows]
    x = torch.randn(m, 1, k, dtype=torch.bfloat16, device="cuda")
    args = ([w for w, _ in ws], [s for _, s in ws], [None] * 3)
    assert op.one_launch(x.reshape(-1, k), *args) == (m == 1)
    graph, static = capture(lambda: INT8_SIBLING_LINEARS(x, *args, scale_after_matmul=True))
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        for out, (w, s) in zip(static, ws):
            alone = INT8_LINEAR(x, w, s, scale_after_matmul=True)
            if m > 1:
                assert torch.equal(out, alone)
            wd = w.double() * s.double()[:, None]
            report(f"int8 sibling op m{m} n{w.shape[0]}", out.reshape(m, -1), x.reshape(m, k).double() @ wd.T,
                   F.linear(x.reshape(m, k), wd.to(x.dtype)))


# ------------------------------------------------------------------------------- fp8 (e4m3) weights, tensor cores


def random_fp8(n, k, seed=0, nan_rows=()):
    """Every e4m3 code equally likely (subnormals and +-448 included), NaN codes only in `nan_rows`."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k), dtype=torch.uint8, generator=g)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # NaN -> 1.0
    for r in nan_rows:
        codes[r, torch.randint(0, k, (1,), generator=g)] = 0x7F
    return codes.view(torch.float8_e4m3fn).cuda()


def fp8_case(m, n, k, dtype, *, bias=False, x_scale="row", w_scale="channel", splits=None, seed=0,
             load="registers", cta=None):
    g = torch.Generator().manual_seed(seed)
    w = random_fp8(n, k, seed)
    ws = (torch.rand(n if w_scale == "channel" else 1, generator=g) / 100 + 1e-3).cuda()
    xs = None if x_scale is None else (torch.rand(m if x_scale == "row" else 1, generator=g) + 0.5).cuda()
    b = torch.randn(n, dtype=dtype, device="cuda") if bias else None
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    out = w4.fp8_matmul(x, w, ws, xs, b, splits=splits, load=load, cta=cta)
    assert out.shape == (m, n) and out.dtype == dtype
    wd = w.double() * ws.double().reshape(-1, 1)
    rows = 1 if xs is None else xs.double().reshape(-1, 1)
    ref = x.double() @ wd.T * rows + (b.double() if bias else 0)
    pytorch = F.linear(x, wd.to(dtype)) * (1 if xs is None else xs.reshape(-1, 1).to(dtype)) + (b if bias else 0)
    report(f"fp8 {str(dtype)[6:]} m{m} n{n} k{k} bias {bias} x_scale {x_scale} w_scale {w_scale} "
           f"{plan(n, k, 'fp8', m, splits, cta, load)}", out, ref, pytorch)


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("m", range(1, 17))
def test_fp8_every_m(m, load):
    fp8_case(m, 1000, 2064, torch.bfloat16, bias=m % 2 == 1, x_scale=("row", "tensor", None)[m % 3],
             w_scale=("channel", "tensor")[m % 2], seed=m, load=load)  # N, K not multiples of 64


@pytest.mark.parametrize("load", MORE_LOADS)
@pytest.mark.parametrize("splits", [1, 2, 7])
@pytest.mark.parametrize("x_scale, w_scale", [("row", "channel"), ("tensor", "tensor"), (None, "channel")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fp8_splits_scales_and_dtypes(dtype, x_scale, w_scale, splits, load):
    """The split path applies the scales (and bias) in the reduce kernel, the unsplit one in the main kernel."""
    fp8_case(5, 4096, 4096, dtype, bias=True, x_scale=x_scale, w_scale=w_scale, splits=splits, load=load)
    fp8_case(16, 2048, 8192, dtype, x_scale=x_scale, w_scale=w_scale, splits=splits, load=load)


@pytest.mark.parametrize("cta", [(1, 1, 8), (2, 2, 4), (4, 1, 8), (2, 1, 2)], ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("m", [1, 9])
def test_fp8_forced_cta_shapes(cta, m):
    fp8_case(m, 3000, 4160, torch.bfloat16, bias=True, cta=cta, load="rolling")


@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise", "tensorwise"])
def test_fp8_matches_scaled_mm(m, rowwise):
    """torchao's dynamic fp8 linear: x quantized to e4m3 with its scale, then `torch._scaled_mm`. Ours on the same
    codes (x cast exactly to bf16) against float64, with `_scaled_mm`'s own error as the bound."""
    n, k = 4096, 2048
    w = random_fp8(n, k, seed=m)
    w_scale = torch.rand(n if rowwise else 1, 1, device="cuda") / 100 + 1e-3
    x = torch.randn(m, k, device="cuda")
    x_scale = x.abs().amax(dim=-1 if rowwise else (0, 1), keepdim=True).float() / 448
    x_fp8 = (x / x_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    theirs = torch._scaled_mm(x_fp8, w.t(), x_scale.reshape(-1, 1) if rowwise else x_scale.reshape(()),
                              w_scale.reshape(1, -1) if rowwise else w_scale.reshape(()), out_dtype=torch.bfloat16,
                              use_fast_accum=True)
    ours = w4.fp8_matmul(x_fp8.to(torch.bfloat16), w, w_scale.reshape(-1), x_scale.reshape(-1))
    ref = (x_fp8.double() @ w.double().T) * x_scale.double().reshape(-1, 1) * w_scale.double().reshape(1, -1)
    report(f"fp8 vs _scaled_mm m{m} {'rowwise' if rowwise else 'tensorwise'}", ours, ref, theirs)


def test_fp8_nan_weight_codes_give_nan_columns():
    """e4m3's NaN code decodes to NaN (the cvt is exact), so its output column is NaN as in eager; the others hold."""
    n, k = 256, 512
    w = random_fp8(n, k, seed=3, nan_rows=(5, 77))
    x = torch.randn(4, k, dtype=torch.bfloat16, device="cuda")
    for split in (1, 3):
        out = w4.fp8_matmul(x, w, torch.ones(n, device="cuda"), splits=split)
        nan_cols = out.isnan().any(0).nonzero().flatten().tolist()
        assert nan_cols == [5, 77], (split, nan_cols)
        keep = torch.ones(n, dtype=torch.bool, device="cuda")
        keep[[5, 77]] = False
        assert out[:, keep].isfinite().all()


@pytest.mark.parametrize("m", [1, 16])
def test_fp8_cuda_graph_capture_and_replay(m):
    n, k = 4096, 4096
    w = random_fp8(n, k)
    w_scale = torch.rand(n, device="cuda") / 100 + 1e-3
    x_scale = torch.rand(m, device="cuda") + 0.5
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    w4.warmup(torch.bfloat16, "fp8", (m,), bias=False, row_scale=True)
    graph, out = capture(lambda: w4.fp8_matmul(x, w, w_scale, x_scale))
    for i in range(2):
        x.copy_(torch.randn_like(x))
        x_scale.copy_(torch.rand_like(x_scale) + 0.5)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, w4.fp8_matmul(x, w, w_scale, x_scale)), f"fp8 replay {i}"
        wd = w.double() * w_scale.double()[:, None]
        report(f"graph fp8 m{m} replay {i}", out, x.double() @ wd.T * x_scale.double()[:, None],
               F.linear(x, wd.to(x.dtype)) * x_scale[:, None].to(x.dtype))
