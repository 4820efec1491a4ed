"""CPU tier of the integer int8-weight GEMV of 1..4 rows (`kernels/cute/int8_int_gemv.py`, host
`kernels/int8_int_gemv.py`): its dp4a sums emulated in PyTorch are the exact block products, its result stays within
the x bound against the float64 reference, the host path keys and routes its variants, and they compile for sm_90a
without a GPU. Numerics on the device: `test_gpu_w4a16.py` (`int8_int_gemv` tests)."""

import pytest
import torch

from fa4_inductor.kernels import int8_int_gemv as g8, nvfp4_int_gemv as g, switches, w4a16_decode as w4
from test_nvfp4_int_gemv import ARCH, launches  # noqa: F401 (a fixture)
from test_w4a16_compile import cute_dsl  # noqa: F401 (a fixture)


def random_int8(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w_int8 [n, k] over the whole range -128..127, a float32 scale [n], a bf16 bias [n])."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int64).to(torch.int8)
    return w, torch.rand(n, generator=gen) * 0.02 + 1e-3, torch.randn(n, generator=gen).to(torch.bfloat16)


def test_the_kernels_dp4a_sums_are_the_exact_block_products():
    """`piece`'s integer steps (s8 x u8 and s8 x s8 dot products of each weight word with the x planes, s0 + 256 s1)
    give, per row and block, exactly sum(w * y), at the extremes of both (weights -128 and 127, y +-32640)."""
    n, k = 9, 256
    w, _, _ = random_int8(n, k, seed=1)
    w[0, :16] = -128
    w[1, :16] = 127
    x = (torch.randn(k) * 3).to(torch.bfloat16)
    x[:16] = torch.tensor([1.0, -1.0] * 8, dtype=torch.bfloat16) * 7.96875  # |y| 32640 on every value
    low, high, _, _ = g.quantize_blocks(x)
    words = w4.byte_words(w).long() & 0xFFFFFFFF
    y, _ = g.x_integers(x)
    assert y[:16].abs().eq(32640).all()
    assert torch.equal(g8.block_sums(words, low, high), (w.long() * y).reshape(n, -1, 16).sum(-1))


def float64_reference(x, w, scale, bias):
    out = x.double() @ (w.double() * scale.double()[:, None]).T
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m, n, k, biased", [(1, 64, 4096, False), (3, 7, 48, True), (2, 33, 2064, True),
                                             (4, 5, 16384, False)])
def test_emulated_result_is_the_float64_product_within_the_x_bound(dtype, m, n, k, biased):
    w, scale, bias = random_int8(n, k, seed=n + k)
    bias = bias if biased else None
    x = torch.randn(m, k)
    x[0, 5] = 200.0  # an outlier: its block's small values round
    x = x.to(dtype)
    got = g8.emulate(x, w, scale, bias)
    ref = float64_reference(x, w, scale, bias)
    wd = (w.double() * scale.double()[:, None]).abs()
    for i in range(m):
        bound = (wd * g.x_error_bound(torch.nn.functional.pad(x[i], (0, -k % 16)))[:k]).sum(-1)
        assert ((got - ref).abs()[i] <= bound * (1 + 1e-12) + 1e-300).all()
    assert (got - ref).abs().max() <= 2.0 ** -12 * ref.abs().max()
    assert (got - ref).abs().max() > 0  # the outlier's block rounds: the bound is not vacuous


def test_a_non_finite_block_of_x_makes_its_outputs_nan():
    w, scale, _ = random_int8(4, 64, seed=2)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    x[1, 20] = float("inf")
    got = g8.emulate(x, w, scale)
    assert got[1].isnan().all() and got[0].isfinite().all()


def test_limits():
    assert g8.unsupported_reason(torch.empty(4, 64), 8, 64) is None
    assert g8.unsupported_reason(torch.empty(5, 64), 8, 64) == "the integer int8 GEMV takes 1..4 rows of x, got 5"
    assert g8.unsupported_reason(torch.empty(1, 64), 8, 16400) == "the integer int8 GEMV takes K <= 16384, got 16400"
    assert g.pieces_bucket(1024, g8.MAX_PIECES, g8.PIECE_VALUES) == 1024
    with pytest.raises(ValueError, match=r"1..1024 pieces \(K <= 16384\)"):
        g.pieces_bucket(1025, g8.MAX_PIECES, g8.PIECE_VALUES)


