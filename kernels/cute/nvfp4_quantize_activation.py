"""NVFP4 activation quantization for Blackwell (sm_100a / sm_120a) in CuTe DSL: x [M, K] float16 / bfloat16 ->
e2m1 codes, e4m3 block scales in the blocked layout `torch._scaled_mm` reads, and a float32 second-level scale,
for the W4A4 path of `fa4::nvfp4_linear` (`kernels/nvfp4_blackwell.py`, which also holds the plain-PyTorch
emulation of this kernel, operation for operation, that the CPU tests check).

The second-level (global) scale g, so that x ~ e2m1 * e4m3 * g:
- "row" (what the host runs): chosen on the device at every call from the row's own amax, one scale per row
  (per token): g[m] = amax_k |x[m, k]| / (6 * 448), written to mG [M]. No host sync, nothing calibrated that
  could go stale, and a captured CUDA graph recomputes it at every replay. The GEMM's per-tensor alpha cannot
  carry a per-row scale, so the host multiplies the float32 GEMM result by g[m] * w_global (an epilogue of one
  multiply per output element). A row's scale is at least as fine as a tensor's.
- "given": one calibrated float32 scale mG [1] read on the device; blocks whose e4m3 scale would exceed 448
  saturate there, and their codes at +-6.

Per 16-element block with bmax = max |x| over the block (each step one IEEE round-to-nearest float32
operation: `div.rn` / `mul.rn`, subnormals kept, so the emulation reproduces every bit):
    t = bmax / (g * 6)                       0 when g * 6 == 0
    s = e4m3(t)                              round to nearest even, saturating at 448 (`cvt.rn.satfinite`)
    d = s * g                                the block's decode scale
    r = 1 / d                                0 when d == 0 (an all-zero block, or a block far below the row)
    code = e2m1(x * r)                       round to nearest even, saturating at +-6 (`cvt.rn.satfinite`)
x must be finite; a row's amax must stay above ~2^-100 for d to stay a normal float (real activations do).

Layouts (K a multiple of 32, what `_scaled_mm` takes):
- mQ Int32 [M, K / 8]: the codes, x[m, 2i] in the low nibble of byte i (PyTorch's float4_e2m1fn_x2 packing).
- mS Int32, flat [Mp * Cp / 4] with Mp = M rounded up to 128, Cp = K / 16 rounded up to 4: the e4m3 scale of
  row r, block c at byte ((r // 128) * (Cp / 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
  (cuBLAS's 128 x 4 block-scaling-factor layout, torchao's `to_blocked`). One row's 4 scales of a 64-wide column
  block are one 32-bit word. Every byte is written, padding included (zeros: a NaN scale on padded K would
  poison the GEMM).

Work split: one CTA of NUM_THREADS threads per row of Mp (rows >= M only write their zero scale words); thread t
takes the row's 64-element chunks t, t + NUM_THREADS, ...: eight 16-byte loads, one scale word, two 16-byte
code stores (one for a K % 64 == 32 tail). "row" reads the row twice (amax, then quantize; the second read
hits L1/L2).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

NUM_THREADS = 128
NUM_WARPS = NUM_THREADS // 32
CHUNK = 64  # elements per thread step: four 16-element blocks, one scale word
VEC = 8  # elements per 16-byte load
E2M1_MAX = 6.0
E4M3_MAX = 448.0
MODES = ("row", "given")


def _asm(ret, args, text, constraints):
    return llvm.inline_asm(ret, args, text, constraints, has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """a * b, IEEE round to nearest, subnormals kept (never contracted into an fma)."""
    return Float32(_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                        "mul.rn.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def div_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """a / b, IEEE round to nearest (not the approximate division fast math would pick)."""
    return Float32(_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                        "div.rn.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def e4m3_byte(t: Float32, *, loc=None, ip=None) -> Int32:
    """The e4m3 byte of t (round to nearest even, saturating at +-448), in the low 8 bits."""
    return Int32(_asm(T.i32(), [Float32(t).ir_value(loc=loc, ip=ip)],
                      "{ .reg .b16 p; .reg .f32 z; mov.f32 z, 0f00000000; cvt.rn.satfinite.e4m3x2.f32 p, z, $1; "
                      "cvt.u32.u16 $0, p; }", "=r,f"))


@dsl_user_op
def e4m3_value(byte: Int32, *, loc=None, ip=None) -> Float32:
    """The float32 value of an e4m3 byte (exact: through an f16 pair)."""
    return Float32(_asm(T.f32(), [Int32(byte).ir_value(loc=loc, ip=ip)],
                        "{ .reg .b16 p, lo, hi; .reg .b32 h; cvt.u16.u32 p, $1; cvt.rn.f16x2.e4m3x2 h, p; "
                        "mov.b32 {lo, hi}, h; cvt.f32.f16 $0, lo; }", "=f,r"))


@dsl_user_op
def e2m1_word(v0: Float32, v1: Float32, v2: Float32, v3: Float32, v4: Float32, v5: Float32, v6: Float32,
              v7: Float32, *, loc=None, ip=None) -> Int32:
    """Eight values as e2m1 codes (round to nearest even, saturating at +-6), v_j in bits 4j..4j+3."""
    vs = [Float32(v).ir_value(loc=loc, ip=ip) for v in (v0, v1, v2, v3, v4, v5, v6, v7)]
    # cvt's first source goes to the high nibble
    text = ("{ .reg .b8 b0, b1, b2, b3; cvt.rn.satfinite.e2m1x2.f32 b0, $2, $1; "
            "cvt.rn.satfinite.e2m1x2.f32 b1, $4, $3; "
            "cvt.rn.satfinite.e2m1x2.f32 b2, $6, $5; cvt.rn.satfinite.e2m1x2.f32 b3, $8, $7; "
            "mov.b32 $0, {b0, b1, b2, b3}; }")
    return Int32(_asm(T.i32(), vs, text, "=r,f,f,f,f,f,f,f,f"))


@cute.jit
def warp_max(x: Float32) -> Float32:
    for offset in cutlass.range_constexpr(5):
        x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=16 >> offset, mask=-1, mask_and_clamp=31))
    return x


class NVFP4QuantizeActivation:
    """One compiled variant per (x dtype, mode). Call: (mX [M, K] (unit stride on K, 16-byte aligned rows),
    mQ Int32 [M, K / 8] (unit stride), mS Int32 [Mp * Cp / 4] compact, mG Float32 [M] ("row", written) or [1]
    ("given", read), stream). M, K (a multiple of 32) and Mp are runtime values."""

    def __init__(self, dtype, mode: str):
        assert mode in MODES, mode
        self.dtype = dtype
        self.mode = mode

    @cute.jit
    def __call__(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, mG: cute.Tensor, stream):
        col_blocks = (mX.shape[1] + CHUNK - 1) // CHUNK

        @cute.struct
        class SharedStorage:
            sMax: cute.struct.Align[cute.struct.MemRange[Float32, NUM_WARPS], 16]

        self.kernel(mX, mQ, mS, mG, SharedStorage).launch(
            grid=(mS.shape[0] // col_blocks, 1, 1),
            block=(NUM_THREADS, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, mG: cute.Tensor,
               SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        k_len = mX.shape[1]
        col_blocks = (k_len + CHUNK - 1) // CHUNK
        word_base = (row // 128) * col_blocks * 128 + (row % 32) * 4 + (row % 128) // 32

        if row >= mX.shape[0]:
            for cb in range(tidx, col_blocks, NUM_THREADS):
                mS[word_base + cb * 128] = Int32(0)
        else:
            rX = cute.make_rmem_tensor((VEC,), self.dtype)
            xv = cute.make_rmem_tensor((CHUNK,), Float32)
            g = Float32(0.0)
            if const_expr(self.mode == "row"):
                amax = Float32(0.0)
                for cb in range(tidx, col_blocks, NUM_THREADS):
                    self.load_chunk(mX, row, cb, k_len, rX, xv)
                    for j in cutlass.range(CHUNK, unroll_full=True):
                        amax = cute.arch.fmax(amax, cute.arch.fmax(xv[j], -xv[j]))
                amax = warp_max(amax)
                smem = cutlass.memory.SmemAllocator()
                storage = smem.allocate(SharedStorage)
                sMax = storage.sMax.get_tensor(cute.make_layout(NUM_WARPS))
                warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
                if cute.arch.lane_idx() == 0:
                    sMax[warp_idx] = amax
                cute.arch.barrier()
                amax = sMax[0]
                for w in cutlass.range_constexpr(1, NUM_WARPS):
                    amax = cute.arch.fmax(amax, sMax[w])
                g = div_rn(amax, Float32(E2M1_MAX * E4M3_MAX))
                if tidx == 0:
                    mG[row] = g
            else:
                g = mG[0]
            g6 = mul_rn(g, Float32(E2M1_MAX))

            codes = [cute.make_rmem_tensor((4,), Int32) for _ in range(2)]  # the chunk's halves: 32 codes, 4 words each
            for cb in range(tidx, col_blocks, NUM_THREADS):
                self.load_chunk(mX, row, cb, k_len, rX, xv)
                scales = Int32(0)
                for b in cutlass.range_constexpr(CHUNK // 16):
                    bmax = Float32(0.0)
                    for j in cutlass.range_constexpr(16):
                        bmax = cute.arch.fmax(bmax, cute.arch.fmax(xv[16 * b + j], -xv[16 * b + j]))
                    s_byte = Int32(0)
                    if g6 > Float32(0.0):
                        s_byte = e4m3_byte(div_rn(bmax, g6))
                    d = mul_rn(e4m3_value(s_byte), g)
                    r = Float32(0.0)
                    if d > Float32(0.0):
                        r = div_rn(Float32(1.0), d)
                    for w in cutlass.range_constexpr(2):
                        o = 16 * b + 8 * w
                        codes[b // 2][2 * (b % 2) + w] = e2m1_word(
                            mul_rn(xv[o], r), mul_rn(xv[o + 1], r), mul_rn(xv[o + 2], r), mul_rn(xv[o + 3], r),
                            mul_rn(xv[o + 4], r), mul_rn(xv[o + 5], r), mul_rn(xv[o + 6], r), mul_rn(xv[o + 7], r))
                    scales = scales | (s_byte << (8 * b))
                mS[word_base + cb * 128] = scales
                # 16 bytes of codes per half; the second half only where K has it (K % 32 == 0)
                cute.autovec_copy(codes[0], cute.local_tile(mQ[row, None], (4,), (2 * cb,)))
                if cb * CHUNK + CHUNK // 2 < k_len:
                    cute.autovec_copy(codes[1], cute.local_tile(mQ[row, None], (4,), (2 * cb + 1,)))

    @cute.jit
    def load_chunk(self, mX: cute.Tensor, row: Int32, cb: Int32, k_len: Int32, rX: cute.Tensor, xv: cute.Tensor):
        """Elements 64cb..64cb+63 of the row as float32, zeros past K."""
        for v in cutlass.range_constexpr(CHUNK // VEC):
            if cb * CHUNK + v * VEC < k_len:
                cute.autovec_copy(cute.local_tile(mX[row, None], (VEC,), (cb * (CHUNK // VEC) + v,)), rX)
                for j in cutlass.range_constexpr(VEC):
                    xv[v * VEC + j] = Float32(rX[j])
            else:
                for j in cutlass.range_constexpr(VEC):
                    xv[v * VEC + j] = Float32(0.0)
