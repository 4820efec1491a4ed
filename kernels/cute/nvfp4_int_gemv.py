"""Few-row NVFP4 GEMV for Hopper (sm_90a) in CuTe DSL on the integer dot-product units: out[M, N] = x[M, K] @
dequant(W)[N, K]^T for M = 1..MAX_M, x float16 / bfloat16, output in x's dtype. `w4a16_gemv.py`'s work split and
operands (read its docstring), with another inner product: its loop issues 2.55 instructions a weight (4 rows a warp; sm_90a SASS,
`docs/scripts/sass_stats.py intgemv 4 1 256`) where that kernel's fp32 one issues 5.12.

Weights. A code c (bit 3 the sign, bits 2-0 an index i into e2m1's magnitudes) becomes the byte 64 + 2 * e2m1(c), in
52..76, by two byte permutes on the word of 8 codes: prmt with the magnitude table {64 + 2m} reads code c's byte i
where the sign bit is clear and writes 0 where it is set (prmt's sign-replicate mode, on table bytes below 0x80);
prmt with the table {64 - 2m} on the codes with their sign bits flipped does the opposite; the two are ORed. Four
such bytes are one `dp4a` operand.

x. Each block of 16 x values (the weight's scale block) becomes integers y = rint(x * 2^s) with 2^s the power of two
that puts the block's max |x| in [2^14, 2^15): one fma with 1.5 * 2^23 (whose fp32 bits are 0x4B400000 + y) a value.
A bf16 (fp16) y is exact where |x| >= 2^-7 (2^-4) of the block's max; below that its error is at most 2^-15 of the
block max. |y| <= 32640 (32752) splits into a byte b0 in 0..255 and a signed byte b1 (y = b0 + 256 b1), the two
planes' bytes of four values packed into words by prmt. Every CTA writes the planes of all of x (every row) to
shared memory once, with per block the multiplier 2^-s and the correction 64 * sum(y) of the weight bytes' offset.

Per block and row: s0 = sum(wb * b0) and s1 = sum(wb * b1) by dp4a (u8 x u8, u8 x s8), v = s0 + 256 s1 - 64 sum(y) =
sum(2 e2m1 * y) is exact in int32 and in fp32 (|v| <= 16 * 12 * 32752 < 2^24), then acc += v * (e4m3 * 2^-s) in one
fp32 fma. The epilogue multiplies by the global scale / 2. A non-finite block of x makes its multiplier NaN, and so
the outputs. `nvfp4_int_gemv` emulates each step on the CPU (`quantize_blocks`, `weight_bytes`, `block_sums`) and the
whole in float64 (`emulate`), from which the kernel differs only by its fp32 sums' rounding and the output's.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cutlass_dsl import T, dsl_user_op

from .cp_async import prefetch_line_l2
from .decode_attention_int8kv import _max_abs
from .w4a16_decode_gemm import _asm, _i32, prmt
from .w4a16_gemv import NUM_WARPS, PIECE_WORDS, W4A16Gemv, as_f32, as_i32, e4m3_pair_f32, halves_f32, shared_struct

MAX_M = 4
BLOCK = 16  # x values (and weight codes) a scale block
BLOCKS_PER_PIECE = 2
WEIGHT_OFFSET = 64
MAGNITUDES = (0, 1, 2, 3, 4, 6, 8, 12)  # 2 * e2m1 magnitude, by the code's low 3 bits
POSITIVE_TABLE = tuple(WEIGHT_OFFSET + m for m in MAGNITUDES)
NEGATIVE_TABLE = tuple(WEIGHT_OFFSET - m for m in MAGNITUDES)
ROUNDER = 1.5 * 2 ** 23  # fp32 bits of ROUNDER + y are ROUNDER_BITS + y for |y| < 2^22
ROUNDER_BITS = 0x4B400000
TOP_EXPONENT = 14  # the block max times 2^s lies in [2^14, 2^15)
MAX_SHIFT = 126  # 2^s and 2^-s stay normal fp32
NAN_BITS = 0x7FC00000
PLANE_HALF_WORDS = 4  # a piece's plane is two halves of 16 bytes (one block each)


def table_words(table) -> tuple[int, int]:
    """The 8 bytes of `table` as the two prmt operands (bytes 0-3, 4-7)."""
    lo = sum(b << (8 * i) for i, b in enumerate(table[:4]))
    hi = sum(b << (8 * i) for i, b in enumerate(table[4:]))
    return lo, hi


@dsl_user_op
def weight_bytes(codes: Int32, tables, *, loc=None, ip=None) -> Int32:
    """The bytes 64 + 2 * e2m1 of the four codes in the low 16 bits of `codes` (two prmt, a xor and an or); `tables`
    the four table words (`table_words` of POSITIVE_TABLE, then NEGATIVE_TABLE) in registers."""
    text = ("{\n.reg .b32 p, f, n;\n"
            "prmt.b32 p, $2, $3, $1;\n"
            "xor.b32 f, $1, 0x88888888;\n"
            "prmt.b32 n, $4, $5, f;\n"
            "or.b32 $0, p, n;\n}")
    return Int32(_asm(T.i32(), [_i32(codes, loc, ip), *(_i32(t, loc, ip) for t in tables)], text, "=r,r,r,r,r,r"))


@dsl_user_op
def dp4a(a: Int32, b: Int32, c: Int32, b_signed: bool, *, a_signed: bool = False, loc=None, ip=None) -> Int32:
    """c + the dot product of a's four bytes with b's, each unsigned or, where a_signed / b_signed, signed."""
    op = f"dp4a.{'s32' if a_signed else 'u32'}.{'s32' if b_signed else 'u32'}"
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(c, loc, ip)],
                      f"{op} $0, $1, $2, $3;", "=r,r,r,r"))


@dsl_user_op
def rounded_bits(x: Float32, multiplier: Float32, *, loc=None, ip=None) -> Int32:
    """The fp32 bits of x * multiplier + 1.5 * 2^23 (round to nearest even): ROUNDER_BITS + rint(x * multiplier)."""
    return Int32(_asm(T.i32(), [Float32(x).ir_value(loc=loc, ip=ip), Float32(multiplier).ir_value(loc=loc, ip=ip)],
                      "{\n.reg .f32 r;\n"
                      f"fma.rn.f32 r, $1, $2, 0f{ROUNDER_BITS:08X};\nmov.b32 $0, r;\n}}", "=r,f,f"))


class NVFP4IntGemv(W4A16Gemv):
    """One compiled variant per (x dtype, M rows of x (1..MAX_M), ROWS weight rows a warp, WARPS_K warps along K,
    `max_pieces` (the shared memory the x planes take: 80 bytes a 16-byte weight piece of a row, per row of x), PDL or
    not, `min_ctas`, `prefetch`). `W4A16Gemv`'s work split, first loads and sums (`start`, `load_piece`,
    `add_up_and_store`); each weight word is decoded once for the M rows of x.

    prefetch: 0, or D >= 3: a warp keeps its rows' weight and block-scale bytes of the steps up to D ahead of the one it
    decodes prefetched into L2 (`prefetch_step`, a line a lane; no registers held): more reads in flight than the two
    steps the registers hold.

    Call: (mX Int32 [M, Kp / 2], mW Int32 [N, Kp / 8], mBlock Int32 [N, Kp / 64], mScale Float32 [1], mOut [M, N],
    stream), as `W4A16Gemv` takes them for NVFP4; Kp / 32 pieces a row, at most `max_pieces`."""

    def __init__(self, dtype, m: int, rows: int, warps_k: int, max_pieces: int, pdl: bool = False,
                 min_ctas: int = 0, prefetch: int = 0, splits: int = 1, warps: int = NUM_WARPS):
        super().__init__(dtype, "nvfp4", m, False, rows, warps_k, pdl, min_ctas, splits, warps)
        # the window takes a lane a weight line (4 a row) and one a row of block scales
        assert max_pieces >= 1 and (prefetch == 0 or (prefetch >= 3 and 5 * rows <= 32)), (max_pieces, prefetch, rows)
        self.max_pieces = max_pieces
        self.prefetch = prefetch
        self.blocks_per_piece = BLOCKS_PER_PIECE  # x blocks (their planes' halves) a 16-byte weight piece

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: cute.Tensor, mScale: cute.Tensor, mOut: cute.Tensor,
                 stream):
        SharedStorage = self.shared_storage()
        self.launch(self.kernel(mX, mW, mBlock, mScale, mOut, SharedStorage), mW.shape[0],
                    SharedStorage.size_in_bytes(), stream)

    def shared_storage(self):
        """The CTA's shared memory: the planes and block metadata of the pieces of x it reads, the sums, the tables."""
        bpp = self.blocks_per_piece
        return shared_struct(sPlanes=(Int32, bpp * 2 * self.max_pieces * PLANE_HALF_WORDS * self.m),
                             sMeta=(Int32, self.max_pieces * 2 * bpp * self.m), **self.sums_fields(),
                             sTables=(Int32, 4))

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: cute.Tensor, mScale: cute.Tensor, mOut: cute.Tensor,
               SharedStorage: cutlass.Constexpr):
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        self.rows_of(storage, mX, mW, mBlock, mScale, mOut)

    @cute.jit
    def rows_of(self, storage, mX: cute.Tensor, mW: cute.Tensor, mBlock: cute.Tensor, mScale: cute.Tensor,
                mOut: cute.Tensor, bx=None, mBias: Optional[cute.Tensor] = None):
        """The CTA's rows of mW (its bx-th CTA; default: its block index) into mOut."""
        tidx, _, _ = cute.arch.thread_idx()
        M, mp, bpp = self.m, self.max_pieces, self.blocks_per_piece
        meta = 2 * bpp  # (2^-s, correction) of each block of a piece
        # plane word (word, piece, half, plane, x row): bytes of x values 16 (bpp piece + half) + 4 word + 0..3
        sPlanes = storage.sPlanes.get_tensor(cute.make_layout(
            (PLANE_HALF_WORDS, mp, bpp, 2, M),
            stride=(1, PLANE_HALF_WORDS, PLANE_HALF_WORDS * mp, bpp * PLANE_HALF_WORDS * mp,
                    2 * bpp * PLANE_HALF_WORDS * mp)))
        sMeta = storage.sMeta.get_tensor(cute.make_layout((meta, mp, M), stride=(1, meta, meta * mp)))

        acc = cute.make_rmem_tensor((self.rows * M,), Float32)
        acc.fill(0.0)
        # two pieces of the warp's rows in flight: the even steps' in rW / rS, the odd steps' in rW2 / rS2
        rW = cute.make_rmem_tensor((PIECE_WORDS, self.rows), Int32)
        rS = cute.make_rmem_tensor((self.rows,), Int32)
        rW2 = cute.make_rmem_tensor((PIECE_WORDS, self.rows), Int32)
        rS2 = cute.make_rmem_tensor((self.rows,), Int32)
        lane, wn, wk, row0, n_rows, begin, end, first, stride = self.start(mW, mBlock, rW, rS, bx)
        if first + stride < end:
            self.load_piece(mW, mBlock, rW2, rS2, row0, n_rows, first + stride)
        if const_expr(self.prefetch > 0):  # the window's steps past the two the registers load
            pf = self.prefetch_lane(mW, mBlock, lane, row0, n_rows)
            for d in cutlass.range_constexpr(2, self.prefetch):
                self.prefetch_step(*pf, end, first - lane + d * stride)

        # ---- the planes of x's pieces begin..end: thread t takes their blocks t, t + 32 warps, ... of each row (8
        # words of x a block), stored from piece 0 ----
        rX = cute.make_rmem_tensor((2 * PIECE_WORDS,), Int32)
        for m in cutlass.range_constexpr(M):
            for blk in cutlass.range(tidx, (end - begin) * bpp, 32 * self.num_warps, unroll=1):
                cute.autovec_copy(cute.local_tile(mX[m, None], (2 * PIECE_WORDS,), (begin * bpp + blk,)), rX)
                self.quantize_block(rX, sPlanes[None, None, None, None, m], sMeta[None, None, m], blk)
        sTables = storage.sTables.get_tensor(cute.make_layout((4,)))
        if tidx < 4:  # read back from shared memory, the tables live in registers: as constants ptxas would move
            # them from uniform registers before every prmt (a prmt's first data operand is a vector register)
            words = (*table_words(POSITIVE_TABLE), *table_words(NEGATIVE_TABLE))
            value = Int32(words[0])
            for i in cutlass.range_constexpr(1, 4):
                if tidx == i:
                    value = Int32(words[i])
            sTables[tidx] = value
        cute.arch.barrier()
        tables = [sTables[i] for i in range(4)]

        rP = cute.make_rmem_tensor((PLANE_HALF_WORDS, bpp, 2, M), Int32)  # (word, half, plane, x row)
        rM = cute.make_rmem_tensor((meta, M), Int32)
        for p in cutlass.range(first, end, 2 * stride, unroll=1):
            if const_expr(self.prefetch > 0):
                self.prefetch_step(*pf, end, p - lane + self.prefetch * stride)
                self.prefetch_step(*pf, end, p - lane + (self.prefetch + 1) * stride)
            self.x_piece(sPlanes, sMeta, rP, rM, p - begin)
            self.piece(rW, rS, rP, rM, acc, tables)
            if p + 2 * stride < end:
                self.load_piece(mW, mBlock, rW, rS, row0, n_rows, p + 2 * stride)
            if p + stride < end:
                self.x_piece(sPlanes, sMeta, rP, rM, p + stride - begin)
                self.piece(rW2, rS2, rP, rM, acc, tables)
                if p + 3 * stride < end:
                    self.load_piece(mW, mBlock, rW2, rS2, row0, n_rows, p + 3 * stride)
        self.add_up_and_store(acc, storage, lane, wn, wk, row0, n_rows, mScale, mBias, mOut)

    @cute.jit
    def prefetch_lane(self, mW: cute.Tensor, mBlock: cute.Tensor, lane: Int32, row0: Int32, n_rows: Int32):
        """The lane's line in each of the warp's steps (`prefetch_step`): (its address at piece 0, its offset in pieces
        from the step's first piece, bytes a piece, whether it prefetches). A step is 512 bytes of each of the warp's
        rows (4 lines of 128) and 64 of their block scales: lane 4r + l takes line l of row row0 + r, lane 4 ROWS + r
        that row's block scales (block-scale word w holds pieces 2w, 2w + 1)."""
        r = cutlass.min(lane // 4, self.rows - 1)
        line = lane % 4
        base = mW.iterator.toint() + cutlass.Int64(row0 + r) * (cutlass.Int64(mW.layout.stride[0]) * 4) \
            + cutlass.Int64(line * 128)
        offset = line * 8
        unit = Int32(16)
        if lane >= 4 * self.rows:
            r = cutlass.min(lane - 4 * self.rows, self.rows - 1)
            base = mBlock.iterator.toint() + cutlass.Int64(row0 + r) * (cutlass.Int64(mBlock.layout.stride[0]) * 4)
            offset = Int32(0)
            unit = Int32(2)
        return base, offset, unit, lane < 5 * self.rows and row0 + r < n_rows

    @cute.jit
    def prefetch_step(self, base, offset: Int32, unit: Int32, active, end: Int32, q: Int32):
        """L2 prefetch of the lane's line (`prefetch_lane`) of the warp's step starting at piece q (an even piece;
        lines from piece `end` on: none)."""
        if active and q + offset < end:
            prefetch_line_l2(base + cutlass.Int64(q * unit))

    @cute.jit
    def x_piece(self, sPlanes: cute.Tensor, sMeta: cute.Tensor, rP: cute.Tensor, rM: cute.Tensor, p: Int32):
        """Piece p's plane words and block metadata of every row of x, from shared memory."""
        for m in cutlass.range_constexpr(self.m):
            for plane in cutlass.range_constexpr(2):
                for h in cutlass.range_constexpr(self.blocks_per_piece):
                    cute.autovec_copy(sPlanes[None, p, h, plane, m], rP[None, h, plane, m])
            cute.autovec_copy(sMeta[None, p, m], rM[None, m])

    @cute.jit
    def store(self, total: Float32, mScale: cute.Tensor, mBias: Optional[cute.Tensor], mOut: cute.Tensor, n: Int32,
              m: Int32):
        mOut[m, n] = (total * (mScale[0] * Float32(0.5))).to(self.dtype)  # the sums are of 2 * e2m1

    @cute.jit
    def quantize_block(self, rX: cute.Tensor, sPlanes: cute.Tensor, sMeta: cute.Tensor, blk: Int32):
        """Block blk's 16 x values (8 words) as the two planes' 4 words and its (2^-s, 64 * sum(y))."""
        values = []
        for w in cutlass.range_constexpr(2 * PIECE_WORDS):
            values.extend(halves_f32(rX[w], self.is_f16))
        amax = Float32(0.0)
        for v in values:
            amax = _max_abs(amax, v)  # NaN stays NaN
        field = as_i32(amax) >> 23  # amax >= 0: its biased exponent; 255 for inf / nan
        field = cutlass.max(field, Int32(TOP_EXPONENT + 127 - MAX_SHIFT))  # s <= MAX_SHIFT
        multiplier = as_f32((Int32(2 * 127 + TOP_EXPONENT) - field) << 23)  # 2^s, s = 14 - (field - 127)
        inverse = as_i32(Float32(0.0))
        if field < 255:
            inverse = (field - TOP_EXPONENT) << 23  # 2^-s
        else:
            inverse = Int32(NAN_BITS)
            multiplier = Float32(0.0)
        total = Int32(0)
        bits = []
        for v in values:
            b = rounded_bits(v, multiplier)
            bits.append(b)
            total = total + (b - Int32(ROUNDER_BITS))  # y
        p = blk // self.blocks_per_piece
        h = blk % self.blocks_per_piece
        for w in cutlass.range_constexpr(PLANE_HALF_WORDS):
            ab = prmt(bits[4 * w], bits[4 * w + 1], 0x5140)
            cd = prmt(bits[4 * w + 2], bits[4 * w + 3], 0x5140)
            sPlanes[w, p, h, 0] = prmt(ab, cd, 0x5410)
            sPlanes[w, p, h, 1] = prmt(ab, cd, 0x7632)
        sMeta[2 * h, p] = inverse
        sMeta[2 * h + 1, p] = total * WEIGHT_OFFSET

    @cute.jit
    def piece(self, rW: cute.Tensor, rS: cute.Tensor, rP: cute.Tensor, rM: cute.Tensor, acc: cute.Tensor, tables):
        """Word i of the piece: codes 8i..8i+7 (x values 32p + 8i + j), block i // 2, plane words 2 (i % 2), + 1 of
        half i // 2; each decoded once for the M rows of x (accumulator r * M + m)."""
        M = self.m
        for r in cutlass.range_constexpr(self.rows):
            scales = e4m3_pair_f32(rS[r])
            for h in cutlass.range_constexpr(BLOCKS_PER_PIECE):
                s0 = [Int32(0)] * M
                s1 = [Int32(0)] * M
                for ii in cutlass.range_constexpr(2):
                    word = rW[2 * h + ii, r]
                    lo = weight_bytes(word, tables)
                    hi = weight_bytes(word >> 16, tables)
                    for m in cutlass.range_constexpr(M):
                        s0[m] = dp4a(lo, rP[2 * ii, h, 0, m], s0[m], False)
                        s0[m] = dp4a(hi, rP[2 * ii + 1, h, 0, m], s0[m], False)
                        s1[m] = dp4a(lo, rP[2 * ii, h, 1, m], s1[m], True)
                        s1[m] = dp4a(hi, rP[2 * ii + 1, h, 1, m], s1[m], True)
                for m in cutlass.range_constexpr(M):
                    v = s0[m] + (s1[m] << 8) - rM[2 * h + 1, m]
                    acc[r * M + m] = v.to(Float32) * (scales[h] * as_f32(rM[2 * h, m])) + acc[r * M + m]


class NVFP4IntGemvSiblings(NVFP4IntGemv):
    """`NVFP4IntGemv` over 2 or 3 weights that multiply the same x (a layer's q / k / v or gate / up projections) in
    one launch: the grid is each weight's CTAs in turn, and a CTA runs `rows_of` on its weight and output. One launch
    instead of several saves their ramps and tails (qkv of Llama-1B: 2.9 against 5.3 us chained, H200).

    Call: (mX, then (mW, mBlock, mScale, mOut) of weights 0, 1 and 2, stream), each as `NVFP4IntGemv` takes it, all of
    one K; with `weights` = 2 the third is not read (pass the second again)."""

    def __init__(self, dtype, weights: int, m: int, rows: int, warps_k: int, max_pieces: int, pdl: bool = False,
                 min_ctas: int = 0):
        assert weights in (2, 3), weights
        super().__init__(dtype, m, rows, warps_k, max_pieces, pdl, min_ctas)
        self.weights = weights

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW0: cute.Tensor, mBlock0: cute.Tensor, mScale0: cute.Tensor,
                 mOut0: cute.Tensor, mW1: cute.Tensor, mBlock1: cute.Tensor, mScale1: cute.Tensor, mOut1: cute.Tensor,
                 mW2: cute.Tensor, mBlock2: cute.Tensor, mScale2: cute.Tensor, mOut2: cute.Tensor, stream):
        SharedStorage = self.shared_storage()
        self.launch_over(self.kernel(mX, mW0, mBlock0, mScale0, mOut0, mW1, mBlock1, mScale1, mOut1, mW2, mBlock2,
                                     mScale2, mOut2, SharedStorage),
                         [mW0, mW1, mW2][:self.weights], SharedStorage.size_in_bytes(), stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW0: cute.Tensor, mBlock0: cute.Tensor, mScale0: cute.Tensor,
               mOut0: cute.Tensor, mW1: cute.Tensor, mBlock1: cute.Tensor, mScale1: cute.Tensor, mOut1: cute.Tensor,
               mW2: cute.Tensor, mBlock2: cute.Tensor, mScale2: cute.Tensor, mOut2: cute.Tensor,
               SharedStorage: cutlass.Constexpr):
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        bx, _, _ = cute.arch.block_idx()
        weights = [(mW0, mBlock0, mScale0, mOut0), (mW1, mBlock1, mScale1, mOut1), (mW2, mBlock2, mScale2, mOut2)]
        self.each_weight(storage, mX, weights[:self.weights], bx)


