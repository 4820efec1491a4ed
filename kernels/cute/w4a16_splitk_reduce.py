"""Split-K reduction of the weight-only decode GEMM (`w4a16_decode_gemm.py`), CuTe DSL, any sm80+.

mPart [splits, M, N] fp32 holds each split's sums; out[m, n] = dtype(sum_s mPart[s, m, n] * scale (+ bias[n]))
with the splits added in order (deterministic), scale = 2^E * mScale[0] for NVFP4 (the main kernel's decode
carries 2^-E, `decode_exponent`), mScale[n] for int8, mScale[n or 0] * mRowScale[m or 0] (if given) for fp8.
One thread per output element, splits unrolled by 4 so their loads are in flight together. With `pdl` it is launched
as a programmatic dependent of the main kernel (which lets dependents start at its beginning): its launch overlaps
the main kernel's run, and it waits for the main kernel's partials (`griddepcontrol.wait`) before reading them.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .w4a16_decode_gemm import decode_exponent

NUM_THREADS = 256
UNROLL = 4


class W4A16SplitKReduce:
    """One compiled variant per (x dtype, format, bias or not, PDL or not). Call: (mPart [splits, M, N] fp32 compact,
    mScale, mBias [N] or None, mOut [M, N] (unit stride on N), mRowScale [M] or [1] or None (fp8), stream)."""

    def __init__(self, dtype, fmt: str, has_bias: bool, pdl: bool = False):
        self.dtype = dtype
        self.fmt = fmt
        self.has_bias = has_bias
        self.pdl = pdl

    @cute.jit
    def __call__(self, mPart: cute.Tensor, mScale: cute.Tensor, mBias: Optional[cute.Tensor], mOut: cute.Tensor,
                 mRowScale: Optional[cute.Tensor], stream):
        total = mOut.shape[0] * mOut.shape[1]
        self.kernel(mPart, mScale, mBias, mOut, mRowScale).launch(
            grid=((total + NUM_THREADS - 1) // NUM_THREADS, 1, 1), block=(NUM_THREADS, 1, 1), stream=stream,
            use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mPart: cute.Tensor, mScale: cute.Tensor, mBias: Optional[cute.Tensor], mOut: cute.Tensor,
               mRowScale: Optional[cute.Tensor]):
        tidx, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        n_cols = mOut.shape[1]
        e = bx * NUM_THREADS + tidx
        if e < mOut.shape[0] * n_cols:
            m = e // n_cols
            n = e - m * n_cols
            splits = mPart.shape[0]
            acc = cute.make_rmem_tensor((UNROLL,), Float32)
            acc.fill(0.0)
            full = splits // UNROLL * UNROLL
            for s0 in range(0, full, UNROLL):
                for u in cutlass.range_constexpr(UNROLL):
                    acc[u] = acc[u] + mPart[s0 + u, m, n]
            for s in range(full, splits):
                acc[0] = acc[0] + mPart[s, m, n]
            y = (acc[0] + acc[1]) + (acc[2] + acc[3])
            if const_expr(self.fmt == "nvfp4"):
                y = y * (mScale[0] * Float32(float(2 ** decode_exponent(self.dtype == cutlass.Float16))))
            elif const_expr(self.fmt == "fp8"):
                y = y * mScale[n % mScale.shape[0]]
                if const_expr(mRowScale is not None):
                    y = y * mRowScale[m % mRowScale.shape[0]]
            else:
                y = y * mScale[n].to(Float32)
            if const_expr(self.has_bias):
                y = y + Float32(mBias[n])
            mOut[m, n] = y.to(self.dtype)
