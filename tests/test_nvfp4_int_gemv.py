"""CPU tier of the integer NVFP4 GEMV of 1..4 rows (`kernels/cute/nvfp4_int_gemv.py`, host `kernels/nvfp4_int_gemv.py`):
its byte tricks emulated in PyTorch give the weights and x planes it means to; its integer x and result stay within
the bound it documents against the float64 reference; its variants compile for sm_90a without a GPU. Numerics on the
device: `test_gpu_w4a16.py` (the `int_gemv` tests)."""

import pytest
import torch

from fa4_inductor.kernels import int8_int_gemv, nvfp4_int_gemv as g, w4a16_decode as w4
from fa4_inductor.kernels.cute import nvfp4_int_gemv as kern
from test_nvfp4_linear import E2M1, float64_reference, random_nvfp4
from test_w4a16_compile import cute_dsl  # noqa: F401 (a fixture)

ARCH = "sm_90a"


def test_weight_bytes_are_64_plus_twice_e2m1_for_every_four_codes():
    selectors = torch.arange(1 << 16, dtype=torch.int64)
    got = g.weight_bytes(selectors | (0x5A5A << 16))  # the high 16 bits are not read
    table = torch.tensor([64 + int(2 * v) for v in E2M1] + [64 - int(2 * v) for v in E2M1])
    for i in range(4):
        assert torch.equal(got >> 8 * i & 0xFF, table[selectors >> 4 * i & 0xF]), i


def test_plane_words_hold_the_low_two_bytes_of_each_value():
    g_ = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 1 << 32, (1000, 4), generator=g_, dtype=torch.int64)
    low, high = g.plane_words(bits)
    for i in range(4):
        assert torch.equal(low >> 8 * i & 0xFF, bits[:, i] & 0xFF)
        assert torch.equal(high >> 8 * i & 0xFF, bits[:, i] >> 8 & 0xFF)


def test_the_rounder_bits_carry_y_in_their_low_16_bits():
    """fp32 bits of 1.5 * 2^23 + y are 0x4B400000 + y for |y| < 2^22, so bytes 0 and 1 are y's two's complement."""
    y = torch.arange(-32768, 32768, dtype=torch.int64)
    bits = (y.float() + kern.ROUNDER).view(torch.int32).long() & 0xFFFFFFFF
    assert torch.equal(bits - kern.ROUNDER_BITS, y)
    b1 = (bits >> 8 & 0xFF)
    assert torch.equal((bits & 0xFF) + 256 * torch.where(b1 >= 128, b1 - 256, b1), y)


@pytest.mark.parametrize("dtype, exact_below", [(torch.bfloat16, 2.0 ** -7), (torch.float16, 2.0 ** -4)])
def test_x_integers_are_exact_near_the_block_max_and_bounded_below(dtype, exact_below):
    g_ = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 16, generator=g_) * torch.exp2(torch.randint(-12, 12, (64, 16), generator=g_).float()))
    x[3] = 0.0
    x[4, 5] = 1e4  # an outlier block
    x = x.to(dtype).reshape(-1)
    y, s = g.x_integers(x)
    assert y.abs().max() <= (32640 if dtype == torch.bfloat16 else 32752) and (s <= kern.MAX_SHIFT).all()
    approx = y.double() * torch.pow(2.0, -s.double()).repeat_interleave(16)
    err = (approx - x.double()).abs()
    amax = x.double().reshape(-1, 16).abs().amax(1).repeat_interleave(16)
    near = x.double().abs() >= amax * exact_below
    assert (err[near] == 0).all()
    bound = g.x_error_bound(x)
    assert (err <= bound).all() and ((bound <= amax * 2.0 ** -15) | (amax == 0)).all()
    assert not err[~near].eq(0).all()  # the bound is not vacuous: some small values are rounded


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m, n, k", [(1, 64, 4096), (3, 7, 48), (2, 33, 2064)])
def test_emulated_result_is_the_float64_product_within_the_x_bound(dtype, m, n, k):
    w_fp4, block, global_scale = random_nvfp4(n, k, seed=n + k)
    x = torch.randn(m, k, dtype=torch.float32)
    x[0, 5] = 200.0  # an outlier: its block's small values round
    x = x.to(dtype)
    got = g.emulate(x, w_fp4, block, global_scale)
    ref = float64_reference(x, w_fp4, block, global_scale)
    from test_nvfp4_linear import float64_dequantized

    wd = float64_dequantized(w_fp4, block, global_scale).abs()
    for i in range(m):
        bound = (wd * g.x_error_bound(torch.nn.functional.pad(x[i], (0, -k % 16)))[:k]).sum(-1)
        assert ((got - ref).abs()[i] <= bound * (1 + 1e-12) + 1e-300).all()
    assert (got - ref).abs().max() <= 2.0 ** -12 * ref.abs().max()  # far below the bf16 output's rounding


