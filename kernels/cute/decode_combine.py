"""Combine step of the split-KV decode attention (`decode_attention.py`), CuTe DSL, any sm80+.

Each split s wrote, per packed row, a normalised fp32 partial output O_s and its log2-domain
log-sum-exp L_s (-inf for a split that saw no key). The exact result is

    L = log2(sum_s 2^(L_s - m)) + m,   m = max_s L_s (0 when every L_s is -inf),
    O = sum_s 2^(L_s - L) * O_s,

with O = 0 and lse = -inf for a row that saw no key at all.

`combine_tile` merges one 16-row tile of one (batch, KV head) with the threads of one CTA. It
runs in two places: in the main kernel, by the CTA whose split finishes last (the default: no
second launch), and in `DecodeCombine`, a kernel of its own with one CTA per tile (used when no
arrival counters are at hand, e.g. a CUDA graph captured before any eager call).

Work split. Weights: warp w takes rows w, w + warps, ...; lane l takes splits l, l + 32, ...
(up to MAX_SPLITS), all loads issued before the first use; the row's max and sum are warp
reductions. Sum: thread t takes 4 columns of one row and sums them over the splits, SPLIT_CHUNK
splits' loads in flight at once (the step is latency-bound: a few round trips to L2).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

LN_2 = math.log(2.0)
TILE_M = 16
MAX_SPLITS = 128  # the host caps the split count here (decode.MAX_SPLITS)
VEC = 4  # output columns per thread in the weighted sum
SPLIT_CHUNK = 16  # splits whose loads a thread has in flight at once
NUM_THREADS = 128  # DecodeCombine's CTA


def _warp_reduce(x: Float32, op) -> Float32:
    for offset in (16, 8, 4, 2, 1):
        x = op(x, cute.arch.shuffle_sync_bfly(x, offset=offset, mask=-1, mask_and_clamp=31))
    return x


def _add(a, b):
    return a + b


@cute.jit
def combine_tile(mOpart: cute.Tensor, mLSEpart: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, sW: cute.Tensor,
                 b: Int32, hm: Int32, row_tiles: Int32, tidx: Int32, dtype: cutlass.Constexpr,
                 head_dim: cutlass.Constexpr, group: cutlass.Constexpr, num_threads: cutlass.Constexpr):
    """Merge the splits of tile `hm` (= KV head * row_tiles + row tile) of batch `b` into mO / mLSE.

    mOpart [B, Hkv * row_tiles, splits, 16, D] fp32, mLSEpart [B, Hkv * row_tiles, splits, 16] fp32
    (log2), mO [B, Hq, Sq, D], mLSE [B, Hq, Sq] fp32 (natural log); sW (16, MAX_SPLITS) fp32 scratch
    in shared memory. Every thread of the CTA calls it; it ends with the CTA's threads in step."""
    D = head_dim
    num_warps = num_threads // 32
    warp_idx = cute.arch.make_warp_uniform(tidx // 32)
    lane = tidx % 32
    num_splits = mOpart.shape[2]
    kvh = hm // row_tiles
    row0 = (hm - kvh * row_tiles) * TILE_M
    num_rows = mO.shape[2] * group
    rows_here = cutlass.min(num_rows - row0, TILE_M)

    # ---- weights w[rr, s] = 2^(L_s - L) and the rows' lse ----
    row_slots = TILE_M // num_warps
    split_slots = MAX_SPLITS // 32
    lse_s = cute.make_rmem_tensor((row_slots, split_slots), Float32)
    lse_s.fill(-Float32.inf)
    for j in cutlass.range_constexpr(row_slots):
        rr = warp_idx + j * num_warps
        if rr < rows_here:
            for i in cutlass.range_constexpr(split_slots):
                s = lane + i * 32
                if s < num_splits:
                    lse_s[j, i] = mLSEpart[b, hm, s, rr]
    for j in cutlass.range_constexpr(row_slots):
        rr = warp_idx + j * num_warps
        if rr < rows_here:  # uniform over the warp
            m = lse_s[j, 0]
            for i in cutlass.range_constexpr(1, split_slots):
                m = cute.arch.fmax(m, lse_s[j, i])
            m = _warp_reduce(m, cute.arch.fmax)
            m_use = 0.0 if m == -Float32.inf else m
            total = Float32(0.0)
            for i in cutlass.range_constexpr(split_slots):
                lse_s[j, i] = cute.math.exp2(lse_s[j, i] - m_use, fastmath=True)
                total = total + lse_s[j, i]
            total = _warp_reduce(total, _add)
            inv = 0.0 if total == 0.0 else 1.0 / total
            for i in cutlass.range_constexpr(split_slots):
                s = lane + i * 32
                if s < num_splits:
                    sW[rr, s] = lse_s[j, i] * inv
            if lane == 0:
                r = row0 + rr
                q_i = r // group
                lse = -Float32.inf
                if total > 0.0:
                    lse = (m_use + cute.math.log2(total, fastmath=True)) * LN_2
                mLSE[b, kvh * group + (r - q_i * group), q_i] = lse
    cute.arch.barrier()

    # ---- O[rr, d0:d0+4] = sum_s w[rr, s] O_s[rr, d0:d0+4] ----
    chunks = D // VEC
    for k in cutlass.range_constexpr((TILE_M * chunks + num_threads - 1) // num_threads):
        task = tidx + k * num_threads
        rr = task // chunks
        d0 = (task - rr * chunks) * VEC
        if rr < rows_here:
            acc = cute.make_rmem_tensor((VEC,), Float32)
            acc.fill(0.0)
            for s0 in range(0, num_splits, SPLIT_CHUNK):
                vals = cute.make_rmem_tensor((VEC, SPLIT_CHUNK), Float32)
                vals.fill(0.0)
                for j in cutlass.range_constexpr(SPLIT_CHUNK):
                    if s0 + j < num_splits:
                        for v in cutlass.range_constexpr(VEC):
                            vals[v, j] = mOpart[b, hm, s0 + j, rr, d0 + v]
                for j in cutlass.range_constexpr(SPLIT_CHUNK):
                    if s0 + j < num_splits:
                        weight = sW[rr, s0 + j]
                        for v in cutlass.range_constexpr(VEC):
                            acc[v] = acc[v] + weight * vals[v, j]
            r = row0 + rr
            q_i = r // group
            h = kvh * group + (r - q_i * group)
            for v in cutlass.range_constexpr(VEC):
                mO[b, h, q_i, d0 + v] = acc[v].to(dtype)


class DecodeCombine:
    """The combine step as a kernel of its own: one CTA of NUM_THREADS per (row tile, KV head, batch).
    One compiled variant per (dtype, head_dim, group, pdl).

    pdl: launched as a programmatic dependent of the main kernel (Hopper PDL): its CTAs may be
    scheduled while the main kernel drains, and wait in `griddepcontrol.wait` (which returns once
    the main grid has finished and its writes are visible) before reading any partial.

    Call: (mOpart [B, Hkv * row_tiles, splits, 16, D] fp32, mLSEpart [B, Hkv * row_tiles, splits,
    16] fp32 (log2), mO [B, Hq, Sq, D] (any strides, unit on D), mLSE [B, Hq, Sq] fp32, stream).
    """

    def __init__(self, dtype, head_dim: int, group: int, pdl: bool = False):
        self.pdl = pdl
        self.dtype = dtype
        self.head_dim = head_dim
        self.group = group

    @cute.jit
    def __call__(self, mOpart: cute.Tensor, mLSEpart: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, stream):
        row_tiles = (mO.shape[2] * self.group + TILE_M - 1) // TILE_M

        @cute.struct
        class SharedStorage:
            weights: cute.struct.Align[cute.struct.MemRange[Float32, TILE_M * MAX_SPLITS], 16]

        self.kernel(mOpart, mLSEpart, mO, mLSE, row_tiles, SharedStorage).launch(
            grid=(mOpart.shape[1], mOpart.shape[0], 1),
            block=(NUM_THREADS, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            use_pdl=self.pdl,
        )

    @cute.kernel
    def kernel(self, mOpart: cute.Tensor, mLSEpart: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               row_tiles: Int32, SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        hm, b, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sW = storage.weights.get_tensor(cute.make_layout((TILE_M, MAX_SPLITS), stride=(MAX_SPLITS, 1)))
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()  # the main kernel's partials are complete past this
        combine_tile(mOpart, mLSEpart, mO, mLSE, sW, b, hm, row_tiles, tidx, self.dtype, self.head_dim, self.group,
                     NUM_THREADS)
