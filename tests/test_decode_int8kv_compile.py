"""CPU tier of the int8-KV decode kernel (`kernels/decode_int8kv.py`, `kernels/cute/decode_attention_int8kv.py`).

- The kernel's index maps replayed on a simulated warp: the cp.async lane -> chunk writes, the shared
  swizzles, the 16-byte fragment reads and the mma.sync m16n8k16 fragment semantics (PTX ISA) give
  Q K^T and P V over the right head-dim columns, and the fragment reads are free of bank conflicts.
- The int8 -> half2 bit trick, emulated for every int8 pair, is exact in fp16 and bf16.
- Compile-only: CuTe DSL compiles the variants for sm_90a on a CPU.
- Host rules: declines, split counts, ring depth, warmup.
Numerics on a GPU are in `test_gpu_decode_int8kv.py`.
"""

import os
import subprocess
import sys

import pytest
import torch

from fa4_inductor.kernels import decode, decode_int8kv, switches

ARCH = "sm_90a"


@pytest.fixture(scope="module")
def cute_dsl():
    os.environ.setdefault("CUTE_DSL_ARCH", ARCH)
    pytest.importorskip("cutlass")
    pytest.importorskip("tvm_ffi", reason="the decode kernels compile with --enable-tvm-ffi")


@pytest.fixture(scope="module")
def kernel_module(cute_dsl):
    from fa4_inductor.kernels.cute import decode_attention_int8kv

    return decode_attention_int8kv


# ---------------------------------------------------------------------------------------------
# A simulated warp
# ---------------------------------------------------------------------------------------------


def _prmt(a: int, b: int, selector: int) -> int:
    data = a.to_bytes(4, "little") + b.to_bytes(4, "little")
    return int.from_bytes(bytes(data[(selector >> (4 * i)) & 7] for i in range(4)), "little")