def test_a_non_finite_block_of_x_makes_the_outputs_nan():
    w_fp4, block, global_scale = random_nvfp4(4, 64, seed=3)
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    x[0, 20] = float("inf")
    assert g.emulate(x, w_fp4, block, global_scale).isnan().all()


def test_shape_prefers_four_rows_a_warp_and_covers_the_sms():
    assert [g.shape(n, 1, 132, 256) for n in (14336, 8192, 4096, 2048, 1024, 512, 100)] == \
        [(4, 1, 1), (4, 1, 1), (4, 1, 1), (4, 2, 1), (2, 2, 1), (1, 2, 1), (1, 4, 1)]
    assert [g.shape(8192, m, 132, 256) for m in (2, 3, 4)] == [(4, 1, 1), (2, 2, 1), (2, 2, 1)]
    # a K warp needs a 32-piece step of its own: K = 1024 (32 pieces) keeps one K warp, then the most CTAs
    assert g.shape(512, 1, 132, 32) == (1, 1, 1)


def test_split_shapes_grow_the_ctas_of_weights_of_few_rows():
    """Split (FA4_INDUCTOR_GEMV_SPLIT): the fewest splits that bring a shape to 3 CTAs a SM, two 32-piece steps a
    K warp each; weights with CTAs enough stay unsplit."""
    assert g.shape(2048, 1, 132, 256, True) == (4, 1, 4)  # the down projection: 128 row groups, 512 CTAs
    assert g.shape(4096, 1, 132, 448, True) == (4, 1, 2)  # 4096 x 14336
    assert g.shape(8192, 1, 132, 256, True) == (4, 1, 1)  # 512 CTAs already
    assert g.shape(8192, 1, 132, 64, True) == (4, 1, 1)
    assert g.shape(2048, 1, 132, 64, True) == (4, 2, 1)  # 2048 x 2048: two steps a split would leave one
    assert g.shape(1024, 1, 132, 128, True) == (2, 2, 1)  # 1024 x 4096: (4, 1) split in two has 128 CTAs
    assert g.shape(512, 1, 132, 512, True) == (4, 1, 8)  # 32 row groups x 8
    assert g.shape(2048, 2, 132, 256, True) == (4, 1, 4)
    assert g.shape(2048, 4, 132, 256, True) == (2, 2, 1)  # 512 CTAs unsplit
    assert g.splits(10, 256, 1, 132) == 4 and g.splits(10, 512, 1, 132) == 8 and g.splits(10, 63, 1, 132) == 1


def test_forced_shapes_fill_in_the_defaults():
    """`gemv=("int", R, K[, S[, W]])` (tests, `tests/bench_w4a16.py --gemv int:RxK[xS[xW]]`): unsplit CTAs of 4 warps
    unless given; the matmul takes every length as the integer GEMV's."""
    assert [g.forced_shape(f) for f in ((4, 1), (4, 1, 2), (4, 1, 2, 16))] == \
        [(4, 1, 1, 4), (4, 1, 2, 4), (4, 1, 2, 16)]
    with pytest.raises(ValueError, match="forced integer-GEMV shape"):
        g.forced_shape((4, 1, 2, 16, 1))
    assert all(w4._is_int_gemv((w4.INT_GEMV, *f)) for f in ((4, 1), (4, 1, 2), (4, 1, 2, 16)))
    assert not w4._is_int_gemv((4, 1)) and not w4._is_int_gemv(True)