ACTIVATIONS = ("silu", "gelu_tanh")  # a gated MLP's: Llama's SiLU, Gemma's GELU (tanh approximation)
GELU_TANH_CUBIC = 0.044715
GELU_TANH_SCALE = 0.7978845608028654  # sqrt(2 / pi)


class NVFP4IntGemvGated(NVFP4IntGemv):
    """`NVFP4IntGemv` for a gated MLP's first half: h = act(x @ gate^T) * (x @ up^T), [M, N], from two NVFP4 weights
    of one shape [N, K] in one launch, act one of ACTIVATIONS. A warp's ROWS rows are ROWS / 2 rows of gate and the
    same rows of up (`load_piece`), so each output's two sums meet in one warp: after the lanes' and K warps' sums, the
    lane of up's row hands its sum to the lane of gate's (one shuffle), which stores (`store_gated`). Each of g and u
    is rounded to x's dtype, act(g) too, as the separate linears and a graph's activation and product round them.

    Call: (mX, mW0, mBlock0, mScale0 (gate), mW1, mBlock1, mScale1 (up), mOut [M, N], stream), each weight as
    `NVFP4IntGemv` takes it."""

    def __init__(self, dtype, m: int, rows: int, warps_k: int, max_pieces: int, pdl: bool = False,
                 min_ctas: int = 0, activation: str = "silu"):
        assert rows % 2 == 0 and activation in ACTIVATIONS, (rows, activation)
        super().__init__(dtype, m, rows, warps_k, max_pieces, pdl, min_ctas)
        self.out_rows = rows // 2
        self.gated = True
        self.activation = activation

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW0: cute.Tensor, mBlock0: cute.Tensor, mScale0: cute.Tensor,
                 mW1: cute.Tensor, mBlock1: cute.Tensor, mScale1: cute.Tensor, mOut: cute.Tensor, stream):
        SharedStorage = self.shared_storage()
        self.launch(self.kernel(mX, mW0, mBlock0, mScale0, mW1, mBlock1, mScale1, mOut, SharedStorage), mW0.shape[0],
                    SharedStorage.size_in_bytes(), stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW0: cute.Tensor, mBlock0: cute.Tensor, mScale0: cute.Tensor,
               mW1: cute.Tensor, mBlock1: cute.Tensor, mScale1: cute.Tensor, mOut: cute.Tensor,
               SharedStorage: cutlass.Constexpr):
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        self.rows_of(storage, mX, (mW0, mW1), (mBlock0, mBlock1), (mScale0, mScale1), mOut)

    @cute.jit
    def load_piece(self, mW, mBlock, rW: cute.Tensor, rS: cute.Tensor, row0: Int32, n_rows: Int32, p: Int32):
        """Piece p of the warp's rows: rows r < ROWS / 2 of gate (output rows row0 + r), the others of up."""
        half = self.out_rows
        for r in cutlass.range_constexpr(self.rows):
            w, blocks = (mW[0], mBlock[0]) if r < half else (mW[1], mBlock[1])
            n = cutlass.min(row0 + r % half, n_rows - 1)
            cute.autovec_copy(cute.local_tile(w[n, None], (PIECE_WORDS,), (p,)), rW[None, r])
            rS[r] = blocks[n, p >> 1] >> ((p & 1) * 16)

    @cute.jit
    def store_gated(self, gate: Float32, up: Float32, mScale, mOut: cute.Tensor, n: Int32, m: Int32):
        g = (gate * (mScale[0][0] * Float32(0.5))).to(self.dtype).to(Float32)
        u = (up * (mScale[1][0] * Float32(0.5))).to(self.dtype).to(Float32)
        if const_expr(self.activation == "silu"):
            a = g / (Float32(1.0) + cute.math.exp(-g))
        else:
            inner = Float32(GELU_TANH_SCALE) * (g + Float32(GELU_TANH_CUBIC) * g * g * g)
            a = Float32(0.5) * g * (Float32(1.0) + cute.math.tanh(inner))
        mOut[m, n] = (a.to(self.dtype).to(Float32) * u).to(self.dtype)
