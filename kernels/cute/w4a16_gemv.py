"""Weight-only decode GEMV for Hopper (sm_90a) in CuTe DSL, on CUDA cores: out[M, N] = x[M, K] @ dequant(W)[N, K]^T for
M = 1..4 (a compile-time count), x float16 / bfloat16, W NVFP4 or int8, fp32 products and sums, output in x's dtype.
An alternative to `w4a16_decode_gemm.py` (tensor cores, one big CTA a SM) for the smallest M: many small CTAs, each
lane streaming 16-byte pieces of weight rows, no split-K kernel.

Operands (the same as `w4a16_decode_gemm.py` takes, `w4a16_decode.py` hands them over; K padded to whole 32-byte
chunks, so a row is a whole number of 16-byte pieces):
- mX Int32 [M, Kp / 2]: x, two 16-bit values a word.
- nvfp4: mW Int32 [N, Kp / 8] (code i of a word in bits 4i..4i+3), mBlock Int32 [N, Kp / 64] (block 4c + b in
  byte b of word c), mScale Float32 [1], the global scale.
- int8: mW Int32 [N, Kp / 4], mScale [N] Float32 / BFloat16 / Float16, mBias [N] in x's dtype or None.

Work split. A piece is 16 bytes of a row: 32 NVFP4 codes (two blocks) or 16 int8 codes. A CTA is WARPS_N x WARPS_K
warps (NUM_WARPS unless `warps` says); a warp owns ROWS consecutive rows and takes every WARPS_K-th 32-piece step of
them: lane L of K warp wk reads piece (WARPS_K s + wk) * 32 + L of each of its rows (split: of its CTA's run of steps),
so a warp's loads of one row are 512 contiguous bytes,
and x's matching 16-byte pieces, converted to fp32 once for the warp's ROWS rows. Each lane adds its products in
fp32; the lanes' sums meet by butterfly shuffles, the K warps' through shared memory, in a fixed order.

Decode, exact (emulated bit for bit by `w4a16_decode.decode_nvfp4_gemv` / `decode_int8_gemv`):
- NVFP4: pair (code j, code j + 4) of a word as `w4a16_decode_gemm`'s bf16 decode makes it (one shift, one shift of
  the word's sign bits, one lop3: e2m1 * 2^-126 in bf16), times the block scale splat e4m3 * 2^119 in one packed
  bf16 fma: e2m1 * e4m3 * 2^-7, normal and exact; its two halves are fp32 values as they are (the high one
  masked, the low one shifted up). The epilogue multiplies by 2^7 * the global scale. This bf16 decode serves f16
  x too (the products are fp32).
- int8: byte b of the word XOR 0x80 under 0x4B00_00 (one prmt) is the fp32 2^23 + 128 + int8(b); minus
  2^23 + 128 (exact) gives int8(b). The per-channel scale and the bias are applied in the epilogue.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass._mlir.dialects import llvm

from .w4a16_decode_gemm import (MINUS_ZERO, _asm, _i32, _struct, and_bits, decode_exponent, fma_x2,
                                nvfp4_magnitude_field, nvfp4_shifts, nvfp4_sign_mask, prmt, select_bits, shift)

FORMATS = ("nvfp4", "int8")
MAX_M = 4
NUM_WARPS = 4
CTA_WARPS = (4, 8, 16)  # `warps` a CTA can have (more warps share the integer GEMV's x planes)
SPLITS = (1, 2, 4, 8)  # CTAs of a cluster that split a row group's K (8: the portable cluster size)
PIECE_WORDS = 4  # 16 bytes
CODES_PER_PIECE = {"nvfp4": 32, "int8": 16}
INT8_HIGH = 0x4B000000
INT8_SELECTORS = tuple(0x7540 | j for j in range(4))  # byte j of the word, then 0x00, 0x00, 0x4B
INT8_FLIP = 0x80808080
INT8_OFFSET = float(2 ** 23 + 128)
SPLAT_EXPONENT = 119  # the bf16 block scale splat is e4m3 * 2^119
SPLAT_F32 = f"0f{(SPLAT_EXPONENT + 127) << 23:08X}"  # 2^119 as a PTX fp32 literal
HIGH_HALF = 0xFFFF0000


@dsl_user_op
def as_f32(a: Int32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [_i32(a, loc, ip)], "mov.b32 $0, $1;", "=f,r"))


@dsl_user_op
def as_i32(a: Float32, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [Float32(a).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,f"))


@dsl_user_op
def halves_f32(word: Int32, is_f16: bool, *, loc=None, ip=None):
    """The two 16-bit floats of `word` (low first) as fp32, exactly."""
    if is_f16:
        text = "{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, $2;\ncvt.f32.f16 $0, lo;\ncvt.f32.f16 $1, hi;\n}"
    else:
        text = f"{{\nshl.b32 $0, $2, 16;\nand.b32 $1, $2, 0x{HIGH_HALF:08X};\n}}"
    res = _asm(_struct(2, "f32"), [_i32(word, loc, ip)], text, "=f,=f,r")
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(2)]


E4M3_PAIR_TO_F32 = ("mov.b32 {{lo, hi}}, {word};\n"
                    "cvt.rn.f16x2.e4m3x2 h01, lo;\n"
                    "mov.b32 {{f0, f1}}, h01;\n"
                    "cvt.f32.f16 {s0}, f0;\ncvt.f32.f16 {s1}, f1;\n")
"""PTX that turns the e4m3 bytes 0 and 1 of `word` into fp32 s0, s1, exactly (e4m3 -> f16 -> f32); it needs the .b16
registers lo, hi, f0, f1 and the .b32 h01."""


@dsl_user_op
def e4m3_pair_f32(word: Int32, *, loc=None, ip=None):
    """The e4m3 bytes 0 and 1 of `word` as fp32, exactly."""
    text = ("{\n.reg .b16 lo, hi, f0, f1;\n.reg .b32 h01;\n" + E4M3_PAIR_TO_F32.format(word="$2", s0="$0", s1="$1")
            + "}")
    res = _asm(_struct(2, "f32"), [_i32(word, loc, ip)], text, "=f,=f,r")
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(2)]


@dsl_user_op
def block_splats(word: Int32, *, loc=None, ip=None):
    """The e4m3 bytes 0 and 1 of `word` as bf16 splat pairs (S, S), S = e4m3 * 2^119, exact (e4m3 -> f16 -> f32 is
    exact, the power of two too, and S has e4m3's 4 significant bits)."""
    text = ("{\n.reg .b16 lo, hi, f0, f1;\n.reg .b32 h01;\n.reg .f32 s0, s1;\n"
            + E4M3_PAIR_TO_F32.format(word="$2", s0="s0", s1="s1") +
            f"mul.rn.f32 s0, s0, {SPLAT_F32};\nmul.rn.f32 s1, s1, {SPLAT_F32};\n"
            "cvt.rn.bf16x2.f32 $0, s0, s0;\ncvt.rn.bf16x2.f32 $1, s1, s1;\n}")
    res = _asm(_struct(2, "i32"), [_i32(word, loc, ip)], text, "=r,=r,r")
    return [Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(2)]


@dsl_user_op
def store_cluster_f32(address: Int32, cta: Int32, value: Float32, *, loc=None, ip=None):
    """Store `value` at this CTA's shared address `address` in the shared memory of CTA `cta` of the cluster."""
    llvm.inline_asm(
        None, [_i32(address, loc, ip), _i32(cta, loc, ip), Float32(value).ir_value(loc=loc, ip=ip)],
        "{\n.reg .u32 remote;\nmapa.shared::cluster.u32 remote, $0, $1;\nst.shared::cluster.f32 [remote], $2;\n}",
        "r,r,f", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def fma_f32(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c)]
    return Float32(_asm(T.f32(), args, "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f"))


@dsl_user_op
def sub_f32(a: Float32, b: float, *, loc=None, ip=None) -> Float32:
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b)]
    return Float32(_asm(T.f32(), args, "sub.rn.f32 $0, $1, $2;", "=f,f,f"))