@pytest.fixture
def launches(monkeypatch):
    """The GEMVs' host paths off CUDA: a 132-SM device 0, and each compiled variant's key and operands recorded
    instead of launched."""
    import contextlib

    from fa4_inductor.kernels import switches
    from fa4_inductor.kernels.cute import compile_utils

    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(w4, "_num_sms", lambda device: 132)
    monkeypatch.setattr(compile_utils, "target_arch", lambda device: ARCH)
    monkeypatch.setattr(g, "compiled", lambda key: lambda *operands: calls.append((key, operands)))
    monkeypatch.setattr(int8_int_gemv, "compiled", lambda key: lambda *operands: calls.append((key, operands)))
    monkeypatch.setattr(w4, "compiled_gemv", lambda key: lambda *operands: calls.append((key, operands)))
    yield calls
    switches.reset()


def test_the_host_path_keys_a_forced_or_ruled_split(launches, monkeypatch):
    """The integer GEMV's launch: a forced (rows, K warps, splits[, warps]) and, with FA4_INDUCTOR_GEMV_SPLIT=on, the
    rule's split; the shared memory sized for a split's run of pieces. The fp32 GEMV keys its split the same way."""
    from fa4_inductor.kernels import switches

    w_fp4, block, global_scale = random_nvfp4(2048, 8192, seed=1)
    x = torch.randn(1, 8192, dtype=torch.bfloat16)
    g.run(x, w_fp4, block, global_scale, 2048, forced=(4, 1, 2))  # `matmul` without its CUDA check
    g.run(x, w_fp4, block, global_scale, 2048, forced=(4, 1, 1, 16))
    g.run(x, w_fp4, block, global_scale, 2048)
    monkeypatch.setenv(switches.GEMV_SPLIT, "on")
    switches.reset()
    g.run(x, w_fp4, block, global_scale, 2048)
    words, blocks = w4.prepare_nvfp4(w_fp4, block)
    w4._run_gemv("nvfp4", x, words, blocks, global_scale.reshape(1), None, 2048)
    keys = [key for key, _ in launches]
    assert [(k.rows, k.warps_k, k.splits, k.warps, k.max_pieces) for k in keys[:4]] == \
        [(4, 1, 2, 4, 128), (4, 1, 1, 16, 256), (4, 2, 1, 4, 256), (4, 1, 4, 4, 64)]
    assert (keys[4].rows, keys[4].warps_k, keys[4].splits) == w4.gemv_shape(2048, 256, 132, True) == (4, 4, 1)
    out = launches[3][1][-1]
    assert out.shape == (1, 2048) and out.dtype == torch.bfloat16


def test_the_host_path_takes_wide_ctas_for_long_weights(launches, monkeypatch):
    """One-row calls over weights of 4096 rows or more and K of 8192 or more take CTAs of 8 warps (`wide_shape`), K
    split in 2 past 8192; shorter or narrower weights, more rows of x, sibling launches and the split rule keep
    `shape`'s CTAs of 4 warps."""
    from fa4_inductor.kernels import switches

    for n, k, m in ((4096, 14336, 1), (8192, 8192, 1), (4096, 4096, 1), (2048, 8192, 1), (4096, 8192, 2)):
        w_fp4, block, global_scale = random_nvfp4(n, k, seed=n + k)
        g.run(torch.randn(m, k, dtype=torch.bfloat16), w_fp4, block, global_scale, n)
    w = random_nvfp4(4096, 8192, seed=3)
    g.run_siblings(torch.randn(1, 8192, dtype=torch.bfloat16), [w, w])
    monkeypatch.setenv(switches.GEMV_SPLIT, "on")
    switches.reset()
    g.run(torch.randn(1, 8192, dtype=torch.bfloat16), *w, 4096)
    assert [(key.rows, key.warps_k, key.splits, key.warps) for key, _ in launches] == [
        (4, 1, 2, 8), (4, 1, 1, 8), (4, 1, 1, 4), (4, 2, 1, 4), (4, 1, 1, 4), (4, 1, 1, 4), (4, 1, 2, 4)]


