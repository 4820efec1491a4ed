"""Weight-only decode GEMM for Hopper (sm_90a) in CuTe DSL: out[M, N] = x[M, K] @ dequant(W)[N, K]^T for
M <= 16 (decode steps), x float16 / bfloat16, W NVFP4 or int8. A GEMV-shaped kernel on the CUDA cores: at
these M a linear is a weight read, so the kernel is organised around streaming W once at the memory's rate.

Weights (as `w4a16_decode.py` hands them over; the row-major checkpoint layout, K padded to whole chunks):
- nvfp4: mW Int32 [N, Kp / 8], eight e2m1 codes per word (code k in bits 4k..4k+3: the checkpoint's bytes,
  code 2i in the low nibble of byte i, read little-endian); mBlock Int16 [N, Kp / 32], the two e4m3 block
  scales of a 32-code chunk (block 2c in the low byte); mScale Float32 [1], the global scale.
- int8: mW Int32 [N, Kp / 4], four int8 codes per word; mScale Float32 [N], the per-channel scale.

Work split. A chunk is 16 bytes of one weight row (32 NVFP4 codes or 16 int8 codes). Grid (ceil(N /
rows per CTA), splits): a CTA of NUM_WARPS warps owns ROWS rows per warp; split s (grid y) owns a contiguous
run of chunks of every row; lane l of a warp takes the run's chunks l, l + 32, ... (a warp reads 512
contiguous bytes of each of its rows per step: coalesced 16-byte loads, ROWS of them in flight per lane).
Per chunk a lane decodes its ROWS x 32 (16) weights to fp32 once and reuses them for the M rows of x
(read from global memory: x is tiny and stays in L1/L2), accumulating ROWS x M fp32 sums; the warp's lanes
add up with shuffles at the end.

Decode, exact in fp32 and independent of the flush-to-zero setting (subnormal inputs go through explicit
`mul.rn.f32`, which keeps them):
- e2m1 code c: the fp32 bit pattern ((c & 7) << 22) | ((c & 8) << 28) is e2m1(c) * 2^-126 (exponent field
  = e2m1's exponent, mantissa bit = its mantissa bit; e2m1's subnormal 0.5 lands on fp32's subnormal 2^-127);
  built with two shifts and one select per code (`e2m1_bits`).
- e4m3 byte b: ((b & 0x7F) << 20) | ((b & 0x80) << 24) is e4m3(b) * 2^-120, times 2^110 twice gives
  S = e4m3(b) * 2^100 (normal for every finite e4m3 value).
- w' = (e2m1 * 2^-126) * S = e2m1 * e4m3 * 2^-26, exact (<= 6 significant bits, normal). The epilogue
  multiplies the fp32 sum by 2^26 * global (an exact power of two, then one rounding).
- int8 byte b: the fp32 bit pattern 0x4B000000 | (b ^ 0x80) (b as an unsigned byte) is 2^23 + 128 + int8(b),
  so subtracting 8388736.0 gives int8(b) exactly (one xor per word, one prmt and one fadd per code).

Output: one split writes out[m, n] = dtype(sum * scale (+ bias[n])) itself; several write fp32 partials
mPart [splits, M, N] that `W4A16SplitKReduce` (w4a16_splitk_reduce.py) adds up in a fixed order
(deterministic) before the same epilogue.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

NUM_WARPS = 4
CHUNK_WORDS = 4  # 16 bytes of weights per lane per row and step
FORMATS = ("nvfp4", "int8")
VALUES_PER_CHUNK = {"nvfp4": 32, "int8": 16}
POW2_26 = float(2 ** 26)
_POW2_110 = float(2 ** 110)
_INT8_MAGIC = 8388736.0  # 2^23 + 128


@dsl_user_op
def mul_bits_rn(bits: Int32, scale: Float32, *, loc=None, ip=None) -> Float32:
    """float(bits) * scale in IEEE round-to-nearest, subnormal `bits` kept (no flush to zero)."""
    return Float32(llvm.inline_asm(
        T.f32(),
        [Int32(bits).ir_value(loc=loc, ip=ip), Float32(scale).ir_value(loc=loc, ip=ip)],
        "mul.rn.f32 $0, $1, $2;",
        "=f,r,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def select_bits(a: Int32, b: Int32, mask: Int32, *, loc=None, ip=None) -> Int32:
    """(a & mask) | (b & ~mask) as one lop3 (written out: LLVM's known-bits folding would split it in two)."""
    return Int32(llvm.inline_asm(
        T.i32(),
        [Int32(a).ir_value(loc=loc, ip=ip), Int32(b).ir_value(loc=loc, ip=ip), Int32(mask).ir_value(loc=loc, ip=ip)],
        "lop3.b32 $0, $1, $2, $3, 0xE4;",
        "=r,r,r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def opaque_and(a: Int32, mask: int, *, loc=None, ip=None) -> Int32:
    """a & mask, hidden from LLVM: otherwise it rewrites (a & mask) << k as (a << k) & (mask << k), one more
    instruction per code."""
    mask = mask - (1 << 32) if mask >= 1 << 31 else mask
    return Int32(llvm.inline_asm(
        T.i32(),
        [Int32(a).ir_value(loc=loc, ip=ip), Int32(mask).ir_value(loc=loc, ip=ip)],
        "and.b32 $0, $1, $2;",
        "=r,r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@cute.jit
def e4m3_times_2_100(byte: Int32) -> Float32:
    """e4m3(byte & 0xFF) * 2^100 in fp32 (exact)."""
    bits = ((byte & 0x7F) << 20) | ((byte & 0x80) << 24)
    return mul_bits_rn(mul_bits_rn(bits, Float32(_POW2_110)).bitcast(Int32), Float32(_POW2_110))


SIGN_PAIRS = (0x00000808, 0x00008080, 0x08080000, 0x80800000)
"""Masks of the sign bits of codes (0, 2), (1, 3), (4, 6), (5, 7) of a word: shifting one left puts the
sign of code j on bit 31 and its partner's either past bit 31 or on bit 23, inside the magnitude field."""
MAG_FIELD = 0x01C00000


def sign_pair(j: int) -> int:
    return (j % 2) + 2 * (j // 4)


@cute.jit
def e2m1_bits(word: Int32, signs: Int32, j: cutlass.Constexpr[int]) -> Int32:
    """The fp32 bit pattern of e2m1(code j of `word`) * 2^-126, `signs` = word & SIGN_PAIRS[sign_pair(j)]:
    the magnitude (bits 22-24) from one shift of the word, everything else from one shift of the sign
    pair (its other bits are zero or inside the magnitude field): shift, shift, one lop3 select."""
    if const_expr(j <= 5):
        mag = word << (22 - 4 * j)
    else:
        mag = word >> (4 * j - 22)
    sign = signs << (28 - 4 * j)
    return select_bits(mag, sign, Int32(MAG_FIELD))


@dsl_user_op
def int8_value(flipped: Int32, j: int, *, loc=None, ip=None) -> Float32:
    """int8 code j of a word as fp32, from `flipped` = word ^ 0x80808080 (each byte now int8 + 128): one prmt
    builds the bit pattern 0x4B0000{byte j} = 2^23 + 128 + int8, one subtraction leaves int8."""
    bits = llvm.inline_asm(
        T.i32(),
        [Int32(flipped).ir_value(loc=loc, ip=ip), Int32(0x4B000000).ir_value(loc=loc, ip=ip),
         Int32(0x7540 | j).ir_value(loc=loc, ip=ip)],
        "prmt.b32 $0, $1, $2, $3;",
        "=r,r,r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return Int32(bits).bitcast(Float32) - Float32(_INT8_MAGIC)


@cute.jit
def warp_sum(x: Float32) -> Float32:
    for offset in cutlass.range_constexpr(5):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=16 >> offset, mask=-1, mask_and_clamp=31)
    return x


class W4A16DecodeGemm:
    """One compiled variant per (x dtype, format, M bucket `m_max`, split or not, bias or not, weight rows per
    warp `rows`); N, K, M <= m_max, the strides and the split count are runtime values. More rows per warp
    reuse each x load more; fewer keep the fp32 weights and the rows x M accumulators in registers.

    Call: (mX [M, Kp] (unit stride on K, 16-byte aligned rows), mW, mBlock (nvfp4) or None, mScale,
    mBias [N] or None, mOut [M, N] (unit stride on N) or None when split, mPart [splits, M, N] fp32 or None
    when not split, stream). Kp: K padded to whole chunks (32 for nvfp4, 16 for int8), x's padding zeros.
    """

    def __init__(self, dtype, fmt: str, m_max: int, split: bool, has_bias: bool, rows: int):
        assert fmt in FORMATS, fmt
        assert 1 <= m_max <= 16, m_max
        assert rows >= 1, rows
        self.dtype = dtype
        self.fmt = fmt
        self.m_max = m_max
        self.split = split
        self.has_bias = has_bias
        self.rows = rows
        self.values = VALUES_PER_CHUNK[fmt]
        self.num_threads = 32 * NUM_WARPS

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mBlock: Optional[cute.Tensor],
        mScale: cute.Tensor,
        mBias: Optional[cute.Tensor],
        mOut: Optional[cute.Tensor],
        mPart: Optional[cute.Tensor],
        stream,
    ):
        rows_per_cta = self.rows * NUM_WARPS
        num_splits = 1
        if const_expr(self.split):
            num_splits = mPart.shape[0]
        self.kernel(mX, mW, mBlock, mScale, mBias, mOut, mPart).launch(
            grid=((mW.shape[0] + rows_per_cta - 1) // rows_per_cta, num_splits, 1),
            block=(self.num_threads, 1, 1),
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mBlock: Optional[cute.Tensor],
        mScale: cute.Tensor,
        mBias: Optional[cute.Tensor],
        mOut: Optional[cute.Tensor],
        mPart: Optional[cute.Tensor],
    ):
        R = self.rows
        MB = self.m_max
        V = self.values
        tidx, _, _ = cute.arch.thread_idx()
        bx, split_idx, _ = cute.arch.block_idx()
        _, num_splits, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        n_rows = mW.shape[0]
        m_rows = mX.shape[0]
        row0 = (bx * NUM_WARPS + warp_idx) * R

        chunks = mW.shape[1] // CHUNK_WORDS
        c_begin = split_idx * chunks // num_splits
        c_end = (split_idx + 1) * chunks // num_splits

        acc = cute.make_rmem_tensor((R, MB), Float32)
        acc.fill(0.0)
        # Two register sets of weights: the next step's loads are in flight while this step decodes.
        rW = cute.make_rmem_tensor((CHUNK_WORDS, R), Int32)  # column r: one contiguous 16-byte load
        rB = cute.make_rmem_tensor((R,), Int32)
        rWn = cute.make_rmem_tensor((CHUNK_WORDS, R), Int32)
        rBn = cute.make_rmem_tensor((R,), Int32)
        rBn.fill(0)
        wv = cute.make_rmem_tensor((R, V), Float32)
        rX = cute.make_rmem_tensor((V,), self.dtype)
        xv = cute.make_rmem_tensor((V,), Float32)

        if c_begin + lane < c_end:
            self.load_weights(mW, mBlock, rWn, rBn, row0, n_rows, c_begin + lane)
        for c in range(c_begin + lane, c_end, 32):
            rW.store(rWn.load())
            rB.store(rBn.load())
            if c + 32 < c_end:
                self.load_weights(mW, mBlock, rWn, rBn, row0, n_rows, c + 32)
            for r in cutlass.range_constexpr(R):
                if const_expr(self.fmt == "nvfp4"):
                    for half in cutlass.range_constexpr(2):  # two 16-code scale blocks per chunk
                        s = e4m3_times_2_100(rB[r] >> (8 * half))
                        for w in cutlass.range_constexpr(2):
                            word = rW[2 * half + w, r]
                            signs = [opaque_and(word, SIGN_PAIRS[p]) for p in range(4)]
                            for j in cutlass.range_constexpr(8):
                                wv[r, 16 * half + 8 * w + j] = mul_bits_rn(e2m1_bits(word, signs[sign_pair(j)], j), s)
                else:
                    for w in cutlass.range_constexpr(CHUNK_WORDS):
                        flipped = rW[w, r] ^ Int32(-0x7F7F7F80)  # 0x80808080
                        for j in cutlass.range_constexpr(4):
                            wv[r, 4 * w + j] = int8_value(flipped, j)
            for m in cutlass.range_constexpr(MB):
                if m < m_rows:
                    cute.autovec_copy(cute.local_tile(mX[m, None], (V,), (c,)), rX)
                    xv.store(rX.load().to(Float32))
                    for r in cutlass.range_constexpr(R):
                        a = acc[r, m]
                        for v in cutlass.range_constexpr(V):
                            a = a + xv[v] * wv[r, v]
                        acc[r, m] = a

        # ---- the warp's lanes add up; lane 0 writes (the partial, or the output with its epilogue) ----
        scale = Float32(1.0)
        if const_expr(self.fmt == "nvfp4" and not self.split):
            scale = mScale[0] * Float32(POW2_26)
        for r in cutlass.range_constexpr(R):
            n = row0 + r
            if const_expr(self.fmt == "int8" and not self.split):
                scale = mScale[cutlass.min(n, n_rows - 1)]
            for m in cutlass.range_constexpr(MB):
                total = warp_sum(acc[r, m])
                if lane == 0:
                    if n < n_rows:
                        if m < m_rows:
                            if const_expr(self.split):
                                mPart[split_idx, m, n] = total
                            else:
                                y = total * scale
                                if const_expr(self.has_bias):
                                    y = y + Float32(mBias[n])
                                mOut[m, n] = y.to(self.dtype)

    @cute.jit
    def load_weights(self, mW: cute.Tensor, mBlock: Optional[cute.Tensor], rW: cute.Tensor, rB: cute.Tensor,
                     row0: Int32, n_rows: Int32, c: Int32):
        """Issue the 16-byte loads of chunk c of the warp's ROWS rows (and their block-scale pairs)."""
        for r in cutlass.range_constexpr(self.rows):
            n = cutlass.min(row0 + r, n_rows - 1)  # rows past N read row N - 1; their sums are dropped
            cute.autovec_copy(cute.local_tile(mW[n, None], (CHUNK_WORDS,), (c,)), rW[None, r])
            if const_expr(self.fmt == "nvfp4"):
                rB[r] = Int32(mBlock[n, c])