def test_the_host_path(launches):  # noqa: F811 (the fixture)
    """`run`: x padded to whole pieces, the weight's words, the scale and bias as handed over, an output in x's dtype;
    the CTA shape `shape`'s for the rows of x and pieces of the row (16 values a piece), or a forced one; a split is
    refused."""
    w, scale, bias = random_int8(2048, 8200, seed=3)  # K not a multiple of a piece: padded
    x = torch.randn(1, 8200, dtype=torch.bfloat16)
    out = g8.run(x, w, scale, bias)
    key, operands = launches[-1]
    pieces = -(-8200 // 32) * 32 // 16
    assert (key.rows, key.warps_k, key.warps, key.max_pieces) == (*g.shape(2048, 1, 132, pieces)[:2], 4, 1024)
    assert (key.m, key.bias, key.scale_dtype, key.dtype) == (1, True, torch.float32, torch.bfloat16)
    assert operands[0].shape == (1, 16 * pieces // 2) and operands[1].shape == (2048, pieces * 4)
    assert operands[2] is scale and operands[3] is bias and operands[4] is out and out.shape == (1, 2048)
    g8.run(torch.randn(2, 4096, dtype=torch.float16), *random_int8(512, 4096, seed=4)[:2], None, forced=(2, 2, 1, 8))
    key = launches[-1][0]
    assert (key.m, key.rows, key.warps_k, key.warps, key.bias, key.max_pieces) == (2, 2, 2, 8, False, 256)
    with pytest.raises(ValueError, match="does not split K"):
        g8.run(x, w, scale, bias, forced=(4, 1, 2))


def test_int8_matmul_routes_it_on_the_switch_or_when_forced(launches, monkeypatch):  # noqa: F811 (the fixture)
    """`w4a16_decode.int8_matmul`: by default (auto: not yet timed on a GPU) one-row calls keep the fp32 GEMV;
    FA4_INDUCTOR_W4A16_INT_GEMV=on or `gemv="int"` (a forced shape too) send calls of 1..4 rows to the integer GEMV,
    and calls it cannot take (K past 16384) to the fp32 GEMV."""
    monkeypatch.setattr(w4, "unsupported_reason", lambda *args: None)  # its CUDA checks, on the CPU
    w, scale, _ = random_int8(1024, 4096, seed=5)
    x = torch.randn(1, 4096, dtype=torch.bfloat16)
    integer = lambda: isinstance(launches[-1][0], g8.Key)  # noqa: E731
    w4.int8_matmul(x, w, scale)
    assert not integer()
    w4.int8_matmul(x, w, scale, gemv=w4.INT_GEMV)
    assert integer()
    w4.int8_matmul(x, w, scale, gemv=(w4.INT_GEMV, 1, 4))
    assert integer() and (launches[-1][0].rows, launches[-1][0].warps_k) == (1, 4)
    monkeypatch.setenv(switches.W4A16_INT_GEMV, "on")
    switches.reset()
    w4.int8_matmul(torch.randn(4, 4096, dtype=torch.bfloat16), w, scale)
    assert integer()
    w4.int8_matmul(torch.randn(1, 16400, dtype=torch.bfloat16), *random_int8(64, 16400, seed=6)[:2])
    assert not integer()


@pytest.mark.slow  # ~10 s a dtype
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_variants_compile(cute_dsl, dtype):  # noqa: F811 (the fixture)
    for key in (g8.Key(dtype, 1, False, torch.float32, ARCH, 4, 1, 512),
                g8.Key(dtype, 1, True, torch.bfloat16, ARCH, 4, 1, 256, pdl=True),
                g8.Key(dtype, 4, True, torch.float16, ARCH, 2, 2, 64),
                g8.Key(dtype, 2, False, torch.float32, ARCH, 1, 4, 1024, pdl=True),
                g8.Key(dtype, 1, False, torch.float32, ARCH, 4, 1, 512, warps=8)):
        assert callable(g8.compiled(key)) and g8.compiled(key) is g8.compiled(key)