def test_the_gated_host_path(launches):
    """`run_gated`: gate's and up's operands in the kernel's order, the CTA shape of their rows together with an even
    number of rows a warp (one of each), one output of gate's rows; mismatched weights or an odd forced shape are
    errors."""
    gate, up = random_nvfp4(2048, 2048, seed=1), random_nvfp4(2048, 2048, seed=2)
    x = torch.randn(1, 2048, dtype=torch.bfloat16)
    out = g.run_gated(x, gate, up)
    key, operands = launches[-1]
    assert (key.gated, key.weights, key.rows, key.warps_k) == ("silu", 2, *g.shape(4096, 1, 132, 64)[:2])
    g.run_gated(x, gate, up, activation="gelu_tanh")
    assert launches[-1][0].gated == "gelu_tanh"
    assert len(operands) == 8 and operands[-1] is out and out.shape == (1, 2048) and out.dtype == torch.bfloat16
    assert torch.equal(operands[6], up[2].reshape(1).float()) and torch.equal(operands[3], gate[2].reshape(1).float())
    g.run_gated(torch.randn(1, 2048, dtype=torch.bfloat16), gate, up, forced=(1, 4))
    assert launches[-1][0].rows == 2  # one row a warp would hold no pair
    with pytest.raises(ValueError, match="an even number of rows a warp"):
        g.run_gated(x, gate, up, forced=(3, 1))
    with pytest.raises(ValueError, match="weights of one shape"):
        g.run_gated(x, gate, random_nvfp4(1024, 2048, seed=3))


@pytest.mark.parametrize("pieces", [1, 31, 32, 63, 64, 100, 256, 257, 448, 512])
@pytest.mark.parametrize("warps_k", [1, 2, 4])
@pytest.mark.parametrize("splits", [1, 2, 4, 8])
def test_the_splits_partition_each_row(pieces, warps_k, splits):
    """`W4A16Gemv.start`'s pieces begin..end of the cluster's CTAs, from `split_pieces`: whole steps each, together
    every piece of the row once, none past the row's end, each at most the run its shared memory is sized for."""
    run = g.split_pieces(pieces, warps_k, splits)
    ranges = [(min(c * run, pieces), min(min(c * run, pieces) + run, pieces)) for c in range(splits)]
    assert [p for b, e in ranges for p in range(b, e)] == list(range(pieces))
    assert splits == 1 or run % (32 * warps_k) == 0
    assert g.pieces_bucket(max(run, 1)) >= max(e - b for b, e in ranges)


def test_pieces_bucket_and_limits():
    assert [g.pieces_bucket(p) for p in (1, 16, 17, 256, 448, 512)] == [16, 16, 32, 256, 512, 512]
    with pytest.raises(ValueError, match="1..512 pieces"):
        g.pieces_bucket(513)
    x = torch.empty(2, 64)
    assert g.unsupported_reason(x, 8, 64) is None
    assert g.unsupported_reason(torch.empty(5, 64), 8, 64) == "the integer NVFP4 GEMV takes 1..4 rows of x, got 5"
    assert g.unsupported_reason(torch.empty(1, 64), 8, 16400) == "the integer NVFP4 GEMV takes K <= 16384, got 16400"


@pytest.mark.slow  # 11 s a dtype: the fast tier's 5 minutes
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_variants_compile(cute_dsl, dtype):
    for key in (g.Key(dtype, 1, ARCH, 4, 1, 256), g.Key(dtype, 1, ARCH, 1, 4, 16, pdl=True),
                g.Key(dtype, 3, ARCH, 2, 1, 64), g.Key(dtype, 1, ARCH, 4, 1, 256, pdl=True, prefetch=4),
                g.Key(dtype, 2, ARCH, 2, 2, 64, prefetch=3), g.Key(dtype, 1, ARCH, 8, 1, 16),  # 8 rows: no window
                g.Key(dtype, 1, ARCH, 4, 1, 64, pdl=True, weights=3), g.Key(dtype, 1, ARCH, 4, 1, 64, weights=2),
                g.Key(dtype, 2, ARCH, 2, 2, 64, weights=2), g.Key(dtype, 1, ARCH, 4, 1, 64, pdl=True, splits=4),
                g.Key(dtype, 4, ARCH, 2, 2, 128, splits=8), g.Key(dtype, 1, ARCH, 4, 1, 64, prefetch=4, splits=2),
                g.Key(dtype, 1, ARCH, 4, 1, 256, pdl=True, warps=16),
                g.Key(dtype, 2, ARCH, 4, 2, 64, warps=8, splits=2),
                g.Key(dtype, 1, ARCH, 4, 1, 64, pdl=True, weights=2, gated="silu"),
                g.Key(dtype, 4, ARCH, 2, 2, 128, weights=2, gated="gelu_tanh")):
        assert callable(g.compiled(key)) and g.compiled(key) is g.compiled(key)


