"""Split-KV decode attention for Hopper (sm_90a) in CuTe DSL: the main (per-split) kernel.

Problem. q [B, Hq, Sq, D] with Sq small (1..8), k / v [B, Hkv, Sk, D] with Sk large, Hq = group * Hkv.
Decode is bound by reading K and V once, so the kernel is organised around the KV stream:

- Packing. The Sq * group query rows that share a KV head are packed into one 16-row tile
  (packed row r = i * group + g for query token i and query head g of the group), so each KV tile
  feeds every query head of its group. More than 16 packed rows take several row tiles (grid y).
- Split-KV. Grid (num_splits, Hkv * row_tiles, B). The KV length of batch b (seqused_k[b] when
  given, else Sk) is cut into 16-key tiles; split s takes a contiguous run of tiles, and inside
  the CTA warp w takes every num_warps-th tile of that run. A split that gets no tile (short
  sequences) writes lse = -inf and zeros, which the combine kernel weighs by exp(-inf) = 0.
- Warps are independent. Each warp owns a private ring of `stages` shared-memory slots for its K
  and V tiles, fills them with 16-byte cp.async copies, and needs only warp-level syncs; it keeps
  its own online-softmax state (row max m, row sum l, O accumulator 16 x D in fp32) and runs
  S = Q K^T and O += P V on the tensor cores (mma.sync m16n8k16, operands via ldmatrix).
- At the end the warps merge their states through shared memory (exact log-sum-exp weights),
  and the CTA writes either the final output and lse (one split) or an fp32 partial O
  (normalised) and its log2-domain lse for `DecodeCombine` to merge.

Masking (FlashAttention's bottom-right rule): query row i sees key j when j < seqlen_k and, if
causal, j <= i + seqlen_k - Sq, and, with a key mask (a padding mask, [B, Sk] bytes), key_mask[b, j]; an additive
key mask ([B, Sk] in q's dtype, eager code's mask) is added to the scores instead. Keys past seqlen_k are never read:
their shared-memory rows are zero-filled, so stale or non-finite cache contents cannot reach P @ V. Scores live in
the log2 domain (scale * log2(e) folded in; softcap applied as softcap * tanh(s * scale / softcap)); a row
whose running max is still -inf uses 0 as its max, so no -inf - -inf ever happens.
"""

from __future__ import annotations

import math
from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
FLT_MAX = 3.4028234663852886e38
TILE_M = 16  # packed query rows per CTA (one m16n8k16 row block)
TILE_N = 16  # keys per warp tile
NUM_WARPS = 4
MAX_SPLITS = 128  # the host caps the split count here (decode.MAX_SPLITS); the combine kernel's too
COMBINE_SLOTS = 32  # splits a thread of the fused combine loads in one round trip
assert TILE_M * 8 == 32 * NUM_WARPS  # Q's load and the merge give each thread an eighth of one packed row


def _mn_view(t: cute.Tensor) -> cute.Tensor:
    """A (rows, cols) view of an m16n8 accumulator fragment ((2 cols, 2 rows), M, N)."""
    shape, stride = t.layout.shape, t.layout.stride
    mn = cute.make_layout(
        ((shape[0][1], shape[1]), (shape[0][0], shape[2])),
        stride=((stride[0][1], stride[1]), (stride[0][0], stride[2])),
    )
    return cute.make_tensor(t.iterator, mn)


def _as_operand_a(t: cute.Tensor) -> cute.Tensor:
    """Reinterpret an m16n8 accumulator-shaped fragment ((2,2), M, N) as an m16n8k16 A operand
    ((2,2,2), M, N/2): two n8 accumulator blocks hold exactly one k16 block of A."""
    div = cute.logical_divide(t.layout, (None, None, 2))
    layout = cute.make_layout(
        ((div.shape[0], div.shape[2][0]), div.shape[1], div.shape[2][1]),
        stride=((div.stride[0], div.stride[2][0]), div.stride[1], div.stride[2][1]),
    )
    return cute.make_tensor(t.iterator, layout)