def _write_tile(km, smem: bytearray, base: int, tile: torch.Tensor, chunk_of, d: int):
    """What `load_tile`'s lanes write: chunk lane % C of rows lane // C + n * (32 // C), to position chunk_of(row, chunk)."""
    c = d // 16
    written = set()
    for lane in range(32):
        for n in range(c // 2):
            row, chunk = lane // c + n * (32 // c), lane % c
            at = base + row * d + chunk_of(row, chunk, d) * 16
            assert at not in written
            written.add(at)
            smem[at:at + 16] = bytes(tile[row, chunk * 16:chunk * 16 + 16].view(torch.uint8).tolist())
    assert len(written) == 16 * c


def _words(smem: bytearray, at: int, n: int) -> list[int]:
    return [int.from_bytes(smem[at + 4 * w:at + 4 * w + 4], "little") for w in range(n)]


def _signed(byte: int) -> int:
    return byte - 256 if byte > 127 else byte


@pytest.mark.parametrize("d", [64, 128, 256])
def test_index_maps_feed_the_mma_the_right_columns(kernel_module, d):
    km = kernel_module
    g_ = torch.Generator().manual_seed(d)
    k = torch.randint(-128, 128, (16, d), generator=g_, dtype=torch.int8)
    v = torch.randint(-128, 128, (16, d), generator=g_, dtype=torch.int8)
    smem = bytearray(2 * 16 * d)
    _write_tile(km, smem, 0, k, km.k_chunk, d)
    _write_tile(km, smem, 16 * d, v, km.v_chunk, d)
    c = d // 16

    # K: register h of k-block kb (m16n8k32, 4 int8 each: k = 32 kb + 16 h + 4 t + byte) of n-block j must hold
    # K[n][k_column(k)] (Q's digits are laid out in that order too)
    b_k = torch.zeros(d, 16, dtype=torch.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for j in range(2):
            row = 8 * j + g
            for i in range(c // 4):
                words = _words(smem, row * d + km.k_chunk(row, t + 4 * i, d) * 16, 4)
                for w in range(4):
                    kb, h = 2 * i + w // 2, w % 2
                    for e in range(4):
                        b_k[32 * kb + 16 * h + 4 * t + e, row] = _signed((words[w] >> (8 * e)) & 0xFF)
    cols = torch.tensor([km.k_column(x, d) for x in range(d)])
    assert sorted(cols.tolist()) == list(range(d))
    torch.testing.assert_close(b_k, k.long()[:, cols].T, rtol=0, atol=0)

    # V: B[key][n] of n-block nb must be V[key][v_column(nb * 8 + n)]
    b_v = torch.zeros(16, d, dtype=torch.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        words = []
        for kk in range(4):
            row = 2 * t + kk % 2 + 8 * (kk // 2)
            if d == 64:
                words.append(_words(smem, 16 * d + row * d + km.v_chunk(row, g // 2, d) * 16 + (g % 2) * 8, 2))
            else:
                words.append(sum((_words(smem, 16 * d + row * d + km.v_chunk(row, g + 8 * i, d) * 16, 4)
                                  for i in range(d // 128)), []))
        for h in range(2):
            for w in range(d // 32):
                for byte in range(4):
                    pair = _prmt(words[2 * h][w], words[2 * h + 1][w], ((4 + byte) << 8) | byte)
                    nb = 4 * w + byte
                    b_v[2 * t + 8 * h, nb * 8 + g] = _signed(pair & 0xFF)
                    b_v[2 * t + 8 * h + 1, nb * 8 + g] = _signed((pair >> 16) & 0xFF)
    cols = torch.tensor([km.v_column(x, d) for x in range(d)])
    assert sorted(cols.tolist()) == list(range(d))
    torch.testing.assert_close(b_v, v.long()[:, cols], rtol=0, atol=0)


def _wavefronts(addresses: list[int], width: int) -> int:
    """Shared-memory wavefronts of one warp-wide load of `width` bytes a lane (phases of 128 bytes)."""
    per_phase = 128 // width
    total = 0
    for p in range(0, 32, per_phase):
        banks = {}
        for a in addresses[p:p + per_phase]:
            for word in range(a // 4, (a + width) // 4):
                banks.setdefault(word % 32, set()).add(word)
        total += max(len(s) for s in banks.values())
    return total


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fragment_reads_are_free_of_bank_conflicts(kernel_module, d):
    km = kernel_module
    for j in range(2):
        for i in range(d // 64):
            k_reads = [(8 * j + lane // 4) * d + km.k_chunk(8 * j + lane // 4, lane % 4 + 4 * i, d) * 16
                       for lane in range(32)]
            assert _wavefronts(k_reads, 16) == 4
    for kk in range(4):
        rows = [2 * (lane % 4) + kk % 2 + 8 * (kk // 2) for lane in range(32)]
        if d == 64:  # 8-byte reads of rows 64 bytes apart: two-way at most
            reads = [r * d + km.v_chunk(r, lane // 8, d) * 16 + (lane // 4 % 2) * 8 for lane, r in enumerate(rows)]
            assert _wavefronts(reads, 8) <= 4
        else:
            for i in range(d // 128):
                reads = [r * d + km.v_chunk(r, lane // 4 + 8 * i, d) * 16 for lane, r in enumerate(rows)]
                assert _wavefronts(reads, 16) == 4


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


def _q_digits(km, q_rows: torch.Tensor, scale_log2: float):
    """The kernel's q digits, in float32 arithmetic as it does them: amax per row (NaN-propagating, at least
    Q_AMAX_MIN), inv = Q_MAX Q_BASE / amax, y = rint(q inv), hi = rint(y / Q_BASE), lo = y - Q_BASE hi, and the
    row multiplier amax / (Q_MAX Q_BASE) x scale_log2. q_rows [rows, D] in q's dtype."""
    x = _f32(q_rows)
    amax = x.abs().amax(-1)
    amax = torch.where(x.isnan().any(-1), torch.nan, amax.clamp_min(km.Q_AMAX_MIN))
    inv = torch.tensor(float(km.Q_MAX * km.Q_BASE)) / amax
    y = _f32(x * inv[:, None]).round().nan_to_num(0.0).to(torch.int64)  # cvt.rni: ties to even, NaN -> 0
    hi = _f32(_f32(y.float()) * torch.tensor(1.0 / km.Q_BASE, dtype=torch.float32)).round().to(torch.int64)
    lo = y - km.Q_BASE * hi
    mul = _f32(_f32(amax * torch.tensor(1.0 / (km.Q_MAX * km.Q_BASE), dtype=torch.float32)) * scale_log2)
    return hi, lo, mul


def _imma(a_regs, b_regs):
    """One warp's mma.sync m16n8k32 s8 x s8 -> s32 from its lanes' registers (PTX ISA fragment layouts):
    a_regs[lane] four words (a0: row g, k 4t..; a1: row g + 8; a2, a3: k + 16), b_regs[lane] two words
    (b0: k 4t.. of column g; b1: k + 16). Returns each lane's c0..c3 (rows g, g, g + 8, g + 8; columns 2t, 2t + 1)."""
    a = torch.zeros(16, 32, dtype=torch.int64)
    b = torch.zeros(32, 8, dtype=torch.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for e in range(4):
            for x in range(4):
                a[g + 8 * (x % 2), 4 * t + 16 * (x // 2) + e] = _signed((a_regs[lane][x] >> (8 * e)) & 0xFF)
            for h in range(2):
                b[4 * t + 16 * h + e, g] = _signed((b_regs[lane][h] >> (8 * e)) & 0xFF)
    c = a @ b
    return [[c[lane // 4 + 8 * (x // 2), 2 * (lane % 4) + x % 2].item() for x in range(4)] for lane in range(32)]


def _pack(digits: torch.Tensor) -> list[int]:
    """Int8 digits [..., 4n] as little-endian words [..., n]."""
    u = (digits & 0xFF).reshape(*digits.shape[:-1], -1, 4)
    return (u[..., 0] | (u[..., 1] << 8) | (u[..., 2] << 16) | (u[..., 3] << 24)).tolist()


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_integer_scores_match_float64(kernel_module, d, dtype):
    """S = Q K^T as the kernel computes it, replayed: q's digits (per packed row), the lanes' A registers read
    from the digit words, the B registers straight from the swizzled int8 K tile, the s8 MMA, then
    float(Q_BASE S_hi + S_lo) x row multiplier x k_scale. Against float64 q . (k k_scale) x scale_log2: within
    amax |k|_1 / 64516 (q's 15-bit integer form) plus float32 roundings, well under q's own bf16 / fp16 rounding."""
    km = kernel_module
    gen = torch.Generator().manual_seed(d)
    q = (torch.randn(16, d, generator=gen) * torch.logspace(-3, 2, 16)[:, None]).to(dtype)
    q[5] = 0  # a zero row (and the rows past the packed ones) score 0
    q[7] = q[7] * 1e-36 if dtype is torch.bfloat16 else q[7]  # below Q_AMAX_MIN: inv stays finite
    q[6, 3] = q[6].float().abs().max() * -1  # a tie for the max
    k = torch.randint(-127, 128, (16, d), generator=gen, dtype=torch.int8)
    k_scale = torch.rand(16, generator=gen) * 0.05 + 1e-3
    scale_log2 = d ** -0.5 * 1.4426950408889634
    smem = bytearray(2 * 16 * d)
    _write_tile(km, smem, 0, k, km.k_chunk, d)
    cols = torch.tensor([km.k_column(x, d) for x in range(d)])
    hi, lo, mul = _q_digits(km, q[:, cols], scale_log2)  # logical column order, as the kernel gathers q
    assert hi.abs().max() <= km.Q_MAX and lo.abs().max() <= km.Q_MAX
    words = [_pack(hi), _pack(lo)]  # [row][word]
    acc = torch.zeros(16, 16, dtype=torch.int64)
    for j in range(2):
        digit_sums = []
        for p in range(2):
            total = [[0] * 4 for _ in range(32)]
            for kb in range(d // 32):
                a_regs, b_regs = [], []
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    a_regs.append([words[p][g + 8 * (x % 2)][8 * kb + 4 * (x // 2) + t] for x in range(4)])
                    row = 8 * j + g
                    chunk = _words(smem, row * d + km.k_chunk(row, t + 4 * (kb // 2), d) * 16, 4)
                    b_regs.append([chunk[2 * (kb % 2)], chunk[2 * (kb % 2) + 1]])
                c = _imma(a_regs, b_regs)
                total = [[total[lane][x] + c[lane][x] for x in range(4)] for lane in range(32)]
            digit_sums.append(total)
        for lane in range(32):
            for x in range(4):
                acc[lane // 4 + 8 * (x // 2), 8 * j + 2 * (lane % 4) + x % 2] = \
                    km.Q_BASE * digit_sums[0][lane][x] + digit_sums[1][lane][x]
    assert acc.abs().max() < 2 ** 31
    scores = _f32(_f32(_f32(acc.float()) * mul[:, None]) * k_scale[None, :])
    ref = (q.double() @ (k.double() * k_scale.double()[:, None]).T) * scale_log2
    amax = q.double().abs().amax(-1, keepdim=True)
    bound = (amax / 64516 * k.double().abs().sum(-1)[None, :] * k_scale.double()[None, :] * scale_log2
             + 4 * 2 ** -24 * ref.abs() + 1e-30)
    assert ((scores.double() - ref).abs() <= bound).all(), ((scores.double() - ref).abs() / bound).max()
    assert (scores[5] == 0).all()


def test_q_digits_carry_non_finite_q(kernel_module):
    """A NaN in a q row makes that row's multiplier NaN (so its scores and output are NaN, as the reference's),
    other rows unaffected."""
    q = torch.randn(3, 64)
    q[1, 7] = float("nan")
    hi, lo, mul = _q_digits(kernel_module, q, 1.0)
    assert mul[1].isnan() and mul[[0, 2]].isfinite().all()
    assert hi.abs().max() <= kernel_module.Q_MAX and lo.abs().max() <= kernel_module.Q_MAX


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_int8_pairs_convert_exactly(half):
    """`_int8_pair`'s bit trick for every int8 pair: lane bits as the kernel builds them, the packed subtract
    in float64 (exact here, so round-to-nearest in half precision gives the same)."""
    x = torch.arange(-128, 128, dtype=torch.int32)
    a, b = x.repeat_interleave(256), x.repeat(256)
    t = (a & 0xFF) | ((b & 0xFF) << 16)  # bytes 0 and 2, as prmt leaves them (bytes 1 and 3 are masked off)
    t = t | (torch.randint(0, 256, t.shape, dtype=torch.int32) << 8) | (torch.randint(0, 128, t.shape, dtype=torch.int32) << 24)
    if half is torch.float16:
        v, c = (t & 0x00FF00FF) ^ 0x64806480, torch.full_like(t, 0x64806480)
    else:
        v, c = (t & 0x007F007F) ^ 0x43004300, (t & 0x00800080) ^ 0x43004300

    def lanes(w):
        lo, hi = (w & 0xFFFF).to(torch.int16), ((w >> 16) & 0xFFFF).to(torch.int16)
        return lo.view(half).double(), hi.view(half).double()

    (v_lo, v_hi), (c_lo, c_hi) = lanes(v), lanes(c)
    torch.testing.assert_close(v_lo - c_lo, a.double(), rtol=0, atol=0)
    torch.testing.assert_close(v_hi - c_hi, b.double(), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Compile-only
# ---------------------------------------------------------------------------------------------

# dtype, head_dim, group, q_len, causal, softcap, seqused, split, key_mask: every feature at least once
VARIANTS = [
    (torch.bfloat16, 128, 4, 1, True, False, True, True, False),
    (torch.float16, 64, 8, 2, True, True, False, False, True),
    (torch.bfloat16, 64, 1, 1, False, False, False, True, True),
    (torch.float16, 128, 16, 1, False, False, True, False, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)).replace("torch.", ""))
def test_main_kernel_compiles(cute_dsl, variant):
    key = decode_int8kv._key(*variant, ARCH)
    assert callable(decode_int8kv.compiled(key))
    assert decode_int8kv.compiled(key) is decode_int8kv.compiled(key)


@pytest.mark.slow
def test_half_rows_variant_compiles_where_a_call_packs_at_most_8_rows(cute_dsl, monkeypatch):
    """FA4_INDUCTOR_DECODE_HALF_ROWS=1: calls of at most 8 packed query rows (Sq x group) get the variant that skips
    the softmax of the tile's rows 8-15; larger ones, or the switch off, the full one."""
    monkeypatch.setenv(switches.DECODE_HALF_ROWS, "1")
    switches.reset()
    try:
        picks = {(group, q_len): decode_int8kv._key(torch.bfloat16, 128, group, q_len, False, False, True, True, False,
                                                    ARCH).half_rows for group, q_len in ((4, 1), (4, 2), (4, 3), (8, 1),
                                                                                         (1, 8), (16, 1))}
        assert picks == {(4, 1): True, (4, 2): True, (4, 3): False, (8, 1): True, (1, 8): True, (16, 1): False}
        key = decode_int8kv._key(torch.bfloat16, 64, 4, 1, True, False, True, True, True, ARCH)
        assert key.half_rows and callable(decode_int8kv.compiled(key))
        monkeypatch.setenv(switches.DECODE_HALF_ROWS, "0")
        switches.reset()
        assert not decode_int8kv._key(torch.bfloat16, 64, 4, 1, True, False, True, True, True, ARCH).half_rows
    finally:
        monkeypatch.undo()
        switches.reset()


@pytest.mark.slow
def test_head_dim_256_compiles(cute_dsl):
    key = decode_int8kv._key(torch.bfloat16, 256, 2, 1, True, False, True, True, False, ARCH)
    assert callable(decode_int8kv.compiled(key))


@pytest.mark.slow
def test_warmup_compiles_every_variant_of_a_shape(cute_dsl, monkeypatch):
    assert decode_int8kv.warmup(torch.bfloat16, 128, 4, q_len=1, device="cpu", causal=True, seqused_k=True) > 0
    assert decode_int8kv.warmup(torch.bfloat16, 128, 4, q_len=1, device="cpu", causal=True, seqused_k=True) == 0
    monkeypatch.setattr(decode, "HEAD_DIMS", decode.HEAD_DIMS + (96,))  # the bf16 kernel's 96: not the int8 one's
    for d in (96, 80):
        with pytest.raises(ValueError, match="head"):
            decode_int8kv.warmup(torch.bfloat16, d, 4)


def test_host_head_dims_are_the_kernels(kernel_module):
    assert decode_int8kv.HEAD_DIMS == kernel_module.HEAD_DIMS
    assert set(decode_int8kv.HEAD_DIMS) <= set(decode.HEAD_DIMS)


def test_declines_a_head_dim_the_bf16_kernel_takes_and_the_int8_one_does_not(monkeypatch):
    """Head dim 96 (the bf16 decode kernel's, once routed): the int8-KV kernel declines it by its own head dims."""
    monkeypatch.setattr(decode, "unsupported_reason", lambda *args, **kwargs: None)
    q = torch.randn(1, 8, 1, 96, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 64, 96, dtype=torch.int8)
    s = torch.ones(1, 2, 64)
    assert "head dims" in decode_int8kv.unsupported_reason(q, k, k, k_scale=s, v_scale=s, scale=0.1)


MIN_CTAS_PROBE = """
import torch
from fa4_inductor.kernels import decode_int8kv
key = decode_int8kv._key(torch.bfloat16, 128, 4, 1, False, False, False, True, False, "sm_90a")
ptx = decode_int8kv.compiled(key).__ptx__
print(key.min_ctas, decode_int8kv.ctas_per_sm(128), decode_int8kv.num_splits(1, 8, 1, 4, 32768, 128, 132),
      [l.split()[1] for l in ptx.splitlines() if l.strip().startswith(".minnctapersm")])
"""


@pytest.mark.slow
@pytest.mark.parametrize("cap", ["", "3"])
def test_a_register_cap_asks_ptxas_for_more_ctas(cute_dsl, cap, tmp_path):
    """FA4_INDUCTOR_DECODE_MIN_CTAS=3: the variant's PTX asks for three CTAs a SM (`.minnctapersm`, which caps
    its registers: 160 at head dim 128, no spill, `docs/scripts/sass_stats.py`) and the split rule aims at
    three; unset, two, the CTAs a SM its shared memory allows (without the bound ptxas squeezed the head-dim-64 loop
    to 101 registers, rematerialising its addresses in the loop: b64 x 32k 17% slower on the H200, session 27)."""
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_ARCH=ARCH, **{switches.DECODE_MIN_CTAS: cap})
    out = subprocess.run([sys.executable, "-c", MIN_CTAS_PROBE], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    assert out == ("3 3 50 ['3']" if cap else "2 1 16 ['2']"), out


# ---------------------------------------------------------------------------------------------
# Host rules
# ---------------------------------------------------------------------------------------------


def test_num_splits_targets_one_wave_by_head_dim():
    """hq32 hkv8 on 132 SMs, splits of at least 8 tiles: one wave of one CTA per SM at head dim 128 (of two where a split
    would take more than LONG_SPLIT_KEYS keys), of two at head dims 64 and 256."""
    assert decode_int8kv.num_splits(1, 8, 1, 4, 32768, 128, 132) == 16
    assert decode_int8kv.num_splits(8, 8, 1, 4, 32768, 128, 132) == 4  # 16k keys a split at one CTA a SM: two
    assert decode_int8kv.num_splits(4, 8, 1, 4, 32768, 128, 132) == 4
    assert decode_int8kv.num_splits(1, 8, 1, 4, 131072, 128, 132) == 16
    assert decode_int8kv.num_splits(16, 8, 1, 4, 32768, 128, 132) == 2
    assert decode_int8kv.num_splits(64, 8, 1, 4, 32768, 128, 132) == 1
    assert decode_int8kv.num_splits(1, 8, 1, 4, 1000, 128, 132) == 1000 // 16 // decode.MIN_TILES_PER_SPLIT
    assert decode_int8kv.num_splits(1, 8, 1, 4, 32768, 64, 132) == 33
    assert decode_int8kv.num_splits(8, 8, 1, 4, 32768, 64, 132) == 4
    assert decode_int8kv.num_splits(1, 8, 1, 4, 32768, 256, 132) == 33


def test_stages_fit_shared_memory(monkeypatch):
    assert [decode_int8kv.stages_for(d) for d in (64, 128, 256)] == [8, 5, 2]
    for d in (64, 128, 256):  # the ring holds the warps' fp32 merge buffer
        ring = decode_int8kv.stages_for(d) * decode.NUM_WARPS * 2 * decode.TILE_N * d
        assert ring >= decode.TILE_M * d * decode.NUM_WARPS * 4
    monkeypatch.setenv(decode.SMEM_KB_ENV, "200")
    switches.reset()
    assert decode_int8kv.stages_for(128) == 8


def _inputs(sk=4096, d=128, dtype=torch.bfloat16):
    q = torch.randn(1, 32, 1, d, dtype=dtype)
    k = torch.randint(-128, 128, (1, 8, sk, d), dtype=torch.int8)
    s = torch.rand(1, 8, sk)
    return q, k, s


def test_declines_with_reasons():
    q, k, s = _inputs()
    fl = dict(scale=0.1)
    assert "int8 k and v" in decode_int8kv.unsupported_reason(q, k.float(), k, k_scale=s, v_scale=s, **fl)
    assert "one shape" in decode_int8kv.unsupported_reason(q, k, k[:, :, :7], k_scale=s, v_scale=s, **fl)
    assert "runs on CUDA" in decode_int8kv.unsupported_reason(q, k, k, k_scale=s, v_scale=s, **fl)


def test_declines_bad_scales(monkeypatch):
    """The scale checks, past the device gate (CUDA and sm90 pretended)."""
    monkeypatch.setattr(decode, "unsupported_reason", lambda *a, **kw: None)
    q, k, s = _inputs()
    fl = dict(scale=0.1)
    assert decode_int8kv.unsupported_reason(q, k, k, k_scale=s, v_scale=s, **fl) is None
    assert "needs v_scale" in decode_int8kv.unsupported_reason(q, k, k, k_scale=s, v_scale=None, **fl)
    assert "float32" in decode_int8kv.unsupported_reason(q, k, k, k_scale=s.half(), v_scale=s, **fl)
    assert "shape" in decode_int8kv.unsupported_reason(q, k, k, k_scale=s[:, :4], v_scale=s, **fl)
    strided = torch.rand(1, 8, 2 * 4096)[..., ::2]
    assert "stride 2" in decode_int8kv.unsupported_reason(q, k, k, k_scale=s, v_scale=strided, **fl)


def test_disable_env(monkeypatch):
    monkeypatch.setenv(decode.DISABLE_ENV, "1")
    switches.reset()
    q, k, s = _inputs()
    assert decode.DISABLE_ENV in decode_int8kv.unsupported_reason(q, k, k, k_scale=s, v_scale=s, scale=0.1)