def test_the_switch():
    from fa4_inductor.kernels import switches

    assert switches.read({}).w4a16_int_gemv is None
    assert switches.read({"FA4_INDUCTOR_W4A16_INT_GEMV": "auto"}).w4a16_int_gemv is None
    assert switches.read({"FA4_INDUCTOR_W4A16_INT_GEMV": "1"}).w4a16_int_gemv is True
    assert switches.read({"FA4_INDUCTOR_W4A16_INT_GEMV": "off"}).w4a16_int_gemv is False
    with pytest.raises(ValueError, match="auto, on or off"):
        switches.read({"FA4_INDUCTOR_W4A16_INT_GEMV": "sometimes"})
    assert switches.read({}).int_gemv_prefetch == 0
    assert switches.read({}).gemv_split is None and not g.configured_split()
    assert switches.read({"FA4_INDUCTOR_GEMV_SPLIT": "on"}).gemv_split is True
    assert switches.read({"FA4_INDUCTOR_INT_GEMV_PREFETCH": "6"}).int_gemv_prefetch == 6
    for value in ("2", "-1", "many"):
        with pytest.raises(ValueError, match="0 or a step count of at least 3"):
            switches.read({"FA4_INDUCTOR_INT_GEMV_PREFETCH": value})


def test_one_row_calls_take_it_where_it_measured_faster():
    from fa4_inductor.kernels import w4a16_decode as w4

    faster = [(8192, 8192), (8192, 2048), (14336, 4096), (4096, 14336), (4096, 4096), (2048, 2048), (512, 2048),
              (128256, 4096)]
    slower = [(2048, 8192), (1024, 4096)]
    assert all(w4.int_gemv_auto(1, n, k) for n, k in faster)
    assert not any(w4.int_gemv_auto(1, n, k) for n, k in slower)
    assert not w4.int_gemv_auto(2, 8192, 8192)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_kernels_block_quantization_step_by_step_gives_x_integers(dtype):
    """The kernel's bit-level steps (exponent field, multiplier and inverse bit patterns, the rounder, the packing)
    give the y, 2^-s and 64 * sum(y) that `x_integers` defines."""
    g_ = torch.Generator().manual_seed(5)
    span = 20 if dtype == torch.bfloat16 else 12  # finite in fp16
    x = torch.randn(300, 16, generator=g_) * torch.exp2(torch.randint(-span, span, (300, 1), generator=g_).float())
    x[7] = 0.0
    x[8, :] = 1e-38  # subnormal in fp32 (zero in fp16): the clamped shift
    x = x.to(dtype).reshape(-1)
    low, high, inverse, correction = g.quantize_blocks(x)
    y, s = g.x_integers(x)
    got = torch.stack([(low >> 8 * i & 0xFF) + 256 * (((high >> 8 * i & 0xFF) + 128) % 256 - 128)
                       for i in range(4)], dim=-1).reshape(-1)
    assert torch.equal(got, y)
    assert torch.equal(inverse.to(torch.int32).view(torch.float32).double(), torch.pow(2.0, -s.double()))
    assert torch.equal(correction, 64 * y.reshape(-1, 16).sum(1))
    x[40] = float("nan")
    assert g.quantize_blocks(x)[2][2].item() == kern.NAN_BITS  # value 40 is in block 2


def test_the_kernels_dp4a_sums_are_the_exact_block_products():
    """`piece`'s integer steps (weight bytes, u8 x u8 and u8 x s8 dot products, the offset's correction) give, per row
    and block, exactly sum(2 * e2m1 * y)."""
    n, k = 9, 256
    w_fp4, _, _ = random_nvfp4(n, k, seed=11)
    x = (torch.randn(k) * 3).to(torch.bfloat16)
    low, high, _, correction = g.quantize_blocks(x)
    words = w4.nvfp4_words(w_fp4).long() & 0xFFFFFFFF
    got = g.block_sums(words, low, high, correction)
    y, _ = g.x_integers(x)
    codes = torch.stack([w_fp4.long() & 0xF, w_fp4.long() >> 4], dim=-1).reshape(n, k)
    twice = torch.tensor([int(2 * v) for v in E2M1] + [-int(2 * v) for v in E2M1])[codes]
    assert torch.equal(got, (twice * y).reshape(n, -1, 16).sum(-1))
