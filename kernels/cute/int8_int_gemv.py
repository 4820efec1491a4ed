"""Few-row int8-weight GEMV for Hopper (sm_90a) in CuTe DSL on the integer dot-product units: out[M, N] = (x[M, K] @
W[N, K]^T) * scale[N] (+ bias[N]) for M = 1..MAX_M, W int8 with a scale per output channel, x float16 / bfloat16,
output in x's dtype. The integer NVFP4 GEMV (`nvfp4_int_gemv.py`) with int8 weight bytes: x is quantized the same way
(each 16-value block to 16-bit integers y = rint(x * 2^s), two byte planes in shared memory written once per CTA),
and a 16-byte piece of a weight row is one block, so each weight word is a `dp4a` operand as it is, no decode at all.

Per block and row: s0 = sum(w * b0) (s8 x u8) and s1 = sum(w * b1) (s8 x s8) by dp4a, v = s0 + 256 s1 = sum(w * y) in
int32 (|v| <= 16 * 127 * 32752 < 2^26), then acc += fp32(v) * 2^-s in one fma (fp32(v) rounds above 2^24). The
epilogue multiplies by the channel's scale and adds the bias, as the fp32 GEMV's int8 path does (`w4a16_gemv.py`).
Its loop issues 1.1 instructions a weight at M = 1, 82 registers (the fp32 GEMV's int8 loop: 4.0, a byte permute, a
subtract and an fma a weight; sm_90a SASS, `docs/scripts/sass_stats.py int8gemv 4 1 512`). `int8_int_gemv` emulates the arithmetic on the CPU (`block_sums`, `emulate`).
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .nvfp4_int_gemv import NVFP4IntGemv, dp4a
from .w4a16_gemv import W4A16Gemv, as_f32

MAX_M = 4


class Int8IntGemv(NVFP4IntGemv):
    """One compiled variant per (x dtype, M rows of x (1..MAX_M), bias or not, ROWS weight rows a warp, WARPS_K warps
    along K, `max_pieces` (the shared memory the x planes take: 40 bytes a piece of a row, per row of x), PDL or not,
    `min_ctas`, `warps` a CTA). `NVFP4IntGemv`'s work split, x planes and sums, one block a piece.

    Call: (mX Int32 [M, Kp / 2], mW Int32 [N, Kp / 4], mScale [N] (Float32, BFloat16 or Float16), mBias [N] in x's dtype
    or None, mOut [M, N], stream); Kp / 16 pieces a row, at most `max_pieces`."""

    def __init__(self, dtype, m: int, has_bias: bool, rows: int, warps_k: int, max_pieces: int, pdl: bool = False,
                 min_ctas: int = 0, warps: int = 4):
        super().__init__(dtype, m, rows, warps_k, max_pieces, pdl, min_ctas, warps=warps)
        self.fmt = "int8"  # `W4A16Gemv`'s loads and epilogue for int8 weights
        self.has_bias = has_bias
        self.blocks_per_piece = 1

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mScale: cute.Tensor, mBias: Optional[cute.Tensor],
                 mOut: cute.Tensor, stream):
        SharedStorage = self.shared_storage()
        self.launch(self.kernel(mX, mW, mScale, mBias, mOut, SharedStorage), mW.shape[0],
                    SharedStorage.size_in_bytes(), stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mScale: cute.Tensor, mBias: Optional[cute.Tensor],
               mOut: cute.Tensor, SharedStorage: cutlass.Constexpr):
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        self.rows_of(storage, mX, mW, None, mScale, mOut, None, mBias)

    @cute.jit
    def piece(self, rW: cute.Tensor, rS: cute.Tensor, rP: cute.Tensor, rM: cute.Tensor, acc: cute.Tensor, tables):
        """Word i of the piece: weights 4i..4i+3 against plane word i of the piece's block, for the M rows of x
        (accumulator r * M + m)."""
        M = self.m
        for r in cutlass.range_constexpr(self.rows):
            s0 = [Int32(0)] * M
            s1 = [Int32(0)] * M
            for i in cutlass.range_constexpr(4):
                word = rW[i, r]
                for m in cutlass.range_constexpr(M):
                    s0[m] = dp4a(word, rP[i, 0, 0, m], s0[m], False, a_signed=True)
                    s1[m] = dp4a(word, rP[i, 0, 1, m], s1[m], True, a_signed=True)
            for m in cutlass.range_constexpr(M):
                v = s0[m] + (s1[m] << 8)
                acc[r * M + m] = v.to(Float32) * as_f32(rM[0, m]) + acc[r * M + m]

    @cute.jit
    def store(self, total: Float32, mScale: cute.Tensor, mBias: Optional[cute.Tensor], mOut: cute.Tensor, n: Int32,
              m: Int32):
        W4A16Gemv.store(self, total, mScale, mBias, mOut, n, m)