def shared_struct(**fields):
    """A `cute.struct` of 16-byte-aligned arrays, each field (element type, count)."""
    return cute.struct(type("SharedStorage", (), {"__annotations__": {
        name: cute.struct.Align[cute.struct.MemRange[dtype, count], 16] for name, (dtype, count) in fields.items()}}))


class W4A16Gemv:
    """One compiled variant per (x dtype, format, M, bias or not, ROWS rows a warp, WARPS_K warps along K, PDL or
    not, `min_ctas`: > 1 caps the registers so that this many CTAs fit a SM, `splits`, `warps` a CTA); N, K and
    strides are runtime values.

    splits: > 1 splits each row group's K among that many CTAs, a cluster: CTA c of it takes the c-th run of whole
    steps (`start`), and its sums go into the shared memory of CTA 0 of the cluster, which adds them up in a fixed
    order and stores (`add_up_and_store`). No workspace, no second kernel: for weights of few rows, whose row groups
    alone leave the SMs short of warps.

    pdl: launched as a programmatic dependent; each lane loads its first weight piece, then waits for the kernel
    before it (`griddepcontrol.wait`) before any other load, then lets the next one be scheduled.

    Call: (mX, mW, mBlock (nvfp4) or None, mScale, mBias [N] or None, mOut [M, N] (unit stride on N), stream)."""

    def __init__(self, dtype, fmt: str, m: int, has_bias: bool, rows: int, warps_k: int, pdl: bool = False,
                 min_ctas: int = 0, splits: int = 1, warps: int = NUM_WARPS):
        assert fmt in FORMATS and 1 <= m <= MAX_M and rows >= 1 and warps % warps_k == 0, (fmt, m, rows, warps_k)
        assert splits in SPLITS and warps in CTA_WARPS, (splits, warps)
        assert not (has_bias and fmt == "nvfp4"), "NVFP4 weights have no bias here"
        self.dtype = dtype
        self.is_f16 = dtype == cutlass.Float16
        self.fmt = fmt
        self.m = m
        self.has_bias = has_bias
        self.rows = rows
        self.warps_k = warps_k
        self.num_warps = warps
        self.warps_n = warps // warps_k
        self.pdl = pdl
        self.min_ctas = min_ctas
        self.splits = splits
        self.out_rows = rows  # output rows a warp (a gated GEMV's warp reads two weights' rows for each)
        self.gated = False

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], mScale: cute.Tensor,
                 mBias: Optional[cute.Tensor], mOut: cute.Tensor, stream):
        SharedStorage = self.shared_storage()
        self.launch(self.kernel(mX, mW, mBlock, mScale, mBias, mOut, SharedStorage), mW.shape[0],
                    SharedStorage.size_in_bytes(), stream)

    def shared_storage(self):
        """The CTA's shared memory (a struct made here, outside traced code, where this module's annotations would
        stay strings): the K warps' sums."""
        return shared_struct(**self.sums_fields())

    def sums_fields(self) -> dict:
        """Shared memory for the sums: the K warps' (sRed); split, the cluster's CTAs' (sSplit, read in CTA 0's)."""
        fields = {"sRed": (Float32, self.num_warps * self.rows * self.m)}
        if self.splits > 1:
            fields["sSplit"] = (Float32, self.splits * self.warps_n * self.rows * self.m)
        return fields

    def ctas(self, mW: cute.Tensor):
        """The CTAs that cover mW's rows."""
        rows_per_cta = self.out_rows * self.warps_n
        return (mW.shape[0] + rows_per_cta - 1) // rows_per_cta

    def launch_over(self, kernel, weights, smem_bytes: int, stream):
        """Launch `kernel` on each of `weights`' CTAs in turn (the grid `each_weight` reads)."""
        ctas = self.ctas(weights[0])
        for mW in weights[1:]:
            ctas = ctas + self.ctas(mW)
        self.launch(kernel, ctas * self.rows * self.warps_n, smem_bytes, stream)

    @cute.jit
    def each_weight(self, storage, mX: cute.Tensor, weights, bx):
        """`rows_of` for CTA bx of a grid that covers 2 or 3 weights' CTAs in turn: `weights` their operand tuples
        (each `rows_of`'s after mX, its weight first)."""
        first1 = self.ctas(weights[0][0])
        if bx < first1:
            self.rows_of(storage, mX, *weights[0], bx)
        else:
            if const_expr(len(weights) == 2):
                self.rows_of(storage, mX, *weights[1], bx - first1)
            else:
                first2 = first1 + self.ctas(weights[1][0])
                if bx < first2:
                    self.rows_of(storage, mX, *weights[1], bx - first1)
                else:
                    self.rows_of(storage, mX, *weights[2], bx - first2)

    def launch(self, kernel, n_rows, smem_bytes: int, stream):
        """Launch `kernel` (a traced kernel call) on the CTAs that cover n_rows output rows."""
        rows_per_cta = self.out_rows * self.warps_n
        kernel.launch(
            grid=((n_rows + rows_per_cta - 1) // rows_per_cta * self.splits, 1, 1),
            block=(32 * self.num_warps, 1, 1),
            cluster=[self.splits, 1, 1] if self.splits > 1 else None,
            smem=smem_bytes,
            stream=stream,
            use_pdl=self.pdl,
            min_blocks_per_mp=self.min_ctas,
            preferred_smem_carveout=100 if self.min_ctas > 1 else None,  # also spares the DSL a device query
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], mScale: cute.Tensor,
               mBias: Optional[cute.Tensor], mOut: cute.Tensor, SharedStorage: cutlass.Constexpr):
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        self.rows_of(storage, mX, mW, mBlock, mScale, mBias, mOut)

    @cute.jit
    def rows_of(self, storage, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], mScale: cute.Tensor,
                mBias: Optional[cute.Tensor], mOut: cute.Tensor, bx=None):
        """The CTA's rows of mW (its bx-th CTA; default: its block index) into mOut."""
        R, M = self.rows, self.m
        acc = cute.make_rmem_tensor((R * M,), Float32)
        acc.fill(0.0)
        rW = cute.make_rmem_tensor((PIECE_WORDS, R), Int32)
        rS = cute.make_rmem_tensor((R,), Int32)
        rX = cute.make_rmem_tensor((PIECE_WORDS, M), Int32)
        lane, wn, wk, row0, n_rows, begin, end, first, stride = self.start(mW, mBlock, rW, rS, bx)
        for p in cutlass.range(first, end, stride, unroll=1):
            if const_expr(self.fmt == "nvfp4"):
                self.nvfp4_piece(mX, rW, rS, rX, acc, p)
            else:
                self.int8_piece(mX, rW, rX, acc, p)
            if p + stride < end:
                self.load_piece(mW, mBlock, rW, rS, row0, n_rows, p + stride)
        self.add_up_and_store(acc, storage, lane, wn, wk, row0, n_rows, mScale, mBias, mOut)

    @cute.jit
    def start(self, mW: cute.Tensor, mBlock: Optional[cute.Tensor], rW: cute.Tensor, rS: cute.Tensor, bx=None):
        """The warp's place (lane, wn, wk, first row, N, the CTA's pieces begin..end of each row, the warp's first
        piece, its piece stride), with its first piece loaded and, with PDL, the wait for the kernel before done.
        `bx`: the CTA's index among mW's CTAs (default: its block index; split: its cluster's). Split, the CTA has
        announced itself to its cluster (`add_up_and_store` waits for all of it before writing into CTA 0). Gated,
        mW and mBlock are pairs of one shape (the first row is an output row)."""
        split = Int32(0)
        if const_expr(bx is None):
            bx, _, _ = cute.arch.block_idx()
            if const_expr(self.splits > 1):
                split = cute.arch.block_idx_in_cluster()
                bx = bx // self.splits
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        wn = warp_idx % self.warps_n
        wk = warp_idx // self.warps_n
        w = mW[0] if const_expr(self.gated) else mW
        n_rows = w.shape[0]
        row0 = (bx * self.warps_n + wn) * self.out_rows
        pieces = w.shape[1] // PIECE_WORDS
        stride = 32 * self.warps_k
        begin = Int32(0)
        end = pieces
        if const_expr(self.splits > 1):
            run = (pieces + self.splits * stride - 1) // (self.splits * stride) * stride  # whole steps a split
            begin = cutlass.min(split * run, pieces)
            end = cutlass.min(begin + run, pieces)
            cute.arch.cluster_arrive_relaxed()
        first = begin + wk * 32 + lane
        if first < end:
            self.load_piece(mW, mBlock, rW, rS, row0, n_rows, first)
        if const_expr(self.pdl):
            # Before the wait only the primary may still run, and it writes activations, never quantized weights or
            # their block scales (as in `w4a16_decode_gemm`): the first weight loads go out before it; x after.
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        return lane, wn, wk, row0, n_rows, begin, end, first, stride

    @cute.jit
    def add_up_and_store(self, acc: cute.Tensor, storage, lane: Int32, wn: Int32, wk: Int32, row0: Int32,
                         n_rows: Int32, mScale: cute.Tensor, mBias: Optional[cute.Tensor], mOut: cute.Tensor):
        """The lanes, then the K warps (through sRed: a float a warp, row and row of x, in shared memory), add up; warp
        wk = 0's lanes store (r, m) = divmod(lane, M). Split, those lanes write their sums into CTA 0's sSplit (slot
        of their CTA); after the cluster's barrier CTA 0 adds the slots up in order and stores."""
        R, M = self.rows, self.m
        for i in cutlass.range_constexpr(R * M):
            acc[i] = cute.arch.warp_reduction_sum(acc[i])
        sRed = storage.sRed.get_tensor(cute.make_layout((R * M, self.warps_n, self.warps_k)))
        if lane == 0:
            for i in cutlass.range_constexpr(R * M):
                sRed[i, wn, wk] = acc[i]
        cute.arch.barrier()
        total = Float32(0.0)
        if wk == 0:
            if lane < R * M:
                total = sRed[lane, wn, 0]
                for s in cutlass.range_constexpr(1, self.warps_k):
                    total = total + sRed[lane, wn, s]
        n = row0 + lane // M
        m = lane % M
        if const_expr(self.splits == 1):
            if wk == 0:
                if const_expr(self.gated):
                    up = cute.arch.shuffle_sync(total, lane + self.out_rows * M)  # row r + ROWS / 2: up's row r
                    if lane < self.out_rows * M and n < n_rows:
                        self.store_gated(total, up, mScale, mOut, n, m)
                else:
                    if lane < R * M and n < n_rows:
                        self.store(total, mScale, mBias, mOut, n, m)
        else:
            sSplit = storage.sSplit.get_tensor(cute.make_layout((R * M, self.warps_n, self.splits)))
            split = cute.arch.block_idx_in_cluster()
            cute.arch.cluster_wait()  # every CTA of the cluster has started: CTA 0's shared memory is there
            if wk == 0:
                if lane < R * M:
                    slot = sSplit.iterator.toint() + cute.crd2idx((lane, wn, split), sSplit.layout) * 4
                    store_cluster_f32(slot, Int32(0), total)
            cute.arch.cluster_arrive()  # release: the writes above, before CTA 0 reads them
            cute.arch.cluster_wait()
            if split == 0:
                if wk == 0:
                    if lane < R * M and n < n_rows:
                        total = sSplit[lane, wn, 0]
                        for c in cutlass.range_constexpr(1, self.splits):
                            total = total + sSplit[lane, wn, c]
                        self.store(total, mScale, mBias, mOut, n, m)

    @cute.jit
    def load_piece(self, mW: cute.Tensor, mBlock: Optional[cute.Tensor], rW: cute.Tensor, rS: cute.Tensor, row0: Int32,
                   n_rows: Int32, p: Int32):
        """Piece p of the warp's rows (past N: row N - 1, dropped) and, NVFP4, their two block scales in the low 16
        bits of rS."""
        for r in cutlass.range_constexpr(self.rows):
            n = cutlass.min(row0 + r, n_rows - 1)
            cute.autovec_copy(cute.local_tile(mW[n, None], (PIECE_WORDS,), (p,)), rW[None, r])
            if const_expr(self.fmt == "nvfp4"):
                rS[r] = mBlock[n, p >> 1] >> ((p & 1) * 16)

    @cute.jit
    def load_x(self, mX: cute.Tensor, rX: cute.Tensor, q: Int32):
        """x's 16-byte piece q (words 4q..4q+3) of each of the M rows."""
        for m in cutlass.range_constexpr(self.m):
            cute.autovec_copy(cute.local_tile(mX[m, None], (PIECE_WORDS,), (q,)), rX[None, m])

    @cute.jit
    def nvfp4_piece(self, mX: cute.Tensor, rW: cute.Tensor, rS: cute.Tensor, rX: cute.Tensor, acc: cute.Tensor,
                    p: Int32):
        """Word i of the piece: codes 8i..8i+7, block i // 2, x piece 4p + i (k = 32p + 8i + j: x word 4i + j // 2,
        half j % 2)."""
        R, M = self.rows, self.m
        mag = nvfp4_magnitude_field(False)
        splats = [block_splats(rS[r]) for r in range(R)]
        for i in cutlass.range_constexpr(PIECE_WORDS):
            self.load_x(mX, rX, 4 * p + i)
            xf = [[halves_f32(rX[q, m], self.is_f16) for q in range(PIECE_WORDS)] for m in range(M)]
            for r in cutlass.range_constexpr(R):
                word = rW[i, r]
                parity = [and_bits(word, nvfp4_sign_mask(j, False)) for j in range(2)]
                for j in cutlass.range_constexpr(4):
                    mshift, sshift = nvfp4_shifts(j, False)
                    bits = select_bits(shift(word, mshift), shift(parity[j % 2], sshift), mag)
                    pair = fma_x2(bits, splats[r][i // 2], MINUS_ZERO, False)
                    w_lo, w_hi = halves_f32(pair, False)
                    for m in cutlass.range_constexpr(M):
                        a = r * M + m
                        acc[a] = fma_f32(xf[m][j // 2][j % 2], w_lo, acc[a])
                        acc[a] = fma_f32(xf[m][(j + 4) // 2][j % 2], w_hi, acc[a])

    @cute.jit
    def int8_piece(self, mX: cute.Tensor, rW: cute.Tensor, rX: cute.Tensor, acc: cute.Tensor, p: Int32):
        """Word i of the piece: codes 4i..4i+3 (k = 16p + 4i + j: x piece 2p + i // 2, word 2 (i % 2) + j // 2,
        half j % 2)."""
        R, M = self.rows, self.m
        for h in cutlass.range_constexpr(2):
            self.load_x(mX, rX, 2 * p + h)
            xf = [[halves_f32(rX[q, m], self.is_f16) for q in range(PIECE_WORDS)] for m in range(M)]
            for r in cutlass.range_constexpr(R):
                for ii in cutlass.range_constexpr(2):
                    flipped = rW[2 * h + ii, r] ^ Int32(INT8_FLIP - (1 << 32))
                    for j in cutlass.range_constexpr(4):
                        w = sub_f32(as_f32(prmt(flipped, Int32(INT8_HIGH), INT8_SELECTORS[j])), INT8_OFFSET)
                        for m in cutlass.range_constexpr(M):
                            a = r * M + m
                            acc[a] = fma_f32(xf[m][2 * ii + j // 2][j % 2], w, acc[a])

    @cute.jit
    def store(self, total: Float32, mScale: cute.Tensor, mBias: Optional[cute.Tensor], mOut: cute.Tensor, n: Int32,
              m: Int32):
        y = total
        if const_expr(self.fmt == "nvfp4"):
            y = total * (mScale[0] * Float32(float(2 ** decode_exponent(False))))
        else:
            y = total * mScale[n].to(Float32)
        if const_expr(self.has_bias):
            y = y + Float32(mBias[n])
        mOut[m, n] = y.to(self.dtype)


class W4A16GemvSiblings(W4A16Gemv):
    """`W4A16Gemv` over 2 or 3 int8 weights (per-channel scales, no bias) that multiply the same x, in one launch:
    the grid is each weight's CTAs in turn (`each_weight`), as `nvfp4_int_gemv.NVFP4IntGemvSiblings` does for NVFP4.

    Call: (mX, then (mW, mScale, mOut) of weights 0, 1 and 2, stream), each as `W4A16Gemv` takes it, all of one K and
    one scale dtype; with `weights` = 2 the third is not read (pass the second again)."""

    def __init__(self, dtype, weights: int, m: int, rows: int, warps_k: int, pdl: bool = False, min_ctas: int = 0):
        assert weights in (2, 3), weights
        super().__init__(dtype, "int8", m, False, rows, warps_k, pdl, min_ctas)
        self.weights = weights

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW0: cute.Tensor, mScale0: cute.Tensor, mOut0: cute.Tensor, mW1: cute.Tensor,
                 mScale1: cute.Tensor, mOut1: cute.Tensor, mW2: cute.Tensor, mScale2: cute.Tensor, mOut2: cute.Tensor,
                 stream):
        SharedStorage = self.shared_storage()
        self.launch_over(self.kernel(mX, mW0, mScale0, mOut0, mW1, mScale1, mOut1, mW2, mScale2, mOut2, SharedStorage),
                         [mW0, mW1, mW2][:self.weights], SharedStorage.size_in_bytes(), stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW0: cute.Tensor, mScale0: cute.Tensor, mOut0: cute.Tensor, mW1: cute.Tensor,
               mScale1: cute.Tensor, mOut1: cute.Tensor, mW2: cute.Tensor, mScale2: cute.Tensor, mOut2: cute.Tensor,
               SharedStorage: cutlass.Constexpr):
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        bx, _, _ = cute.arch.block_idx()
        weights = [(mW0, None, mScale0, None, mOut0), (mW1, None, mScale1, None, mOut1),
                   (mW2, None, mScale2, None, mOut2)]
        self.each_weight(storage, mX, weights[:self.weights], bx)
