"""Combine kernel of the split-KV decode attention (`decode_attention.py`), CuTe DSL, any sm80+.

Each split s wrote, per packed row, a normalised fp32 partial output O_s and its log2-domain
log-sum-exp L_s (-inf for a split that saw no key). The exact result is

    L = log2(sum_s 2^(L_s - m)) + m,   m = max_s L_s (0 when every L_s is -inf),
    O = sum_s 2^(L_s - L) * O_s,

with O = 0 and lse = -inf for a row that saw no key at all. Grid (rows, Hkv * row_tiles, B); a
CTA of 256 threads takes one packed row. The kernel is latency-bound, so every thread issues its
loads at once (one round trip to L2 for up to SLOTS * 1024 / D splits, a further one each as many more): each
warp reads all L_s (lane l: splits l, l + 32, ...) and finds the row's max and sum with shuffles, and each
thread reads the L_s and O_s of the splits it sums (4 columns, every (1024 / D)-th split); the split
groups add up in shared memory. Its registers are capped (`MIN_CTAS_PER_SM`) so that, launched under PDL while
the main kernel runs (which lets its dependents launch as it starts), its CTAs are resident and waiting when the
main kernel ends, not scheduled only as its CTAs leave.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .decode_attention import MAX_SPLITS, TILE_M, head_and_token, lse_max_and_sum

LN_2 = math.log(2.0)
NUM_THREADS = 256
VEC = 4  # output columns per thread in the weighted sum
SLOTS = 8  # splits a thread loads in one round trip (registers: the kernel must fit beside two main CTAs a SM)
# 3 CTAs' worth of registers a SM (<= 85 a thread): a combine CTA then fits beside two main-kernel CTAs of a SM of
# <= 168 registers each (the bf16 kernel's; the int8 kernel's at head dim 64), so under PDL it is resident and waiting
# before the main kernel ends (measured: -0.5 us at b1 x 4k keys, nothing at 32k; session 27)
MIN_CTAS_PER_SM = 3


class DecodeCombine:
    """One compiled variant per (dtype, head_dim, group, pdl).

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
        num_rows = mO.shape[2] * self.group
        row_tiles = (num_rows + TILE_M - 1) // TILE_M

        @cute.struct
        class SharedStorage:
            partial: cute.struct.Align[cute.struct.MemRange[Float32, NUM_THREADS * VEC], 16]

        self.kernel(mOpart, mLSEpart, mO, mLSE, row_tiles, SharedStorage).launch(
            grid=(cutlass.min(num_rows, TILE_M), mOpart.shape[1], mOpart.shape[0]),
            block=(NUM_THREADS, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            use_pdl=self.pdl,
            min_blocks_per_mp=MIN_CTAS_PER_SM,
            preferred_smem_carveout=100,  # the main kernel's (shared memory over L1); also spares the DSL a device query
        )

    @cute.kernel
    def kernel(self, mOpart: cute.Tensor, mLSEpart: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               row_tiles: Int32, SharedStorage: cutlass.Constexpr):
        D = self.head_dim
        group = self.group
        tidx, _, _ = cute.arch.thread_idx()
        rr, hm, b = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        num_splits = mOpart.shape[2]
        kvh = hm // row_tiles
        r = (hm - kvh * row_tiles) * TILE_M + rr
        num_rows = mO.shape[2] * group

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)

        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()  # the main kernel's partials are complete past this
        if r < num_rows:  # uniform over the CTA
            # Every load goes out before the first use, so the merge costs one round trip to L2:
            # lane l's share of all splits' L_s (l, l + 32, ...: each warp finds the row's max and
            # sum itself, no barrier), and for thread (split group sg, 4 columns from d0) the L_s
            # and O_s of splits sg, sg + split_groups, ...
            chunks = D // VEC
            split_groups = NUM_THREADS // chunks
            per_pass = SLOTS * split_groups
            sg = tidx // chunks
            d0 = (tidx - sg * chunks) * VEC
            lane_lse = cute.make_rmem_tensor((MAX_SPLITS // 32,), Float32)
            lane_lse.fill(-Float32.inf)
            for i in cutlass.range_constexpr(MAX_SPLITS // 32):
                if lane + i * 32 < num_splits:
                    lane_lse[i] = mLSEpart[b, hm, lane + i * 32, rr]
            own_lse = cute.make_rmem_tensor((SLOTS,), Float32)
            vals = cute.make_rmem_tensor((VEC, SLOTS), Float32)
            self.load_pass(mLSEpart, mOpart, own_lse, vals, b, hm, rr, sg, d0, 0, split_groups, num_splits)

            m_use, total = lse_max_and_sum(lane_lse, 32)
            inv = 0.0 if total == 0.0 else 1.0 / total

            # ---- O = sum_s w_s O_s, w_s = 2^(L_s - L): a pass of SLOTS splits a thread (more than per_pass splits
            # take further passes, one round trip each); the split groups add up in shared memory ----
            acc = cute.make_rmem_tensor((VEC,), Float32)
            acc.fill(0.0)
            self.add_pass(acc, own_lse, vals, m_use, inv)
            for p in range(1, (num_splits + per_pass - 1) // per_pass):
                self.load_pass(mLSEpart, mOpart, own_lse, vals, b, hm, rr, sg, d0, p * per_pass, split_groups,
                               num_splits)
                self.add_pass(acc, own_lse, vals, m_use, inv)
            sPartial = storage.partial.get_tensor(cute.make_layout((D, split_groups), stride=(1, D)))
            if sg < split_groups:  # D = 96: 256 threads are 10 groups of 24 and 16 idle threads
                for v in cutlass.range_constexpr(VEC):
                    sPartial[d0 + v, sg] = acc[v]
            cute.arch.barrier()

            h, i = head_and_token(r, kvh, group)
            for c in cutlass.range_constexpr(max(1, D // NUM_THREADS)):
                d = tidx + c * NUM_THREADS
                if d < D:
                    o = sPartial[d, 0]
                    for g in cutlass.range_constexpr(1, split_groups):
                        o = o + sPartial[d, g]
                    mO[b, h, i, d] = o.to(self.dtype)
            if tidx == 0:
                lse = -Float32.inf
                if total > 0.0:
                    lse = (m_use + cute.math.log2(total, fastmath=True)) * LN_2
                mLSE[b, h, i] = lse

    @cute.jit
    def load_pass(self, mLSEpart: cute.Tensor, mOpart: cute.Tensor, own_lse: cute.Tensor, vals: cute.Tensor, b: Int32,
                  hm: Int32, rr: Int32, sg: Int32, d0: Int32, first: Int32, split_groups: cutlass.Constexpr,
                  num_splits: Int32):
        """L_s and this thread's VEC columns of O_s for splits first + sg + j * split_groups, j < SLOTS (a split past
        the last: L_s = -inf, O_s = 0), all loads out before any use."""
        own_lse.fill(-Float32.inf)
        vals.fill(0.0)
        for j in cutlass.range_constexpr(SLOTS):
            s = first + sg + j * split_groups
            if s < num_splits:
                own_lse[j] = mLSEpart[b, hm, s, rr]
                for v in cutlass.range_constexpr(VEC):
                    vals[v, j] = mOpart[b, hm, s, rr, d0 + v]

    @cute.jit
    def add_pass(self, acc: cute.Tensor, own_lse: cute.Tensor, vals: cute.Tensor, m_use: Float32, inv: Float32):
        """acc += sum over a pass's splits of 2^(L_s - m) / total * O_s."""
        for j in cutlass.range_constexpr(SLOTS):
            weight = cute.math.exp2(own_lse[j] - m_use, fastmath=True) * inv
            for v in cutlass.range_constexpr(VEC):
                acc[v] = acc[v] + weight * vals[v, j]
