"""Split-KV decode attention over an int8 KV cache for Hopper (sm_90a) in CuTe DSL: the main kernel.

The problem, grid, query-head packing, split rule, warp structure, masking and epilogue are those of
`decode_attention.py` (read its docstring); what differs is the KV stream. k / v are int8
[B, Hkv, Sk, D] with float32 per-key scales k_scale / v_scale [B, Hkv, Sk], and the attention runs
over k * k_scale[..., None] and v * v_scale[..., None]. Since

    q . (s_k k) = s_k (q . k)      and      sum_j p_j s_vj v_j = (p * s_v) @ v,

the MMAs (mma.sync m16n8k16 in q's dtype, fp32 accumulators) take the int8 values converted
exactly (an int8 fits the significand of both fp16 and bf16); k_scale multiplies each score column
before the softmax and v_scale each column of P before P @ V (the row sums use P unscaled; in fp16 P
also carries a factor FP16_P_SCALE that the final 1 / l removes).

Data path of a warp tile (16 keys):
- cp.async copies the int8 K and V tiles (16 bytes a lane) and their 16 + 16 scales (4 bytes a lane)
  into the warp's ring slot. A tile is half the bytes of a bf16 one, so the same shared memory
  holds a ring twice as deep. Keys past seqlen_k are zero-filled, their scales too, so stale or
  non-finite cache contents never reach the MMAs.
- ldmatrix moves 16-bit elements only, so each thread reads the bytes its B fragments need with
  16-byte shared loads and turns each pair of int8 into one half2 register with integer ops
  (`_int8_pair`: prmt, one or two lop3, one packed subtract; exact).
  K (S = Q K^T sums over D, so D's order is free when Q uses the same order): thread
  (g = lane / 4, t = lane % 4) takes key row 8j + g of n-block j, bytes 16 (t + 4i) .. + 15, whose
  4-byte words are its B registers of k-blocks 4i .. 4i + 3; Q is gathered into shared memory in
  the matching column order (`k_column`).
  V (O = P V: the accumulator's column order is free, the epilogue writes physical columns,
  `v_column`): thread g owns D / 8 contiguous bytes of every key row; for its four keys 2t,
  2t + 1, 2t + 8, 2t + 9 it pairs the bytes of two keys into one register.
- The shared tiles are swizzled in 16-byte chunks (`k_chunk`, `v_chunk`) so that those reads and
  the cp.async writes are free of bank conflicts (two-way at most for V at head dim 64).

The index maps are plain functions of Python or DSL integers, so a CPU test replays them on a
simulated warp (`tests/test_decode_int8kv_compile.py`).
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int8, Int32, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.experimental import primitives as prims

from .decode_attention import LN_2, NUM_WARPS, TILE_M, TILE_N, _as_operand_a, _mn_view, _quad_max, _quad_sum, _spread

HEAD_DIMS = (64, 128, 256)
# fp16 only: P * v_scale enters the PV MMA times 2^6 (undone exactly with 1 / l), which keeps small v_scales
# out of fp16's subnormals; a V that fits fp16 has v_scale <= 65504 / 127, so p * v_scale * 64 still fits.
FP16_P_SCALE = 64.0


# ---- index maps (Python ints at trace time or DSL Int32 at run time) ----


def k_column(col, d: int):
    """Head-dim column of K (and Q) behind the MMA's logical k index `col`: k-block col // 16,
    lane t = (col % 8) // 2 takes bytes 4 * (kb % 4) + (0, 1) (k = 2t, 2t + 1) and + (2, 3)
    (k = 2t + 8, 2t + 9) of its chunk t + 4 * (kb // 4)."""
    kb = col // 16
    kl = col % 16
    return (kb // 4) * 64 + ((kl % 8) // 2) * 16 + (kb % 4) * 4 + (kl // 8) * 2 + kl % 2


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


class DecodeAttentionInt8KVSm90:
    """One compiled variant per (dtype, head_dim, group, causal, softcap on/off, seqused_k given,
    key mask given, split or not, ring depth `stages` >= 2: the merge reuses the KV ring).

    Call: (mQ, mK, mV, mKscale, mVscale, mSeqused, mKeyMask, mO, mLSE, mOpart, mLSEpart, scale_log2,
    softcap_in, softcap_out, stream). mK / mV int8 [B, Hkv, Sk, D] (unit stride on D, 16-byte
    aligned rows); mKscale / mVscale float32 [B, Hkv, Sk] (unit stride on Sk); the rest as in
    `DecodeAttentionSm90`.
    """

    def __init__(self, dtype, head_dim: int, group: int, causal: bool, has_softcap: bool,
                 has_seqused: bool, split: bool, stages: int, has_key_mask: bool = False):
        assert head_dim in HEAD_DIMS, head_dim
        assert stages >= 2, stages
        self.dtype = dtype
        self.fp16 = dtype is cutlass.Float16
        self.head_dim = head_dim
        self.group = group
        self.causal = causal
        self.has_softcap = has_softcap
        self.has_seqused = has_seqused
        self.has_key_mask = has_key_mask
        self.split = split
        self.stages = stages
        self.num_threads = 32 * NUM_WARPS

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
        scale_log2: Float32,
        softcap_in: Float32,
        softcap_out: Float32,
        stream,
    ):
        D = self.head_dim
        atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
        sQ_layout = cute.tile_to_shape(atom, (TILE_M, D), (0, 1))
        slots = self.stages * NUM_WARPS
        ring_bytes = slots * 2 * TILE_N * D

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
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
            mQ, mK, mV, mKscale, mVscale, mSeqused, mKeyMask, mO, mLSE, mOpart, mLSEpart, scale_log2, softcap_in,
            softcap_out, row_tiles, sQ_layout, tiled_mma, SharedStorage,
        ).launch(
            grid=(num_splits, mK.shape[1] * row_tiles, mK.shape[0]),
            block=(self.num_threads, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
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
        scale_log2: Float32,
        softcap_in: Float32,
        softcap_out: Float32,
        row_tiles: Int32,
        sQ_layout: cute.ComposedLayout,
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
        sQ = storage.sQ.get_tensor(sQ_layout)
        n_chunks = slots * 2 * TILE_N * C
        # The ring as 16-byte chunks: chunk ((slot * 2 + part) * TILE_N + row) * C + position, part 0 K, 1 V.
        sChunk = storage.sKV.get_tensor(cute.make_layout((16, n_chunks), stride=(1, 16)))
        sWords = storage.sKV.get_tensor(cute.make_layout((4, n_chunks), stride=(1, 4)), dtype=Uint32)
        sHalfChunkWords = storage.sKV.get_tensor(cute.make_layout((2, 2 * n_chunks), stride=(1, 2)), dtype=Uint32)
        sScale = storage.sScale.get_tensor(cute.make_layout((TILE_N, 2, slots), stride=(1, TILE_N, 2 * TILE_N)))

        copy16 = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Int8, num_bits_per_copy=128)
        copy4 = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)

        # ---- per-lane addressing, fixed for the whole loop (a ring slot adds slot * slot_chunks) ----
        # cp.async: lane copies chunk lane % C of rows lane // C + n * (32 // C), n < C / 2.
        slot_chunks = 2 * TILE_N * C
        copy_thr = cute.make_tiled_copy_tv(
            copy16, cute.make_layout((32 // C, C), stride=(C, 1)), cute.make_layout((1, 16))).get_slice(lane)
        tKgK = copy_thr.partition_S(cute.local_tile(mK[b, kvh, None, None], (TILE_N, D), (None, 0)))
        tVgV = copy_thr.partition_S(cute.local_tile(mV[b, kvh, None, None], (TILE_N, D), (None, 0)))
        k_write = cute.make_rmem_tensor((C // 2,), Int32)
        v_write = cute.make_rmem_tensor((C // 2,), Int32)
        for n in cutlass.range_constexpr(C // 2):
            row = lane // C + n * (32 // C)
            k_write[n] = row * C + k_chunk(row, lane % C, D)
            v_write[n] = (TILE_N + row) * C + v_chunk(row, lane % C, D)
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

        # ---- prologue: start streaming this warp's first tiles before anything else ----
        first = tile_begin + warp_idx
        for s in cutlass.range_constexpr(stages - 1):
            if s < n_warp:
                self.load_tile(tKgK, tVgV, mKscale, mVscale, b, kvh, sChunk, sWords, sScale, copy16, copy4, lane,
                               seqlen_k, first + s * NUM_WARPS, warp_idx * stages + s, k_write, v_write)
            cute.arch.cp_async_commit_group()

        # ---- Q in K's column order (`k_column`), while the KV tiles are in flight ----
        q_per_thread = TILE_M * D // self.num_threads
        q_vals = cute.make_rmem_tensor((q_per_thread,), self.dtype)
        q_vals.fill(0.0)
        for it in cutlass.range_constexpr(q_per_thread):
            e = tidx + it * self.num_threads
            r = row_tile * TILE_M + e // D
            if r < num_rows:
                i = r // group
                q_vals[it] = mQ[b, kvh * group + (r - i * group), i, k_column(e % D, D)]
        for it in cutlass.range_constexpr(q_per_thread):
            e = tidx + it * self.num_threads
            sQ[e // D, e % D] = q_vals[it]
        cute.arch.barrier()

        thr_mma = tiled_mma.get_slice(lane)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        copy_Q = cute.make_tiled_copy_A(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype),
            tiled_mma).get_slice(lane)
        cute.copy(copy_Q, copy_Q.partition_S(sQ), copy_Q.retile(tSrQ))  # Q stays in registers
        tSrK = cute.make_rmem_tensor(thr_mma.partition_shape_B((TILE_N, D)), self.dtype)  # ((2,2), 2, D/16)
        tSrK_words = cute.recast_tensor(tSrK, Uint32)  # ((1,2), 2, D/16): (b0 b1), (b2 b3)
        tOrV = cute.make_rmem_tensor(thr_mma.partition_shape_B((D, TILE_N)), self.dtype)  # ((2,2), D/8, 1)
        tOrV_words = cute.recast_tensor(tOrV, Uint32)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, D)), Float32)
        acc_O.fill(0.0)

        tScS = _mn_view(thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N))))
        n_rows = cute.size(tScS, mode=[0])
        n_cols = cute.size(tScS, mode=[1])
        limit = cute.make_rmem_tensor((n_rows,), Int32)
        for r in cutlass.range_constexpr(n_rows):
            limit[r] = seqlen_k
            if const_expr(self.causal):
                token = (row_tile * TILE_M + tScS[r, 0][0]) // group
                limit[r] = cutlass.min(seqlen_k - seqlen_q + token + 1, seqlen_k)
        row_max = cute.make_rmem_tensor((n_rows,), Float32)
        row_sum = cute.make_rmem_tensor((n_rows,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        k_words = cute.make_rmem_tensor((4,), Uint32)
        v_words = cute.make_rmem_tensor((4, D // 32), Uint32)  # (key 2t, 2t + 1, 2t + 8, 2t + 9; word)

        for it in range(n_warp):
            cute.arch.cp_async_wait_group(stages - 2)
            cute.arch.sync_warp()  # tile `it` visible to the warp; slot (it - 1) % stages free
            if it + stages - 1 < n_warp:
                self.load_tile(tKgK, tVgV, mKscale, mVscale, b, kvh, sChunk, sWords, sScale, copy16, copy4, lane,
                               seqlen_k, first + (it + stages - 1) * NUM_WARPS,
                               warp_idx * stages + (it + stages - 1) % stages, k_write, v_write)
            cute.arch.cp_async_commit_group()
            slot = warp_idx * stages + it % stages
            tile = first + it * NUM_WARPS
            if const_expr(self.has_key_mask):
                visible = cute.make_rmem_tensor((n_cols,), Int32)
                for c in cutlass.range_constexpr(n_cols):
                    visible[c] = Int32(mKeyMask[b, cutlass.min(tile * TILE_N + tScS[0, c][1], mK.shape[2] - 1)])

            # ---- K fragments straight from the int8 tile, then S = Q K^T ----
            for j in cutlass.range_constexpr(TILE_N // 8):
                for i in cutlass.range_constexpr(C // 4):
                    cute.autovec_copy(sWords[None, slot * slot_chunks + k_read[j, i]], k_words)
                    for w in cutlass.range_constexpr(4):
                        x = Int32(k_words[w])
                        tSrK_words[(0, 0), j, 4 * i + w] = Uint32(_int8_pair(_prmt(x, x, 0x0100), self.fp16))
                        tSrK_words[(0, 1), j, 4 * i + w] = Uint32(_int8_pair(_prmt(x, x, 0x0302), self.fp16))
            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, TILE_N)), Float32)
            acc_S.fill(0.0)
            for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                cute.gemm(tiled_mma, acc_S, tSrQ[None, None, kb], tSrK[None, None, kb], acc_S)

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
                if const_expr(self.has_softcap):
                    k_mul[c] = k_mul[c] * softcap_in
                else:
                    k_mul[c] = k_mul[c] * scale_log2
            corr_rows = cute.make_rmem_tensor((n_rows,), Float32)
            moved = Int32(0)
            for r in cutlass.range_constexpr(n_rows):
                for c in cutlass.range_constexpr(n_cols):
                    x = s_mn[r, c] * k_mul[c]
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
                for r in cutlass.range_constexpr(n_rows):
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

        # ---- merge the warps (as DecodeAttentionSm90), O's columns back in head-dim order ----
        if const_expr(self.split):
            cute.arch.griddepcontrol_launch_dependents()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()  # every warp is done with the ring, which now holds the fp32 O's
        sRed = storage.sKV.get_tensor(cute.make_layout((TILE_M, D, NUM_WARPS), stride=(D, 1, TILE_M * D)),
                                      dtype=Float32)
        sM = storage.sM.get_tensor(cute.make_layout((TILE_M, NUM_WARPS), stride=(1, TILE_M)))
        sL = storage.sL.get_tensor(cute.make_layout((TILE_M, NUM_WARPS), stride=(1, TILE_M)))
        tOcO = _mn_view(thr_mma.partition_C(cute.make_identity_tensor((TILE_M, D))))
        o_mn = _mn_view(acc_O)
        for r in cutlass.range_constexpr(n_rows):
            l_r = _quad_sum(row_sum[r])
            rr = tOcO[r, 0][0]
            if lane % 4 == 0:
                sM[rr, warp_idx] = row_max[r]
                sL[rr, warp_idx] = l_r
            for c in cutlass.range_constexpr(cute.size(tOcO, mode=[1])):
                sRed[rr, _spread(rr, v_column(tOcO[0, c][1], D)), warp_idx] = o_mn[r, c]
        cute.arch.barrier()

        for it in cutlass.range_constexpr(TILE_M * D // self.num_threads):
            e = tidx + it * self.num_threads
            rr = e // D
            d = e - rr * D
            r = row_tile * TILE_M + rr
            if r < num_rows:
                m = sM[rr, 0]
                for w in cutlass.range_constexpr(1, NUM_WARPS):
                    m = cute.arch.fmax(m, sM[rr, w])
                m_use = 0.0 if m == -Float32.inf else m
                total = Float32(0.0)
                o = Float32(0.0)
                for w in cutlass.range_constexpr(NUM_WARPS):
                    weight = cute.math.exp2(sM[rr, w] - m_use, fastmath=True)
                    total = total + sL[rr, w] * weight
                    o = o + sRed[rr, _spread(rr, d), w] * weight
                inv = 0.0 if total == 0.0 else 1.0 / total
                if const_expr(self.fp16):
                    inv = inv * (1.0 / FP16_P_SCALE)
                lse2 = -Float32.inf if total == 0.0 else m_use + cute.math.log2(total, fastmath=True)
                i = r // group
                h = kvh * group + (r - i * group)
                if const_expr(self.split):
                    mOpart[b, hm, split_idx, rr, d] = o * inv
                    if d == 0:
                        mLSEpart[b, hm, split_idx, rr] = lse2
                else:
                    mO[b, h, i, d] = (o * inv).to(self.dtype)
                    if d == 0:
                        mLSE[b, h, i] = lse2 * LN_2

    @cute.jit
    def load_tile(self, tKgK: cute.Tensor, tVgV: cute.Tensor, mKscale: cute.Tensor, mVscale: cute.Tensor, b: Int32,
                  kvh: Int32, sChunk: cute.Tensor, sWords: cute.Tensor, sScale: cute.Tensor, copy16: cute.CopyAtom,
                  copy4: cute.CopyAtom, lane: Int32, seqlen_k: Int32, tile: Int32, slot: Int32,
                  k_write: cute.Tensor, v_write: cute.Tensor):
        """cp.async one 16-key int8 K and V tile and their scales into ring slot `slot`; keys past
        seqlen_k become zeros (values and scales). tKgK / tVgV: this lane's source chunks
        ((16, 1), C / 2, 1, tiles); k_write / v_write: their chunk indices in slot 0."""
        D = self.head_dim
        C = D // 16
        base = slot * 2 * TILE_N * C
        for n in cutlass.range_constexpr(C // 2):
            k_at = base + k_write[n]
            v_at = base + v_write[n]
            src_k = tKgK[None, n, None, tile]
            src_v = tVgV[None, n, None, tile]
            if tile * TILE_N + lane // C + n * (32 // C) < seqlen_k:
                cute.copy(copy16, src_k, cute.make_tensor(sChunk[None, k_at].iterator, cute.make_layout(src_k.shape)))
                cute.copy(copy16, src_v, cute.make_tensor(sChunk[None, v_at].iterator, cute.make_layout(src_v.shape)))
            else:
                sWords[None, k_at].fill(0)
                sWords[None, v_at].fill(0)
        j = lane % TILE_N
        key = tile * TILE_N + j
        if key < seqlen_k:
            if lane < TILE_N:
                cute.copy(copy4, cute.local_tile(mKscale[b, kvh, None], (1,), (key,)),
                          cute.local_tile(sScale[None, 0, slot], (1,), (j,)))
            else:
                cute.copy(copy4, cute.local_tile(mVscale[b, kvh, None], (1,), (key,)),
                          cute.local_tile(sScale[None, 1, slot], (1,), (j,)))
        else:
            sScale[j, lane // TILE_N, slot] = 0.0