def atom_columns(d: int) -> int:
    """Columns of the shared-memory swizzle atom, the copy's lane rows and the merge spread at head dim d: 64 (128-byte
    rows) where d is a multiple of 64, else 32 (64-byte rows; head dim 96)."""
    return 64 if d % 64 == 0 else 32


def _spread(row, col, d: int):
    """Column of (row, col) in the fp32 merge buffer of head dim d: XOR-ing row bits into the column puts the rows
    an accumulator store touches on different banks, a permutation inside each `atom_columns(d)` columns (64 would
    push columns of head dim 96 past its row)."""
    return col ^ ((row % (atom_columns(d) // 8)) * 8)


def smem_atom(d: int):
    """The swizzled shared-memory atom of a [rows, d] tile, 8 x `atom_columns(d)`: the 8 rows of an ldmatrix read of
    16 bytes each hit 8 distinct bank groups (Swizzle<3,3,3> over 128-byte rows, <2,3,3> over 64-byte ones)."""
    columns = atom_columns(d)
    bits = (columns // 8).bit_length() - 1
    return cute.make_composed_layout(cute.make_swizzle(bits, 3, 3), 0,
                                     cute.make_layout((8, columns), stride=(columns, 1)))


def gmem_copy_threads(d: int):
    """A warp's thread layout for cp.async copies of 16 bytes a lane into a [rows, d] tile: 32 / lanes rows x
    `atom_columns(d)` columns per instruction, lanes = atom_columns(d) / 8 a row."""
    lanes = atom_columns(d) // 8
    return cute.make_layout((32 // lanes, lanes), stride=(lanes, 1))


def _add(a, b):
    return a + b


def lanes_reduce(x, op, lanes: int):
    """op over each aligned group of `lanes` (a power of two <= 32) consecutive lanes, every lane of the group
    getting the result (butterfly shuffles, widest first)."""
    offset = lanes // 2
    while offset:
        x = op(x, cute.arch.shuffle_sync_bfly(x, offset=offset, mask=-1, mask_and_clamp=31))
        offset //= 2
    return x


def _quad_max(x: Float32) -> Float32:
    return lanes_reduce(x, cute.arch.fmax, 4)


def _quad_sum(x: Float32) -> Float32:
    return lanes_reduce(x, _add, 4)


@cute.jit
def lse_max_and_sum(lse: cute.Tensor, lanes: cutlass.Constexpr):
    """(m, sum_s 2^(L_s - m)) over split lses L_s (log2) that an aligned group of `lanes` lanes holds between them
    (`lse`: this lane's share, -inf where none), m their max, or 0 when every one is -inf (no -inf - -inf)."""
    m = lse[0]
    for j in cutlass.range_constexpr(1, cute.size(lse)):
        m = cute.arch.fmax(m, lse[j])
    m = lanes_reduce(m, cute.arch.fmax, lanes)
    m_use = 0.0 if m == -Float32.inf else m
    total = Float32(0.0)
    for j in cutlass.range_constexpr(cute.size(lse)):
        total = total + cute.math.exp2(lse[j] - m_use, fastmath=True)
    return m_use, lanes_reduce(total, _add, lanes)


def head_and_token(r, kvh, group: int):
    """(query head, query token) of packed row r of KV head kvh (packed row r = token * group + head in the group)."""
    i = r // group
    return kvh * group + (r - i * group), i


class SplitKVMerge:
    """The end of a split-KV decode CTA, shared by `DecodeAttentionSm90` and the int8-KV kernel: the warps merge
    their (m, l, O) states through shared memory and the CTA writes the output and lse (one split) or the
    normalised fp32 partial O and its log2-domain lse. A kernel sets `o_column` (accumulator column -> head-dim
    column) and `o_scale` (a constant factor P carried into O) if its own are not the identity."""

    o_scale = 1.0
    half_rows = False  # every packed row one of the tile's first 8 (a lane's second fragment row holds no query)
    fused_combine = False  # split: the last CTA of a (batch, row tile) merges the splits itself (`combine_if_last`)

    def set_call_shape(self, dtype, head_dim: int, group: int, causal: bool, has_softcap: bool, has_seqused: bool,
                       split: bool, stages: int, has_key_mask: bool, fused_combine: bool):
        """The variant fields both decode kernels take (their `__init__`'s common arguments)."""
        assert split or not fused_combine
        assert stages >= 2, stages
        self.dtype = dtype
        self.head_dim = head_dim
        self.group = group
        self.causal = causal
        self.has_softcap = has_softcap
        self.has_seqused = has_seqused
        self.has_key_mask = has_key_mask
        self.split = split
        self.fused_combine = fused_combine
        self.stages = stages
        self.num_threads = 32 * NUM_WARPS

    @staticmethod
    def o_column(col, d: int):
        return col

    @staticmethod
    def q_column(start, e: int, d: int):
        """Head-dim column of the e-th of a thread's D / 8 consecutive (logical) q columns from `start`."""
        return start + e

    @cute.jit
    def start_cta(self, mQ: cute.Tensor, tidx: Int32, row_tile: Int32, num_rows: Int32, kvh: Int32,
                  b: Int32) -> cute.Tensor:
        """The start of a CTA, before its KV prologue: issue the loads of this thread's share of the tile's packed q
        rows (behind the prologue's megabytes, on a short cache, they waited 10-25% of a CTA's life; packed row
        tidx // 8, logical columns (tidx % 8) * D / 8 .. by `q_column`, zeros past the last row) and return it; split,
        let the combine kernel (PDL) launch: it waits in griddepcontrol.wait, resident where it fits."""
        D = self.head_dim
        group = self.group
        per = D // 8
        q_vals = cute.make_rmem_tensor((per,), self.dtype)
        q_vals.fill(0.0)
        r = row_tile * TILE_M + tidx // 8
        if r < num_rows:
            h, i = head_and_token(r, kvh, group)
            for e in cutlass.range_constexpr(per):
                q_vals[e] = mQ[b, h, i, self.q_column((tidx % 8) * per, e, D)]
        if const_expr(self.split):
            cute.arch.griddepcontrol_launch_dependents()
        return q_vals

    @cute.jit
    def merge_and_store(self, sRed: cute.Tensor, sM: cute.Tensor, sL: cute.Tensor, thr_mma: cute.ThrMma, acc_O: cute.Tensor,
                        row_max: cute.Tensor, row_sum: cute.Tensor, mO: Optional[cute.Tensor],
                        mLSE: Optional[cute.Tensor], mOpart: Optional[cute.Tensor], mLSEpart: Optional[cute.Tensor],
                        mCounter: Optional[cute.Tensor], tidx: Int32, lane: Int32, warp_idx: Int32, row_tile: Int32,
                        num_rows: Int32, kvh: Int32, hm: Int32, b: Int32, split_idx: Int32):
        """sRed: the fp32 [TILE_M, D, NUM_WARPS] merge buffer over the KV ring (free once every warp is done
        with it); sM / sL: [TILE_M, NUM_WARPS] fp32 for the warps' row maxima and sums."""
        D = self.head_dim
        group = self.group
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()  # every warp is done with the ring, which now holds the fp32 O's
        tOcO = _mn_view(thr_mma.partition_C(cute.make_identity_tensor((TILE_M, D))))
        o_mn = _mn_view(acc_O)
        live_rows = 1 if const_expr(self.half_rows) else cute.size(tOcO, mode=[0])
        for r in cutlass.range_constexpr(live_rows):
            l_r = _quad_sum(row_sum[r])
            rr = tOcO[r, 0][0]
            if lane % 4 == 0:
                sM[rr, warp_idx] = row_max[r]
                sL[rr, warp_idx] = l_r
            for c in cutlass.range_constexpr(cute.size(tOcO, mode=[1])):
                sRed[rr, _spread(rr, self.o_column(tOcO[0, c][1], D), D), warp_idx] = o_mn[r, c]
        cute.arch.barrier()

        # Thread (row rr = tidx // 8, columns tidx % 8 + 8 j): the row's weights once, then its D / 8 columns (eight
        # consecutive columns a row per load: with `_spread`'s XOR the warp's 32 reads hit 32 banks).
        rr = tidx // 8
        r = row_tile * TILE_M + rr
        if r < num_rows:
            m = sM[rr, 0]
            for w in cutlass.range_constexpr(1, NUM_WARPS):
                m = cute.arch.fmax(m, sM[rr, w])
            m_use = 0.0 if m == -Float32.inf else m
            weights = cute.make_rmem_tensor((NUM_WARPS,), Float32)
            total = Float32(0.0)
            for w in cutlass.range_constexpr(NUM_WARPS):
                weights[w] = cute.math.exp2(sM[rr, w] - m_use, fastmath=True)
                total = total + sL[rr, w] * weights[w]
            inv = 0.0 if total == 0.0 else 1.0 / total
            if const_expr(self.o_scale != 1.0):
                inv = inv * (1.0 / self.o_scale)
            lse2 = -Float32.inf if total == 0.0 else m_use + cute.math.log2(total, fastmath=True)
            h, i = head_and_token(r, kvh, group)
            for j in cutlass.range_constexpr(D // 8):
                d = tidx % 8 + 8 * j
                o = Float32(0.0)
                for w in cutlass.range_constexpr(NUM_WARPS):
                    o = o + sRed[rr, _spread(rr, d, D), w] * weights[w]
                if const_expr(self.split):
                    mOpart[b, hm, split_idx, rr, d] = o * inv
                else:
                    mO[b, h, i, d] = (o * inv).to(self.dtype)
            if tidx % 8 == 0:
                if const_expr(self.split):
                    mLSEpart[b, hm, split_idx, rr] = lse2
                else:
                    mLSE[b, h, i] = lse2 * LN_2
        if const_expr(self.split and self.fused_combine):
            self.combine_if_last(sRed, sM, mO, mLSE, mOpart, mLSEpart, mCounter, tidx, row_tile, num_rows, kvh, hm, b)

    @cute.jit
    def combine_if_last(self, sRed: cute.Tensor, sM: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                        mOpart: cute.Tensor, mLSEpart: cute.Tensor, mCounter: cute.Tensor, tidx: Int32,
                        row_tile: Int32, num_rows: Int32, kvh: Int32, hm: Int32, b: Int32):
        """The combine kernel's work, done by the last of a (batch, row tile)'s split CTAs to write its partial, which
        it learns from mCounter[b * grid_y + hm] (int32, zero before the launch; the last CTA sets it back to zero, so
        a CUDA graph's replays start from zero too). Each CTA makes its partial visible (fence) before counting; the
        last one fences again before reading the others'. The same arithmetic as `DecodeCombine`: weights
        2^(L_s - m) / sum_s 2^(L_s - m) into shared memory over sRed (8 threads a packed row, splits l, l + 8, ...),
        then O = sum_s w_s O_s, a thread taking 4 columns of rows g, g + G, ... (G = 512 / D) in passes of
        COMBINE_SLOTS splits, all of a pass's loads out before any use."""
        D = self.head_dim
        group = self.group
        num_splits, rows_y, _ = cute.arch.grid_dim()
        sFlag = cute.recast_tensor(sM, Int32)
        cute.arch.fence_acq_rel_gpu()  # this thread's partial, visible before the count
        cute.arch.barrier()  # every partial of this CTA written; sRed and sM free
        if tidx == 0:
            counter = mCounter.iterator + (b * rows_y + hm)
            seen = cute.arch.atomic_add(counter, Int32(1), sem="acq_rel", scope="gpu")
            last = Int32(0)
            if seen == num_splits - 1:
                last = Int32(1)
                cute.arch.atomic_exch(counter, Int32(0), sem="relaxed", scope="gpu")
            sFlag[0, 0] = last
        cute.arch.barrier()
        if sFlag[0, 0] != 0:
            cute.arch.fence_acq_rel_gpu()  # the other CTAs' partials, visible to this one
            sW = cute.make_tensor(sRed.iterator, cute.make_layout((TILE_M, MAX_SPLITS), stride=(MAX_SPLITS, 1)))
            # ---- weights: packed row tidx // 8, splits tidx % 8 + 8 j ----
            rr = tidx // 8
            r = row_tile * TILE_M + rr
            lse = cute.make_rmem_tensor((MAX_SPLITS // 8,), Float32)
            lse.fill(-Float32.inf)
            if r < num_rows:
                for j in cutlass.range_constexpr(MAX_SPLITS // 8):
                    if tidx % 8 + 8 * j < num_splits:
                        lse[j] = mLSEpart[b, hm, tidx % 8 + 8 * j, rr]
            m_use, total = lse_max_and_sum(lse, 8)
            inv = 0.0 if total == 0.0 else 1.0 / total
            for j in cutlass.range_constexpr(MAX_SPLITS // 8):
                if tidx % 8 + 8 * j < num_splits:
                    sW[rr, tidx % 8 + 8 * j] = cute.math.exp2(lse[j] - m_use, fastmath=True) * inv
            if r < num_rows:
                if tidx % 8 == 0:
                    h, i = head_and_token(r, kvh, group)
                    mLSE[b, h, i] = (
                        -Float32.inf if total == 0.0 else (m_use + cute.math.log2(total, fastmath=True)) * LN_2)
            cute.arch.barrier()
            # ---- O: thread (4 columns from c, rows g + G k) ----
            chunks = D // 4
            G = self.num_threads // chunks
            c = (tidx % chunks) * 4
            vals = cute.make_rmem_tensor((4, COMBINE_SLOTS), Float32)
            for k in cutlass.range_constexpr(TILE_M // G):
                rr = tidx // chunks + G * k
                r = row_tile * TILE_M + rr
                if r < num_rows:
                    acc = cute.make_rmem_tensor((4,), Float32)
                    acc.fill(0.0)
                    for p in range((num_splits + COMBINE_SLOTS - 1) // COMBINE_SLOTS):
                        for j in cutlass.range_constexpr(COMBINE_SLOTS):
                            if p * COMBINE_SLOTS + j < num_splits:
                                for v in cutlass.range_constexpr(4):
                                    vals[v, j] = mOpart[b, hm, p * COMBINE_SLOTS + j, rr, c + v]
                        for j in cutlass.range_constexpr(COMBINE_SLOTS):
                            if p * COMBINE_SLOTS + j < num_splits:
                                w = sW[rr, p * COMBINE_SLOTS + j]
                                for v in cutlass.range_constexpr(4):
                                    acc[v] = acc[v] + w * vals[v, j]
                    h, i = head_and_token(r, kvh, group)
                    for v in cutlass.range_constexpr(4):
                        mO[b, h, i, c + v] = acc[v].to(self.dtype)


class DecodeAttentionSm90(SplitKVMerge):
    """One compiled variant per (dtype, head_dim, group, causal, softcap on/off, seqused_k given,
    key mask given (and whether it is additive), split or not, ring depth `stages` >= 2: the merge reuses the K
    ring); everything else (batch, heads, Sq, Sk, strides, split count) is a runtime value.

    Call: (mQ, mK, mV, mSeqused, mKeyMask, mO, mLSE, mOpart, mLSEpart, mCounter, scale_log2, softcap_in,
    softcap_out, stream). mKeyMask [B, Sk], unit stride on Sk: uint8 (nonzero: visible), or with `additive_mask`
    in q's dtype, added to each (soft-capped) score; it enters the log2 domain times log2(e), floored at
    -FLT_MAX so that HF's finfo.min stays finite and a row of it is uniform, as in eager, while -inf stays -inf and
    hides its key, as eager's softmax weighs it 0 (split, such a row's
    lse cannot hold log(sum): the combine weighs the splits alike, where eager weighs keys alike; a decode query of
    generate always sees its own key).
    mO [B, Hq, Sq, D] (any strides, unit on D) and mLSE [B, Hq, Sq] fp32 are written when
    not split; mOpart [B, Hkv * row_tiles, splits, 16, D] fp32 and mLSEpart [B, Hkv * row_tiles,
    splits, 16] fp32 (log2 domain) when split (grid x = splits comes from mOpart's shape). With `fused_combine`
    (split) the kernel also takes mO, mLSE and mCounter (int32, >= B * Hkv * row_tiles zeros) and merges the splits
    itself (`combine_if_last`); else mCounter is None.
    """

    def __init__(self, dtype, head_dim: int, group: int, causal: bool, has_softcap: bool,
                 has_seqused: bool, split: bool, stages: int, has_key_mask: bool = False, additive_mask: bool = False,
                 fused_combine: bool = False):
        assert head_dim % 32 == 0 and head_dim <= 256, head_dim  # the host's HEAD_DIMS are the tested ones
        assert has_key_mask or not additive_mask
        self.set_call_shape(dtype, head_dim, group, causal, has_softcap, has_seqused, split, stages, has_key_mask,
                            fused_combine)
        self.additive_mask = additive_mask

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
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
        atom = smem_atom(D)
        sQ_layout = cute.tile_to_shape(atom, (TILE_M, D), (0, 1))
        sKV_layout = cute.tile_to_shape(atom, (TILE_N, D, self.stages * NUM_WARPS), (0, 1, 2))
        sRed_layout = cute.make_layout((TILE_M, D, NUM_WARPS), stride=(D, 1, TILE_M * D))

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sM: cute.struct.Align[cute.struct.MemRange[Float32, NUM_WARPS * TILE_M], 16]
            sL: cute.struct.Align[cute.struct.MemRange[Float32, NUM_WARPS * TILE_M], 16]

        # One warp copies a 16 x D tile, 16 bytes per lane.
        copy_atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype, num_bits_per_copy=128)
        gmem_copy = cute.make_tiled_copy_tv(copy_atom, gmem_copy_threads(D), cute.make_layout((1, 8)))
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)), (1, 1, 1), permutation_mnk=(16, 16, 16))

        row_tiles = (mQ.shape[2] * self.group + TILE_M - 1) // TILE_M
        num_splits = 1
        if const_expr(self.split):
            num_splits = mOpart.shape[2]
        self.kernel(
            mQ, mK, mV, mSeqused, mKeyMask, mO, mLSE, mOpart, mLSEpart, mCounter, scale_log2, softcap_in, softcap_out,
            row_tiles,
            sQ_layout, sKV_layout, sRed_layout, gmem_copy, tiled_mma, SharedStorage,
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
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        sRed_layout: cute.Layout,
        gmem_copy: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        D = self.head_dim
        group = self.group
        stages = self.stages
        tidx, _, _ = cute.arch.thread_idx()
        split_idx, hm, b = cute.arch.block_idx()
        num_splits, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        kvh = hm // row_tiles
        row_tile = hm - kvh * row_tiles

        seqlen_q = mQ.shape[2]
        seqlen_k = mK.shape[2]
        if const_expr(self.has_seqused):
            seqlen_k = cutlass.max(cutlass.min(mSeqused[b], mK.shape[2]), 0)
        num_rows = seqlen_q * group

        # This CTA's run of 16-key tiles: splits differ by at most one tile; a split is empty only
        # when there are fewer tiles than splits.
        n_tiles = (seqlen_k + TILE_N - 1) // TILE_N
        tile_begin = split_idx * n_tiles // num_splits
        n_cta = (split_idx + 1) * n_tiles // num_splits - tile_begin
        n_warp = (cutlass.max(n_cta - warp_idx, 0) + NUM_WARPS - 1) // NUM_WARPS

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK_all = storage.sK.get_tensor(sKV_layout)
        sV_all = storage.sV.get_tensor(sKV_layout)

        # ---- this warp's K / V ring: slots warp_idx * stages + s ----
        sK = cute.local_tile(sK_all, (TILE_N, D, stages), (0, 0, warp_idx))
        sV = cute.local_tile(sV_all, (TILE_N, D, stages), (0, 0, warp_idx))
        sVt = cute.composition(sV, cute.make_layout((D, TILE_N, stages), stride=(TILE_N, 1, TILE_N * D)))

        gK = cute.local_tile(mK[b, kvh, None, None], (TILE_N, D), (None, 0))  # (16, D, tiles)
        gV = cute.local_tile(mV[b, kvh, None, None], (TILE_N, D), (None, 0))
        thr_copy = gmem_copy.get_slice(lane)
        tKgK = thr_copy.partition_S(gK)  # (CPY, rows, cols, tiles)
        tKsK = thr_copy.partition_D(sK)  # (CPY, rows, cols, stages)
        tVgV = thr_copy.partition_S(gV)
        tVsV = thr_copy.partition_D(sV)
        tKcK = thr_copy.partition_S(cute.make_identity_tensor((TILE_N, D)))

        q_vals = self.start_cta(mQ, tidx, row_tile, num_rows, kvh, b)  # Q's loads first, then the KV prologue

        # ---- prologue: start streaming this warp's first tiles ----
        first = tile_begin + warp_idx
        for s in cutlass.range_constexpr(stages - 1):
            if s < n_warp:
                self.load_tile(gmem_copy, tKgK, tKsK, tVgV, tVsV, tKcK, seqlen_k, first + s * NUM_WARPS, s)
            cute.arch.cp_async_commit_group()

        for e in cutlass.range_constexpr(D // 8):
            sQ[tidx // 8, (tidx % 8) * (D // 8) + e] = q_vals[e]
        cute.arch.barrier()

        thr_mma = tiled_mma.get_slice(lane)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, D)), Float32)
        acc_O.fill(0.0)

        ldsm = warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4)
        ldsm_t = warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4)
        copy_Q = cute.make_tiled_copy_A(cute.make_copy_atom(ldsm, self.dtype), tiled_mma).get_slice(lane)
        copy_K = cute.make_tiled_copy_B(cute.make_copy_atom(ldsm, self.dtype), tiled_mma).get_slice(lane)
        copy_V = cute.make_tiled_copy_B(cute.make_copy_atom(ldsm_t, self.dtype), tiled_mma).get_slice(lane)
        tSsQ = copy_Q.partition_S(sQ)
        tSsK = copy_K.partition_S(sK)  # (CPY, 1, D/16, stages)
        tOsVt = copy_V.partition_S(sVt)  # (CPY, D/16, 1, stages)
        tSrK_view = copy_K.retile(tSrK)
        tOrVt_view = copy_V.retile(tOrVt)
        cute.copy(copy_Q, tSsQ, copy_Q.retile(tSrQ))  # Q stays in registers for the whole loop

        # Per-thread row limits: this thread's accumulator rows are fixed, so are their last keys.
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

        # ---- main loop: cp.async ring of `stages` slots, one commit group per tile ----
        for it in range(n_warp):
            cute.arch.cp_async_wait_group(stages - 2)
            cute.arch.sync_warp()  # tile `it` visible to the warp; slot (it - 1) % stages free
            if it + stages - 1 < n_warp:
                self.load_tile(gmem_copy, tKgK, tKsK, tVgV, tVsV, tKcK, seqlen_k,
                               first + (it + stages - 1) * NUM_WARPS, (it + stages - 1) % stages)
            cute.arch.cp_async_commit_group()
            slot = it % stages
            tile = first + it * NUM_WARPS
            if const_expr(self.has_key_mask):
                # This thread's key columns, loaded before S = Q K^T so the load overlaps the MMAs
                # (clamped: the last tile may pass Sk).
                if const_expr(self.additive_mask):
                    bias = cute.make_rmem_tensor((n_cols,), Float32)
                    for c in cutlass.range_constexpr(n_cols):
                        value = mKeyMask[b, cutlass.min(tile * TILE_N + tScS[0, c][1], mK.shape[2] - 1)]
                        x = Float32(value)
                        bias[c] = x if x == -Float32.inf else cute.arch.fmax(x * LOG2_E, -FLT_MAX)
                else:
                    visible = cute.make_rmem_tensor((n_cols,), Int32)
                    for c in cutlass.range_constexpr(n_cols):
                        visible[c] = Int32(mKeyMask[b, cutlass.min(tile * TILE_N + tScS[0, c][1], mK.shape[2] - 1)])

            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, TILE_N)), Float32)
            acc_S.fill(0.0)
            cute.copy(copy_K, tSsK[None, None, None, slot], tSrK_view)
            for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)

            s_mn = _mn_view(acc_S)
            o_mn = _mn_view(acc_O)
            for r in cutlass.range_constexpr(n_rows):
                for c in cutlass.range_constexpr(n_cols):
                    x = s_mn[r, c]
                    if const_expr(self.has_softcap):
                        x = cute.math.tanh(x * softcap_in) * softcap_out  # accurate tanh: decode has time to spare
                    else:
                        x = x * scale_log2
                    if const_expr(self.additive_mask):
                        x = x + bias[c]
                    x = x if tile * TILE_N + tScS[0, c][1] < limit[r] else -Float32.inf
                    if const_expr(self.has_key_mask and not self.additive_mask):
                        x = x if visible[c] != 0 else -Float32.inf
                    s_mn[r, c] = x
                row = s_mn[r, None].load()
                m_prev = row_max[r]
                m_new = cute.arch.fmax(m_prev, _quad_max(row.reduce(cute.ReductionOp.MAX, -Float32.inf, 0)))
                m_use = 0.0 if m_new == -Float32.inf else m_new
                p = cute.math.exp2(row - m_use, fastmath=True)
                corr = cute.math.exp2(m_prev - m_use, fastmath=True)
                row_sum[r] = row_sum[r] * corr + p.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
                row_max[r] = m_new
                o_mn[r, None] = o_mn[r, None].load() * corr
                s_mn[r, None] = p

            rP = cute.make_fragment_like(acc_S, self.dtype)
            rP.store(acc_S.load().to(self.dtype))
            tOrP = _as_operand_a(rP)
            cute.copy(copy_V, tOsVt[None, None, None, slot], tOrVt_view)
            for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(tiled_mma, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)

        # ---- merge the warps and write out ----
        warp_rows = cute.make_layout((TILE_M, NUM_WARPS), stride=(1, TILE_M))
        self.merge_and_store(storage.sK.get_tensor(sRed_layout, dtype=Float32), storage.sM.get_tensor(warp_rows),
                             storage.sL.get_tensor(warp_rows), thr_mma, acc_O, row_max, row_sum, mO, mLSE, mOpart,
                             mLSEpart, mCounter, tidx, lane, warp_idx, row_tile, num_rows, kvh, hm, b, split_idx)

    @cute.jit
    def load_tile(self, gmem_copy: cute.TiledCopy, tKgK: cute.Tensor, tKsK: cute.Tensor, tVgV: cute.Tensor,
                  tVsV: cute.Tensor, tKcK: cute.Tensor, seqlen_k: Int32, tile: Int32, slot: Int32):
        """cp.async one 16-key K and V tile into a ring slot; rows past seqlen_k become zeros."""
        for n in cutlass.range_constexpr(cute.size(tKsK, mode=[1])):
            if tile * TILE_N + tKcK[0, n, 0][0] < seqlen_k:
                cute.copy(gmem_copy, tKgK[None, n, None, tile], tKsK[None, n, None, slot])
                cute.copy(gmem_copy, tVgV[None, n, None, tile], tVsV[None, n, None, slot])
            else:
                tKsK[None, n, None, slot].fill(0.0)
                tVsV[None, n, None, slot].fill(0.0)
