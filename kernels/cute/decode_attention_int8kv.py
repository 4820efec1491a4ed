"""Split-KV decode attention over an int8 KV cache for Hopper (sm_90a) in CuTe DSL: the main kernel.

The problem, grid, query-head packing, split rule, warp structure, masking and epilogue are those of
`decode_attention.py` (read its docstring); what differs is the KV stream. k / v are int8
[B, Hkv, Sk, D] with float32 per-key scales k_scale / v_scale [B, Hkv, Sk], and the attention runs
over k * k_scale[..., None] and v * v_scale[..., None]. Since

    q . (s_k k) = s_k (q . k)      and      sum_j p_j s_vj v_j = (p * s_v) @ v,

S = Q K^T runs on the integer tensor cores and reads the int8 K tile as it lies in shared memory: q is
quantized per packed row to a 15-bit integer y = rint(q * 127 * 254 / amax) (amax = max |q| of the row, so
|q - y * amax / (127 * 254)| <= amax / 64516, far below q's own bf16 / fp16 rounding), split into two int8
digits y = 254 hi + lo (|hi|, |lo| <= 127), and two mma.sync m16n8k32 s8 x s8 -> s32 per k-block give
Q_hi K^T and Q_lo K^T exactly; the score is float(254 S_hi + S_lo) (exact in int32, one rounding to fp32) times
the row's amax / (127 * 254) and k_scale. P V stays on mma.sync m16n8k16 in q's dtype (P has the
range of a probability times v_scale): the int8 V values are converted exactly (an int8 fits the
significand of fp16 and bf16) and v_scale multiplies each column of P (the row sums use P unscaled; in
fp16 P also carries a factor FP16_P_SCALE that the final 1 / l removes).

Data path of a warp tile (16 keys):
- cp.async copies the int8 K and V tiles (16 bytes a lane) and their 16 + 16 scales (4 bytes a lane)
  into the warp's ring slot. A tile is half the bytes of a bf16 one, so the same shared memory
  holds a ring twice as deep. Keys past seqlen_k are zero-filled, their scales too, so stale or
  non-finite cache contents never reach the MMAs.
- K (S = Q K^T sums over D, so D's order is free when Q uses the same order): thread
  (g = lane / 4, t = lane % 4) reads key row 8j + g of n-block j, bytes 16 (t + 4i) .. + 15 (one 16-byte
  shared load); its 4-byte words are, unchanged, the B registers (4 int8 each) of k-blocks 2i, 2i + 1
  (`k_column`); Q's digits are laid out in the matching column order.
- V (O = P V: the accumulator's column order is free, the epilogue writes physical columns,
  `v_column`): thread g owns D / 8 contiguous bytes of every key row; for its four keys 2t,
  2t + 1, 2t + 8, 2t + 9 it pairs the bytes of two keys into one half2 register with integer ops
  (`_int8_pair`: prmt, one or two lop3, one packed subtract; exact).
- The shared tiles are swizzled in 16-byte chunks (`k_chunk`, `v_chunk`) so that those reads and
  the cp.async writes are free of bank conflicts (two-way at most for V at head dim 64).

The index maps are plain functions of Python or DSL integers, so a CPU test replays them on a
simulated warp (`tests/test_decode_int8kv_compile.py`).
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int8, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warp
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.experimental import primitives as prims

from .cp_async import cp_async as _cp_async
from .decode_attention import (NUM_WARPS, TILE_M, TILE_N, SplitKVMerge, _as_operand_a, _mn_view, _quad_max,
                               lanes_reduce)

HEAD_DIMS = (64, 128, 256)
# fp16 only: P * v_scale enters the PV MMA times 2^6 (undone exactly with 1 / l), which keeps small v_scales
# out of fp16's subnormals; a V that fits fp16 has v_scale <= 65504 / 127, so p * v_scale * 64 still fits.
FP16_P_SCALE = 64.0
# q's integer form: y = rint(q * Q_MAX * Q_BASE / amax) = Q_BASE * hi + lo, digits hi, lo in [-Q_MAX, Q_MAX].
Q_MAX = 127
Q_BASE = 254
Q_AMAX_MIN = 1e-30  # amax is taken at least this (rows of smaller q score ~0 either way)


# ---- index maps (Python ints at trace time or DSL Int32 at run time) ----


def k_column(col, d: int):
    """Head-dim column of K (and Q) behind the integer MMA's logical k index `col`: in k-block kb = col // 32
    (m16n8k32), register h = (col % 32) // 16 of lane t = (col % 16) // 4 holds k = 32 kb + 16 h + 4 t + (0..3),
    which that lane reads as word 2 (kb % 2) + h of its 16-byte chunk t + 4 (kb // 2)."""
    kb = col // 32
    h = (col % 32) // 16
    t = (col % 16) // 4
    return (t + 4 * (kb // 2)) * 16 + (2 * (kb % 2) + h) * 4 + col % 4


def v_column(col, d: int):
    """Head-dim column of V (and O) behind the PV accumulator's logical column `col`: n-block
    nb = col // 8 of lane group g = col % 8 is byte nb of the D / 8 bytes g owns."""
    nb = col // 8
    g = col % 8
    if d == 64:
        return g * 8 + nb
    return (g + 8 * (nb // 16)) * 16 + nb % 16


def k_chunk(row, chunk, d: int):
    """Where 16-byte chunk `chunk` of K row `row` sits in its shared tile row."""
    if d == 64:
        return chunk
    return chunk ^ ((row % 2) * 4)


def v_chunk(row, chunk, d: int):
    """Where 16-byte chunk `chunk` of V row `row` sits in its shared tile row."""
    if d == 64:
        return chunk ^ (((row // 2) % 2) * 2)
    return chunk ^ (((row // 2) % 4) * 2)


# ---- int8 pairs to half2 ----


@dsl_user_op
def _sub_half2(a, b, fp16: bool, *, loc=None, ip=None) -> Int32:
    """a - b on two packed halves (fp16 or bf16), round to nearest (exact for the integers here)."""
    op = "sub.rn.f16x2" if fp16 else "sub.rn.bf16x2"
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(a).ir_value(loc=loc, ip=ip), Int32(b).ir_value(loc=loc, ip=ip)],
        f"{op} $0, $1, $2;", "=r,r,r", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def _and_xor(a, mask: int, flip: int, *, loc=None, ip=None) -> Int32:
    """(a & mask) ^ flip in one lop3 (written as separate and / or, ptxas spends a LOP3 on each constant)."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(a).ir_value(loc=loc, ip=ip)], f"lop3.b32 $0, $1, {mask:#x}, {flip:#x}, 0x6a;", "=r,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def _imma(a, b, c, *, loc=None, ip=None) -> list:
    """mma.sync m16n8k32 s8 x s8 + s32 -> s32: a four A registers, b two B registers, c four accumulators."""
    ops = [Int32(x).ir_value(loc=loc, ip=ip) for x in (*a, *b, *c)]
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4), ops,
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, "
        "{$10, $11, $12, $13};",
        "=r,=r,=r,=r," + ",".join(["r"] * 10), has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return [Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def _rint(x, *, loc=None, ip=None) -> Int32:
    """x rounded to the nearest integer, ties to even (cvt.rni; NaN gives 0)."""
    return Int32(llvm.inline_asm(
        T.i32(), [Float32(x).ir_value(loc=loc, ip=ip)], "cvt.rni.s32.f32 $0, $1;", "=r,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def _max_abs(m, x, *, loc=None, ip=None) -> Float32:
    """max(m, |x|), NaN if either is NaN (so a non-finite q reaches the scores)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(m).ir_value(loc=loc, ip=ip), Float32(x).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .f32 a;\n\tabs.f32 a, $2;\n\tmax.NaN.f32 $0, $1, a;\n\t}", "=f,f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


def _prmt(a, b, selector: int):
    """Bytes of {b, a} picked by `selector` (PTX prmt.b32; a pure op LLVM can schedule)."""
    return prims.prmt(a, selector, prims.PermuteMode.DEFAULT, hi=b)


def _int8_pair(t, fp16: bool):
    """The int8 in bytes 0 and 2 of t as a half2 (byte 0 in the low half), exact.

    fp16: 0x64XX with XX = x ^ 0x80 is 1024 + x + 128; subtract 1152.
    bf16: 0x43MM with MM = x & 0x7f is 128 + m (m = x + 128 s, s the sign bit); subtract
    128 (s = 0: 0x4300) or 256 (s = 1: 0x4380), i.e. 0x4300 | (x & 0x80)."""
    if fp16:
        return _sub_half2(_and_xor(t, 0x00FF00FF, 0x64806480), Int32(0x64806480), True)
    return _sub_half2(_and_xor(t, 0x007F007F, 0x43004300), _and_xor(t, 0x00800080, 0x43004300), False)


class DecodeAttentionInt8KVSm90(SplitKVMerge):
    """One compiled variant per (dtype, head_dim, group, causal, softcap on/off, seqused_k given,
    key mask given, split or not, ring depth `stages` >= 2: the merge reuses the KV ring; `min_ctas`, the CTAs
    a SM its registers must allow; `half_rows`, every packed query row one of the tile's first 8: a lane's MMA
    fragment rows g + 8 then hold zero queries, whose scores are 0 and whose P stays 0 without a softmax;
    `fused_combine`, split: the last CTA of a (batch, row tile) merges the splits, `SplitKVMerge.combine_if_last`).

    Call: (mQ, mK, mV, mKscale, mVscale, mSeqused, mKeyMask, mO, mLSE, mOpart, mLSEpart, mCounter, scale_log2,
    softcap_in, softcap_out, stream). mK / mV int8 [B, Hkv, Sk, D] (unit stride on D, 16-byte
    aligned rows); mKscale / mVscale float32 [B, Hkv, Sk] (unit stride on Sk); the rest as in
    `DecodeAttentionSm90`.
    """

    def __init__(self, dtype, head_dim: int, group: int, causal: bool, has_softcap: bool,
                 has_seqused: bool, split: bool, stages: int, has_key_mask: bool = False, min_ctas: int = 0,
                 half_rows: bool = False, fused_combine: bool = False):
        assert head_dim in HEAD_DIMS, head_dim
        self.set_call_shape(dtype, head_dim, group, causal, has_softcap, has_seqused, split, stages, has_key_mask,
                            fused_combine)
        self.fp16 = dtype is cutlass.Float16
        self.min_ctas = min_ctas  # > 1: registers capped so that this many CTAs fit a SM (nvvm.minctasm)
        self.half_rows = half_rows
        self.o_scale = FP16_P_SCALE if self.fp16 else 1.0

    @staticmethod
    def o_column(col, d: int):
        return v_column(col, d)

    @staticmethod
    def q_column(start, e: int, d: int):
        """K's column order (`k_column`); start is a multiple of D / 8 <= 32, so k_column(start + e) = k_column(start) +
        k_column(e)."""
        return k_column(start, d) + k_column(e, d)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mKscale: cute.Tensor,
        mVscale: cute.Tensor,
        mSeqused: Optional[cute.Tensor],
        mKeyMask: Optional[cute.Tensor],
        mO: Optional[cute.Tensor],
        mLSE: Optional[cute.Tensor],
        mOpart: Optional[cute.Tensor],
        mLSEpart: Optional[cute.Tensor],
        mCounter: Optional[cute.Tensor],
        scale_log2: Float32,
        softcap_in: Float32,
        softcap_out: Float32,
        stream,
    ):
        D = self.head_dim
        slots = self.stages * NUM_WARPS
        ring_bytes = slots * 2 * TILE_N * D

        @cute.struct
        class SharedStorage:
            sQ8: cute.struct.Align[cute.struct.MemRange[Int8, 2 * TILE_M * D], 16]  # its digits hi, lo
            sQmul: cute.struct.Align[cute.struct.MemRange[Float32, TILE_M], 16]  # amax / (Q_MAX Q_BASE) x scale
            sKV: cute.struct.Align[cute.struct.MemRange[Int8, ring_bytes], 1024]
            sScale: cute.struct.Align[cute.struct.MemRange[Float32, slots * 2 * TILE_N], 16]
            sM: cute.struct.Align[cute.struct.MemRange[Float32, NUM_WARPS * TILE_M], 16]
            sL: cute.struct.Align[cute.struct.MemRange[Float32, NUM_WARPS * TILE_M], 16]

        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)), (1, 1, 1), permutation_mnk=(16, 16, 16))
        row_tiles = (mQ.shape[2] * self.group + TILE_M - 1) // TILE_M
        num_splits = 1
        if const_expr(self.split):
            num_splits = mOpart.shape[2]
        self.kernel(
            mQ, mK, mV, mKscale, mVscale, mSeqused, mKeyMask, mO, mLSE, mOpart, mLSEpart, mCounter, scale_log2,
            softcap_in, softcap_out, row_tiles, tiled_mma, SharedStorage,
        ).launch(
            grid=(num_splits, mK.shape[1] * row_tiles, mK.shape[0]),
            block=(self.num_threads, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=self.min_ctas,
            preferred_smem_carveout=100 if self.min_ctas > 1 else None,  # also spares the DSL a device query
        )

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mKscale: cute.Tensor,
        mVscale: cute.Tensor,
        mSeqused: Optional[cute.Tensor],
        mKeyMask: Optional[cute.Tensor],
        mO: Optional[cute.Tensor],
        mLSE: Optional[cute.Tensor],
        mOpart: Optional[cute.Tensor],
        mLSEpart: Optional[cute.Tensor],
        mCounter: Optional[cute.Tensor],
        scale_log2: Float32,
        softcap_in: Float32,
        softcap_out: Float32,
        row_tiles: Int32,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        D = self.head_dim
        C = D // 16  # 16-byte chunks per int8 row
        group = self.group
        stages = self.stages
        slots = stages * NUM_WARPS
        tidx, _, _ = cute.arch.thread_idx()
        split_idx, hm, b = cute.arch.block_idx()
        num_splits, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        g = lane // 4
        t = lane % 4
        kvh = hm // row_tiles
        row_tile = hm - kvh * row_tiles

        seqlen_q = mQ.shape[2]
        seqlen_k = mK.shape[2]
        if const_expr(self.has_seqused):
            seqlen_k = cutlass.max(cutlass.min(mSeqused[b], mK.shape[2]), 0)
        num_rows = seqlen_q * group

        n_tiles = (seqlen_k + TILE_N - 1) // TILE_N
        tile_begin = split_idx * n_tiles // num_splits
        n_cta = (split_idx + 1) * n_tiles // num_splits - tile_begin
        n_warp = (cutlass.max(n_cta - warp_idx, 0) + NUM_WARPS - 1) // NUM_WARPS

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        n_chunks = slots * 2 * TILE_N * C
        # The ring as 16-byte chunks: chunk ((slot * 2 + part) * TILE_N + row) * C + position, part 0 K, 1 V.
        sChunk = storage.sKV.get_tensor(cute.make_layout((16, n_chunks), stride=(1, 16)))
        sWords = storage.sKV.get_tensor(cute.make_layout((4, n_chunks), stride=(1, 4)), dtype=Uint32)
        sHalfChunkWords = storage.sKV.get_tensor(cute.make_layout((2, 2 * n_chunks), stride=(1, 2)), dtype=Uint32)
        sScale = storage.sScale.get_tensor(cute.make_layout((TILE_N, 2, slots), stride=(1, TILE_N, 2 * TILE_N)))

        # ---- per-lane addressing, fixed for the whole loop: a tile adds tile * TILE_N rows, a ring slot
        # slot * slot_chunks chunks ----
        # cp.async: lane copies chunk lane % C of rows lane // C + n * (32 // C), n < C / 2; the scales: lane j < 16
        # k_scale of key j, lane 16 + j v_scale of key j.
        slot_chunks = 2 * TILE_N * C
        k_row = Int64(mK.layout.stride[2])
        v_row = Int64(mV.layout.stride[2])
        k_src = mK[b, kvh, None, None].iterator.toint() + Int64(lane // C) * k_row + (lane % C) * 16
        v_src = mV[b, kvh, None, None].iterator.toint() + Int64(lane // C) * v_row + (lane % C) * 16
        s_src = mKscale[b, kvh, None].iterator.toint() if lane < TILE_N else mVscale[b, kvh, None].iterator.toint()
        s_src = s_src + (lane % TILE_N) * 4
        ring = sChunk.iterator.toint()
        k_write = cute.make_rmem_tensor((C // 2,), Int32)  # byte offsets in slot 0
        v_write = cute.make_rmem_tensor((C // 2,), Int32)
        for n in cutlass.range_constexpr(C // 2):
            row = lane // C + n * (32 // C)
            k_write[n] = ring + (row * C + k_chunk(row, lane % C, D)) * 16
            v_write[n] = ring + ((TILE_N + row) * C + v_chunk(row, lane % C, D)) * 16
        s_write = sScale.iterator.toint() + ((lane // TILE_N) * TILE_N + lane % TILE_N) * 4
        # Fragment reads: K rows 8j + g, chunks t + 4i; V rows 2t, 2t + 1, 2t + 8, 2t + 9, the bytes g owns
        # (chunks g + 8i; at head dim 64 half a chunk, indexed in 8-byte halves).
        k_read = cute.make_rmem_tensor((2, C // 4), Int32)
        for j in cutlass.range_constexpr(2):
            for i in cutlass.range_constexpr(C // 4):
                k_read[j, i] = (8 * j + g) * C + k_chunk(8 * j + g, t + 4 * i, D)
        v_pieces = max(1, D // 128)
        v_read = cute.make_rmem_tensor((4, v_pieces), Int32)
        for kk in cutlass.range_constexpr(4):
            row = 2 * t + kk % 2 + 8 * (kk // 2)
            for i in cutlass.range_constexpr(v_pieces):
                if const_expr(D == 64):
                    v_read[kk, i] = 2 * ((TILE_N + row) * C + v_chunk(row, g // 2, D)) + g % 2
                else:
                    v_read[kk, i] = (TILE_N + row) * C + v_chunk(row, g + 8 * i, D)

        q_vals = self.start_cta(mQ, tidx, row_tile, num_rows, kvh, b)  # Q's loads first (K's column order)

        # ---- prologue: start streaming this warp's first tiles ----
        first = tile_begin + warp_idx
        for s in cutlass.range_constexpr(stages - 1):
            if s < n_warp:
                self.load_tile(k_src, v_src, s_src, k_row, v_row, k_write, v_write, s_write, lane, seqlen_k,
                               first + s * NUM_WARPS, warp_idx * stages + s)
            cute.arch.cp_async_commit_group()

        # ---- Q's integer digits, per packed row (8 threads a row), while the KV tiles are in flight ----
        per = D // 8
        q_row = tidx // 8
        q_col = (tidx % 8) * per
        sQ8 = storage.sQ8.get_tensor(cute.make_layout((D // 4, TILE_M, 2), stride=(1, D // 4, TILE_M * D // 4)),
                                     dtype=Uint32)  # (word of 4 columns, row, digit)
        sQmul = storage.sQmul.get_tensor(cute.make_layout((TILE_M,)))
        xs = cute.make_rmem_tensor((per,), Float32)
        amax = Float32(0.0)
        for e in cutlass.range_constexpr(per):
            xs[e] = q_vals[e].to(Float32)
            amax = _max_abs(amax, xs[e])
        amax = lanes_reduce(amax, _max_abs, 8)
        amax = _max_abs(amax, Float32(Q_AMAX_MIN))  # a zero row scores 0; inv stays finite; NaN stays NaN
        inv = Float32(Q_MAX * Q_BASE) / amax
        for w in cutlass.range_constexpr(per // 4):
            hi_word = Int32(0)
            lo_word = Int32(0)
            for e in cutlass.range_constexpr(4):
                y = _rint(xs[4 * w + e] * inv)
                hi = _rint(y.to(Float32) * (1.0 / Q_BASE))
                hi_word = hi_word | ((hi & 0xFF) << (8 * e))
                lo_word = lo_word | (((y - hi * Q_BASE) & 0xFF) << (8 * e))
            sQ8[q_col // 4 + w, q_row, 0] = Uint32(hi_word)
            sQ8[q_col // 4 + w, q_row, 1] = Uint32(lo_word)
        if tidx % 8 == 0:
            sQmul[q_row] = amax * (1.0 / (Q_MAX * Q_BASE)) * (softcap_in if const_expr(self.has_softcap) else scale_log2)
        cute.arch.barrier()

        # A registers of m16n8k32 (PTX ISA): a0 = row g, k 4t .. 4t + 3; a1 row g + 8; a2, a3 the same at k + 16.
        tSrQ = cute.make_rmem_tensor((4, D // 32, 2), Uint32)  # (register, k-block, digit)
        for p in cutlass.range_constexpr(2):
            for kb in cutlass.range_constexpr(D // 32):
                for x in cutlass.range_constexpr(4):
                    tSrQ[x, kb, p] = sQ8[8 * kb + 4 * (x // 2) + t, g + 8 * (x % 2), p]

        thr_mma = tiled_mma.get_slice(lane)
        tOrV = cute.make_rmem_tensor(thr_mma.partition_shape_B((D, TILE_N)), self.dtype)  # ((2,2), D/8, 1)
        tOrV_words = cute.recast_tensor(tOrV, Uint32)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, D)), Float32)
        acc_O.fill(0.0)

        tScS = _mn_view(thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N))))
        n_rows = cute.size(tScS, mode=[0])
        n_cols = cute.size(tScS, mode=[1])
        # The fragment rows (g, g + 8) this lane works on: with `half_rows` the second holds no query (its scores are
        # exactly 0, from the zeroed Q rows, and its P is left 0: row_max -inf and row_sum 0 keep it out of the merge).
        live_rows = 1 if const_expr(self.half_rows) else n_rows
        limit = cute.make_rmem_tensor((n_rows,), Int32)
        for r in cutlass.range_constexpr(live_rows):
            limit[r] = seqlen_k
            if const_expr(self.causal):
                token = (row_tile * TILE_M + tScS[r, 0][0]) // group
                limit[r] = cutlass.min(seqlen_k - seqlen_q + token + 1, seqlen_k)
        row_max = cute.make_rmem_tensor((n_rows,), Float32)
        row_sum = cute.make_rmem_tensor((n_rows,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        q_mul = cute.make_rmem_tensor((n_rows,), Float32)
        for r in cutlass.range_constexpr(live_rows):
            q_mul[r] = sQmul[tScS[r, 0][0]]
        k_words = cute.make_rmem_tensor((4, C // 4, 2), Uint32)  # (word, chunk t + 4i, n-block)
        v_words = cute.make_rmem_tensor((4, D // 32), Uint32)  # (key 2t, 2t + 1, 2t + 8, 2t + 9; word)

        for it in range(n_warp):
            cute.arch.cp_async_wait_group(stages - 2)
            cute.arch.sync_warp()  # tile `it` visible to the warp; slot (it - 1) % stages free
            if it + stages - 1 < n_warp:
                self.load_tile(k_src, v_src, s_src, k_row, v_row, k_write, v_write, s_write, lane, seqlen_k,
                               first + (it + stages - 1) * NUM_WARPS, warp_idx * stages + (it + stages - 1) % stages)
            cute.arch.cp_async_commit_group()
            slot = warp_idx * stages + it % stages
            tile = first + it * NUM_WARPS
            if const_expr(self.has_key_mask):
                visible = cute.make_rmem_tensor((n_cols,), Int32)
                for c in cutlass.range_constexpr(n_cols):
                    visible[c] = Int32(mKeyMask[b, cutlass.min(tile * TILE_N + tScS[0, c][1], mK.shape[2] - 1)])

            # ---- S = Q K^T: the int8 K words are the B registers of m16n8k32 (b0 k 4t .., b1 k 16 + 4t ..) ----
            for j in cutlass.range_constexpr(TILE_N // 8):
                for i in cutlass.range_constexpr(C // 4):
                    cute.autovec_copy(sWords[None, slot * slot_chunks + k_read[j, i]], k_words[None, i, j])
            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, TILE_N)), Float32)
            for j in cutlass.range_constexpr(TILE_N // 8):
                digits = [[Int32(0)] * 4, [Int32(0)] * 4]
                for kb in cutlass.range_constexpr(D // 32):
                    bk = (k_words[2 * (kb % 2), kb // 2, j], k_words[2 * (kb % 2) + 1, kb // 2, j])
                    for p in cutlass.range_constexpr(2):
                        digits[p] = _imma([tSrQ[x, kb, p] for x in range(4)], bk, digits[p])
                for x in cutlass.range_constexpr(4):  # c0, c1: row g, keys 2t, 2t + 1; c2, c3: row g + 8
                    if const_expr(x // 2 < live_rows):
                        acc_S[(x % 2, x // 2), 0, j] = (digits[0][x] * Q_BASE + digits[1][x]).to(Float32)
                    else:
                        acc_S[(x % 2, x // 2), 0, j] = Float32(0.0)

            # ---- V fragments: D / 8 bytes of keys 2t, 2t + 1, 2t + 8, 2t + 9 (loads in flight during softmax) ----
            for kk in cutlass.range_constexpr(4):
                if const_expr(D == 64):
                    cute.autovec_copy(sHalfChunkWords[None, 2 * slot * slot_chunks + v_read[kk, 0]], v_words[kk, None])
                else:
                    for i in cutlass.range_constexpr(v_pieces):
                        cute.autovec_copy(sWords[None, slot * slot_chunks + v_read[kk, i]],
                                          cute.local_tile(v_words[kk, None], (4,), (i,)))

            s_mn = _mn_view(acc_S)
            o_mn = _mn_view(acc_O)
            k_mul = cute.make_rmem_tensor((n_cols,), Float32)
            v_mul = cute.make_rmem_tensor((n_cols,), Float32)
            for c in cutlass.range_constexpr(n_cols):
                k_mul[c] = sScale[tScS[0, c][1], 0, slot]
                v_mul[c] = sScale[tScS[0, c][1], 1, slot]
                if const_expr(self.fp16):
                    v_mul[c] = v_mul[c] * FP16_P_SCALE
            corr_rows = cute.make_rmem_tensor((n_rows,), Float32)
            moved = Int32(0)
            for r in cutlass.range_constexpr(live_rows):
                for c in cutlass.range_constexpr(n_cols):
                    x = s_mn[r, c] * q_mul[r] * k_mul[c]
                    if const_expr(self.has_softcap):
                        x = cute.math.tanh(x) * softcap_out
                    x = x if tile * TILE_N + tScS[0, c][1] < limit[r] else -Float32.inf
                    if const_expr(self.has_key_mask):
                        x = x if visible[c] != 0 else -Float32.inf
                    s_mn[r, c] = x
                row_vals = s_mn[r, None].load()
                m_prev = row_max[r]
                m_new = cute.arch.fmax(m_prev, _quad_max(row_vals.reduce(cute.ReductionOp.MAX, -Float32.inf, 0)))
                m_use = 0.0 if m_new == -Float32.inf else m_new
                p = cute.math.exp2(row_vals - m_use, fastmath=True)
                corr = cute.math.exp2(m_prev - m_use, fastmath=True)
                row_sum[r] = row_sum[r] * corr + p.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
                row_max[r] = m_new
                corr_rows[r] = corr
                moved = moved + Int32(m_new != m_prev)
                s_mn[r, None] = p
                for c in cutlass.range_constexpr(n_cols):
                    s_mn[r, c] = s_mn[r, c] * v_mul[c]

            # Rescale O only when some row max of the warp moved (late in a long split it rarely does; a
            # warp-uniform branch saves the D / 2 multiplies, a predicated one would still issue them).
            if cute.arch.vote_any_sync(moved != 0):
                for r in cutlass.range_constexpr(live_rows):
                    o_mn[r, None] = o_mn[r, None].load() * corr_rows[r]

            for h in cutlass.range_constexpr(2):
                for w in cutlass.range_constexpr(D // 32):
                    lo = Int32(v_words[2 * h, w])
                    hi = Int32(v_words[2 * h + 1, w])
                    for byte in cutlass.range_constexpr(4):
                        tOrV_words[(0, h), 4 * w + byte, 0] = Uint32(
                            _int8_pair(_prmt(lo, hi, ((4 + byte) << 8) | byte), self.fp16))

            rP = cute.make_fragment_like(acc_S, self.dtype)
            rP.store(acc_S.load().to(self.dtype))
            tOrP = _as_operand_a(rP)
            cute.gemm(tiled_mma, acc_O, tOrP[None, None, 0], tOrV[None, None, 0], acc_O)

        # ---- merge the warps and write out (`SplitKVMerge`), O's columns back in head-dim order ----
        sRed = storage.sKV.get_tensor(cute.make_layout((TILE_M, D, NUM_WARPS), stride=(D, 1, TILE_M * D)),
                                      dtype=Float32)
        warp_rows = cute.make_layout((TILE_M, NUM_WARPS), stride=(1, TILE_M))
        self.merge_and_store(sRed, storage.sM.get_tensor(warp_rows), storage.sL.get_tensor(warp_rows), thr_mma, acc_O,
                             row_max, row_sum, mO, mLSE, mOpart, mLSEpart, mCounter, tidx, lane, warp_idx, row_tile,
                             num_rows, kvh, hm, b, split_idx)

    @cute.jit
    def load_tile(self, k_src: Int64, v_src: Int64, s_src: Int64, k_row: Int64, v_row: Int64, k_write: cute.Tensor,
                  v_write: cute.Tensor, s_write: Int32, lane: Int32, seqlen_k: Int32, tile: Int32, slot: Int32):
        """cp.async one 16-key int8 K and V tile and their scales into ring slot `slot`; keys past seqlen_k
        are zero-filled (values and scales) and not read. k_src / v_src / s_src: this lane's global byte
        addresses in tile 0; k_write / v_write / s_write: its shared byte addresses in slot 0."""
        C = self.head_dim // 16
        rows_left = seqlen_k - tile * TILE_N - lane // C
        k_at = k_src + Int64(tile * TILE_N) * k_row
        v_at = v_src + Int64(tile * TILE_N) * v_row
        k_step = k_row * (32 // C)
        v_step = v_row * (32 // C)
        slot_bytes = slot * (2 * TILE_N * C * 16)
        for n in cutlass.range_constexpr(C // 2):
            size = Int32(16) if rows_left > n * (32 // C) else Int32(0)
            _cp_async(k_write[n] + slot_bytes, k_at, 16, size)
            _cp_async(v_write[n] + slot_bytes, v_at, 16, size)
            k_at = k_at + k_step
            v_at = v_at + v_step
        key = tile * TILE_N + lane % TILE_N
        _cp_async(s_write + slot * (2 * TILE_N * 4), s_src + Int64(tile * TILE_N * 4), 4,
                  Int32(4) if key < seqlen_k else Int32(0))
