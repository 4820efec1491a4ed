"""Weight-only decode GEMM for Hopper (sm_90a) in CuTe DSL: out[M, N] = x[M, K] @ dequant(W)[N, K]^T for
M <= 16 (decode steps), x float16 / bfloat16, W NVFP4, int8 or fp8 (e4m3). At these M a linear is a weight read: the
kernel streams W once and keeps the per-weight work to a few integer instructions, with the products on
the tensor cores (`mma.sync` m16n8k16; the M rows of x are its n8 columns, so M = 1..8 costs one MMA and
M = 9..16 two per 16 x 16 weight tile).

Operands (as `w4a16_decode.py` hands them over: the checkpoint's row-major bytes read as 32-bit words, K
padded to whole chunks):
- mX Int32 [M, Kp / 2]: x, two 16-bit values a word.
- nvfp4: mW Int32 [N, Kp / 8], eight e2m1 codes a word (code i in bits 4i..4i+3); mBlock Int32 [N, Kp / 64],
  the four e4m3 block scales of a 64-code chunk (block 4c + b in byte b); mScale Float32 [1], the global scale.
- int8: mW Int32 [N, Kp / 4], four int8 codes a word; mScale [N] Float32, BFloat16 or Float16, the per-channel
  scale, widened to fp32 where it is read.
- fp8: mW Int32 [N, Kp / 4], four e4m3 codes a word; mScale [N] or [1] Float32, the weight's scale per channel
  or per tensor; mRowScale [M] or [1] Float32 (x's scale per row or per tensor: `torch._scaled_mm`'s) or None.

Work split. A chunk is 32 bytes of one weight row (64 NVFP4 or 32 int8 codes). A warp owns ROW_TILES tiles
of 16 rows; lane 4g + t loads rows g and g + 8 of each tile, chunk c0 + t of every step (4 chunks of a
row per step: 128 contiguous bytes), and x row m = 8 * group + g over the same chunk. The MMA's k order
is free as long as W and x agree: each lane feeds its own chunk's codes into its k slots (2t, 2t + 1,
2t + 8, 2t + 9), so no lane needs another's data. A CTA is WARPS_N x WARPS_K warps: WARPS_N row groups
(sharing x through L1) times WARPS_K slices of the CTA's K range, added through shared memory at the
end; grid y splits K further (fp32 partials, `w4a16_splitk_reduce.py`).

Load paths (compile time). "registers": each lane loads its next step (weights, block scales, x) straight
into registers, two register sets alternating, one step in flight a warp. "rolling": the same loads, a step
ahead as well, into one register set that is refilled 16 bytes at a time as the step uses it up (x's words
after their last row tile, so the words go word-major), which halves the operand registers. "bulk": one more
warp, the PRODUCER, streams the weight codes through a ring of STAGES stages in shared memory with 1-D bulk copies
(`cp.async.bulk`, one per row segment), up to STAGES stages in flight a CTA. A stage (`BulkStage`) holds the
CTA's rows x one step of every K warp: CTA step j covers chunks cta_begin + 16 j .. + 16 (at WARPS_K = 4)
and K warp wk takes chunks 4 wk + t of it (so a row segment is contiguous: one copy), the last step of the
CTA's range possibly shorter. Per stage a "full" mbarrier (the producer's arrive with the stage's exact byte
count, completed by the copies) and an "empty" one (one arrive per consumer warp once its lanes copied their
bytes to registers). The CONSUMERS (the WARPS_N x WARPS_K warps) wait "full", copy their lane's 32 bytes a
row to the same registers the register path fills, arrive "empty", then decode and multiply with the same
code; block scales and x are still loaded a step ahead with ordinary loads (4-byte scale words are no bulk
size). `ahead`: a consumer copies stage j + 1 to a second register set before computing step j. `prefetch`
(nvfp4): the producer also prefetches each stage's block-scale rows into L2 (`cp.async.bulk.prefetch`, the
row segment widened to whole 16-byte blocks) before waiting for the stage, so the consumers' scale loads,
issued a step ahead, find them in L2 rather than in HBM. `scales` (nvfp4): the block scales go through the
ring too: the producer's lanes copy the stage's scale words with 4-byte cp.async and make the stage's "full"
mbarrier wait for them (`cp.async.mbarrier.arrive.noinc`), and the consumers read them from the stage with
its codes (no global scale loads left in the consumers). "xsmem" (CTAs of one K warp: every warp takes the CTA's
whole K range): the CTA first copies its range of x's rows into shared memory (`XSmemLayout`, 16-byte cp.async, once),
then each warp streams its weights through `sets` register sets (loads issued sets - 1 steps ahead) and takes x's MMA
operands from shared memory, 16 bytes a lane and group as the words need them: no register set of x (64 words a step
at 16 rows on the register path), and x read from L2 once a CTA instead of once a warp. `x_permute` (plain NVFP4): the
CTA rewrites that copy once into the MMAs' operand order (`permute_x`), so the K loop builds no x operand with prmt.

Decode, exact (checked bit for bit by the CPU tests' emulation, `w4a16_decode.decode_nvfp4_words` and
`decode_int8_words`):
- NVFP4 pair (code j, code j + 4) of a word -> one bf16x2 (f16x2) register: the magnitude bits land on
  the 16-bit format's low exponent bits and top mantissa bit with one shift of the word (both codes at
  once: they are 16 bits apart), the signs with one shift of the word's sign bits, one lop3 merges them:
  e2m1 * 2^-126 (bf16; 0.5 is a subnormal) or e2m1 * 2^-14 (f16). One packed multiply by the block
  scale splat S = e4m3 * 2^119 (bf16) or e4m3 * 2^5 (f16) gives e2m1 * e4m3 * 2^-7 (2^-9): normal and
  exact (at most 6 significant bits). The epilogue multiplies by 2^7 (2^9) * global scale. `rotate_signs`: every
  pair's sign shift is its magnitude shift plus one constant, so one rotation of the word lines up all four pairs'
  signs, and a pair is one lop3 (the word's magnitude bits against the rotated, masked signs) and one shift, or a
  rotation where a sign wrapped (`nvfp4_rotated_pair`): two instructions a word fewer, the same bits.
- NVFP4, packed (`pack`; weights prepared once by `w4a16_decode.pack_nvfp4`): the 8 codes of a word are placed
  so that pair P of the word is codes (2P, 2P + 1), the two k slots of one x word (x goes to the MMA as it is
  loaded, no prmt), and pairs 0 and 1 need one shift (or none) and one lop3 for
  magnitude and sign together, pairs 2 and 3 a masked magnitude shift merged with a shift that brings the sign
  (`PACK_PAIRS`): 11 integer instructions a word instead of 13 (bf16) / 15 (f16). The block scales are
  re-encoded once too: a block's byte b = (E' << 3) | m with |e4m3| = (1 + m / 8) 2^(E' - 9) (its sign folded
  into the block's code signs, a zero scale's codes zeroed, NaN kept as NaN), so the splat S is one prmt and
  one mad: (b << 4) + 0x7680 in each half is e4m3 * 2^119 (bf16), (b << 7) + 0x2C00 is e4m3 * 2^5 (f16), the
  same multipliers as the plain decode.
- int8 pair (codes 2p, 2p + 1): bf16: one prmt puts the bytes under a 0x43 high byte; (0x43 | b & 0x7F)
  - (0x43 | b & 0x80), in bf16, is 128 + (b & 0x7F) - (128 or 256) = int8(b), exact. f16: 1024 + (b ^ 0x80)
  - 1152. The per-channel scale and the bias are applied in the epilogue, in fp32.
- fp8 pair (codes 2p, 2p + 1): one cvt e4m3x2 -> f16x2, exact for every code, NaN included; bf16 x takes the
  two halves through fp32 into one bf16x2 (exact: e4m3 has 4 significant bits and bf16's range). The scales
  and the bias are applied in the epilogue, in fp32.
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .cp_async import bulk_copy_g2s, cp_async, prefetch_l2_span, prefetch_line_l2

FORMATS = ("nvfp4", "int8", "fp8")
LOADS = ("registers", "bulk", "rolling", "xsmem")
CHUNK_WORDS = 8  # 32 bytes of one weight row per lane per step
CHUNK_BYTES = 4 * CHUNK_WORDS
CODES_PER_CHUNK = {"nvfp4": 64, "int8": 32, "fp8": 32}
BYTE_FORMATS = ("int8", "fp8")  # a code a byte, scales in the epilogue
LANES_K = 4  # lanes sharing a row (t = lane % 4); each takes its own chunk
TILE_ROWS = 16
MAX_GROUPS = 2  # 8 x rows each: M <= 16
CAPPED_SMEM_CARVEOUT = 10  # percent of the SM's shared memory: two CTAs' K-slice buffers (<= 14 KB) fit


class BulkStage:
    """One stage of the bulk load path's ring: `rows` weight rows (the CTA's) x `chunks` 32-byte chunks
    (one step of every K warp), row r at r * pitch bytes. A consumer lane 4g + t reads 16 bytes at a time
    from rows g and g + 8 of a tile at chunk t: 8 lanes a shared-memory wavefront, two rows at four chunks.
    A pitch that is a multiple of 128 bytes puts both rows on the same banks (2-way conflict); 16 bytes
    more shifts row g + 1 by four banks, so the 8 lanes cover the 32 banks once.

    With `scales`, the rows' block-scale words follow (one a chunk), row r at scale_pitch * r words; a warp's
    4-byte reads (rows g, chunks t) start row g on bank 4 * (g * scale_pitch / 4 mod 8): all 8 rows apart when
    scale_pitch / 4 is odd."""

    PAD = 16

    def __init__(self, rows: int, warps_k: int, scales: bool = False):
        self.rows = rows
        self.chunks = warps_k * LANES_K
        self.pitch = self.chunks * CHUNK_BYTES + self.PAD
        self.scales_at = rows * self.pitch
        self.scale_pitch = self.chunks + (4 if self.chunks // 4 % 2 == 0 else 8)
        self.bytes = self.scales_at + (rows * self.scale_pitch * 4 if scales else 0)

    def offset(self, row: int, chunk: int, half: int) -> int:
        """Bytes from the stage's start of 16-byte half `half` of chunk `chunk` of row `row`."""
        return row * self.pitch + chunk * CHUNK_BYTES + 16 * half

    def scale_offset(self, row: int, chunk: int) -> int:
        """Bytes from the stage's start of the block-scale word of chunk `chunk` of row `row` (`scales`)."""
        return self.scales_at + (row * self.scale_pitch + chunk) * 4


class XSmemLayout:
    """x's copy in shared memory on the "xsmem" load path: the CTA's K range of x's rows (8 a group), row m at
    m * pitch words, chunk c of the range at c * chunk_words in it (x's words of the chunk, then 4 words of padding).
    A lane 4 g + t reads 16 bytes of row g at its chunk t (of a step); the padding puts the four chunks of a step 16
    bytes apart in the banks, and a pitch of 16 words more than a multiple of 32 puts rows g and g + 1 on the other
    16 banks, so each 8-lane phase of a 16-byte read covers the 32 banks once."""

    @staticmethod
    def chunk_words(x_words: int) -> int:
        return x_words + 4

    @staticmethod
    def pitch(steps: int, x_words: int) -> int:
        words = steps * LANES_K * XSmemLayout.chunk_words(x_words)
        return words + (16 - words) % 32

    @staticmethod
    def bytes(steps: int, x_words: int, groups: int) -> int:
        return 4 * 8 * groups * XSmemLayout.pitch(steps, x_words)


def register_x(rX):
    """`word_products`' x words from a register set [word, group]."""
    return lambda w, gi: rX[w, gi]


def reduction_words(row_tiles: int, groups: int, warps_n: int, warps_k: int) -> int:
    """Float32 words of the K-slice reduction buffer: the accumulators of every K warp but the first."""
    return max(1, (warps_k - 1) * warps_n * row_tiles * groups * 4 * 32)


def bulk_smem_bytes(stage: BulkStage, stages: int, red_words: int) -> int:
    """Shared memory of a bulk variant: the ring, the K-slice reduction buffer (apart: no stage is reused for
    it) and two mbarriers a stage, with the struct's alignment padding."""
    ring = stages * stage.bytes
    red = -(-4 * red_words // 16) * 16
    return -(-(ring + red) // 8) * 8 + 16 * stages


def decode_exponent(is_f16: bool) -> int:
    """E with the kernel's NVFP4 weights = e2m1 * e4m3 * 2^-E."""
    return 9 if is_f16 else 7


def _asm(ret, args, text, constraints):
    return llvm.inline_asm(ret, args, text, constraints, has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


def _i32(v, loc, ip):
    return Int32(v).ir_value(loc=loc, ip=ip)


@dsl_user_op
def prmt(a: Int32, b: Int32, selector: int, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(selector, loc, ip)],
                      "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r"))


@dsl_user_op
def select_bits(a: Int32, b: Int32, mask: int, *, loc=None, ip=None) -> Int32:
    """(a & mask) | (b & ~mask) as one lop3."""
    mask = _signed(mask)
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(mask, loc, ip)],
                      "lop3.b32 $0, $1, $2, $3, 0xE4;", "=r,r,r,r"))


@dsl_user_op
def rotate_bits(a: Int32, s: int, *, loc=None, ip=None) -> Int32:
    """a rotated left by s bits (right for s < 0): one funnel shift with wrap."""
    return Int32(_asm(T.i32(), [_i32(a, loc, ip)], f"shf.l.wrap.b32 $0, $1, $1, {s % 32};", "=r,r"))


@dsl_user_op
def and_bits(a: Int32, mask: int, *, loc=None, ip=None) -> Int32:
    """a & mask, opaque to LLVM (it would otherwise move masks across shifts, one instruction more)."""
    mask = _signed(mask)
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(mask, loc, ip)], "and.b32 $0, $1, $2;", "=r,r,r"))


def _signed(v):
    return v - (1 << 32) if isinstance(v, int) and v >= 1 << 31 else v


@dsl_user_op
def fma_x2(a, b, c, is_f16: bool, *, loc=None, ip=None) -> Int32:
    """a * b + c on two 16-bit floats a register (each a register or a constant bit pattern), rounded to
    nearest."""
    a, b, c = _signed(a), _signed(b), _signed(c)
    op = "fma.rn.f16x2" if is_f16 else "fma.rn.bf16x2"
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(c, loc, ip)],
                      f"{op} $0, $1, $2, $3;", "=r,r,r,r"))


def _struct(n: int, elem: str):
    return ir.Type.parse(f"!llvm.struct<({', '.join([elem] * n)})>")


def e4m3_word_to_f32(word: str) -> str:
    """PTX opening a scope in which f32 registers s0..s3 hold the four e4m3 bytes of operand `word` (exact: e4m3
    -> f16 -> f32); the caller's instructions and its closing brace follow."""
    return ("{\n.reg .b16 lo, hi, f0, f1, f2, f3;\n.reg .b32 h01, h23;\n.reg .f32 s0, s1, s2, s3;\n"
            f"mov.b32 {{lo, hi}}, {word};\n"
            "cvt.rn.f16x2.e4m3x2 h01, lo;\ncvt.rn.f16x2.e4m3x2 h23, hi;\n"
            "mov.b32 {f0, f1}, h01;\nmov.b32 {f2, f3}, h23;\n"
            "cvt.f32.f16 s0, f0;\ncvt.f32.f16 s1, f1;\ncvt.f32.f16 s2, f2;\ncvt.f32.f16 s3, f3;\n")


@dsl_user_op
def e4m3_splats(word: Int32, is_f16: bool, *, loc=None, ip=None):
    """The four e4m3 bytes of `word` as four splat 16-bit float pairs (S, S): e4m3 * 2^5 (f16) or
    e4m3 * 2^119 (bf16), exact (cvt e4m3x2 -> f16x2 is exact for every e4m3 value)."""
    if is_f16:
        text = ("{\n.reg .b16 lo, hi;\n.reg .b32 h01, h23, k;\n"
                "mov.b32 {lo, hi}, $4;\n"
                "cvt.rn.f16x2.e4m3x2 h01, lo;\ncvt.rn.f16x2.e4m3x2 h23, hi;\n"
                "mov.b32 k, 0x50005000;\n"
                "mul.rn.f16x2 h01, h01, k;\nmul.rn.f16x2 h23, h23, k;\n"
                "prmt.b32 $0, h01, h01, 0x1010;\nprmt.b32 $1, h01, h01, 0x3232;\n"
                "prmt.b32 $2, h23, h23, 0x1010;\nprmt.b32 $3, h23, h23, 0x3232;\n}")
    else:
        text = (e4m3_word_to_f32("$4") +
                "mul.rn.f32 s0, s0, 0f7B000000;\nmul.rn.f32 s1, s1, 0f7B000000;\n"
                "mul.rn.f32 s2, s2, 0f7B000000;\nmul.rn.f32 s3, s3, 0f7B000000;\n"
                "cvt.rn.bf16x2.f32 $0, s0, s0;\ncvt.rn.bf16x2.f32 $1, s1, s1;\n"
                "cvt.rn.bf16x2.f32 $2, s2, s2;\ncvt.rn.bf16x2.f32 $3, s3, s3;\n}")
    res = _asm(_struct(4, "i32"), [_i32(word, loc, ip)], text, "=r,=r,=r,=r,r")
    return [Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def e4m3_pairs(word: Int32, is_f16: bool, *, loc=None, ip=None):
    """The e4m3 codes (0, 1) and (2, 3) of `word` as two 16-bit float pairs, code 2p in the low half: exact."""
    if is_f16:
        text = ("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, $2;\n"
                "cvt.rn.f16x2.e4m3x2 $0, lo;\ncvt.rn.f16x2.e4m3x2 $1, hi;\n}")
    else:
        text = (e4m3_word_to_f32("$2") +
                "cvt.rn.bf16x2.f32 $0, s1, s0;\ncvt.rn.bf16x2.f32 $1, s3, s2;\n}")
    res = _asm(_struct(2, "i32"), [_i32(word, loc, ip)], text, "=r,=r,r")
    return [Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(2)]


@dsl_user_op
def mma_16816(a0: Int32, a1: Int32, a2: Int32, a3: Int32, b0: Int32, b1: Int32,
              c0: Float32, c1: Float32, c2: Float32, c3: Float32, is_f16: bool, *, loc=None, ip=None):
    """D = A @ B + C for one m16n8k16 tile, fp32 accumulate (PTX fragment layouts)."""
    kind = "f16.f16" if is_f16 else "bf16.bf16"
    text = (f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.f32 "
            "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")
    args = [_i32(v, loc, ip) for v in (a0, a1, a2, a3, b0, b1)]
    args += [Float32(v).ir_value(loc=loc, ip=ip) for v in (c0, c1, c2, c3)]
    res = _asm(_struct(4, "f32"), args, text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_shared_x4(addr: Int32, *, loc=None, ip=None):
    """The four words at shared address `addr` (16-byte aligned)."""
    res = llvm.inline_asm(_struct(4, "i32"), [_i32(addr, loc, ip)], "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];",
                          "=r,=r,=r,=r,r", has_side_effects=True, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT)
    return [Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def st_shared_x4(addr: Int32, w0: Int32, w1: Int32, w2: Int32, w3: Int32, *, loc=None, ip=None):
    """Store four words at shared address `addr` (16-byte aligned)."""
    llvm.inline_asm(None, [_i32(v, loc, ip) for v in (addr, w0, w1, w2, w3)],
                    "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


# ---- the decode, as constants the CPU emulation shares ----

def nvfp4_shifts(j: int, is_f16: bool) -> tuple[int, int]:
    """(magnitude shift, sign shift) of pair (j, j + 4); a positive shift is to the left."""
    return (9 if is_f16 else 6) - 4 * j, 12 - 4 * j


def nvfp4_sign_mask(j: int, is_f16: bool) -> int:
    """The sign bits the pair's sign shift reads. bf16: every code of j's parity (the others land inside
    the magnitude field, which the merge takes from the magnitude shift); f16: codes j and j + 4 only."""
    return (0x00080008 << 4 * j) if is_f16 else (0x08080808 if j % 2 == 0 else 0x80808080)


def nvfp4_magnitude_field(is_f16: bool) -> int:
    return 0x0E000E00 if is_f16 else 0x01C001C0


def nvfp4_sign_rotation(is_f16: bool) -> int:
    """The "rotated" decode (`rotate_signs`): every pair's sign shift less its magnitude shift, one rotation of the
    word a word: the pair's bits are then one lop3 of the word and the rotated signs and one shift (or rotation)."""
    (rotation,) = {nvfp4_shifts(j, is_f16)[1] - nvfp4_shifts(j, is_f16)[0] for j in range(4)}
    return rotation


def rotl32(v, s: int):
    """v (an int or an int64 tensor of uint32 words) rotated left by s bits (right for s < 0)."""
    s %= 32
    return v if s == 0 else ((v << s) | (v >> (32 - s))) & 0xFFFFFFFF


def nvfp4_rotated_pair(j: int, is_f16: bool) -> tuple[int, int, int]:
    """The rotated decode of pair (j, j + 4): (the rotated word's sign mask, the lop3's select mask (bits taken from
    the word), the final shift: a left shift if positive, else a rotation right). Left shifts lose no bit that the
    result keeps; right ones must wrap (the word's rotation carried the top code's sign past bit 31)."""
    mshift, _ = nvfp4_shifts(j, is_f16)
    rot = nvfp4_sign_rotation(is_f16)
    return rotl32(nvfp4_sign_mask(j, is_f16), rot), rotl32(nvfp4_magnitude_field(is_f16), -mshift), mshift


INT8_SELECTORS = (0x4140, 0x4342)  # bytes (0, 1) / (2, 3) of the word under the constant's bytes
INT8_BF16_HIGH = 0x43434343
INT8_F16_HIGH = 0x64646464
INT8_F16_BIAS = 0xE480E480  # -1152, twice
BF16_MINUS_ONE = 0xBF80BF80
F16_ONE = 0x3C003C00
MINUS_ZERO = 0x80008000
X_PAIR_SELECTORS = (0x5410, 0x7632)  # (x_j, x_j+4) from words (x_j-ish, x_j+4-ish): low or high halves
PERMUTED_X = ((0, 2, 0), (0, 2, 1), (1, 3, 0), (1, 3, 1))  # "+xperm": block word i = prmt(word a, word b, selector s)


@cute.jit
def shift(w: Int32, s: cutlass.Constexpr[int]) -> Int32:
    out = w
    if const_expr(s > 0):
        out = w << s
    elif const_expr(s < 0):
        out = w >> (-s)
    return out


# ---- the packed NVFP4 decode (`pack`), as constants the prepack and the CPU emulation share ----

PACK_PAIRS = {  # x is f16 -> (magnitude shift, sign shift) of pairs 0..3; equal shifts: one shifted copy
    False: ((0, 0), (3, 3), (6, 2), (-3, 1)),
    True: ((9, 9), (1, 1), (-2, 0), (6, 8)),
}
SIGN_FIELD = 0x80008000
PACK_SCALE_SPLAT = {False: (16, 0x76807680), True: (128, 0x2C002C00)}  # (multiplier, addend) of the mad
PACK_SCALE_SELECTORS = (0x4040, 0x4141, 0x4242, 0x4343)  # byte b of the scale word in both low bytes


def pack_positions(pair: int, is_f16: bool) -> tuple[int, int, int, int]:
    """Bit positions in a packed word of the low code of pair `pair` (its bits 0, 1, 2 (magnitude) and 3
    (sign)); the high code's are 16 higher."""
    mshift, sshift = PACK_PAIRS[is_f16][pair]
    low = 9 if is_f16 else 6  # the magnitude field's lowest bit in the 16-bit format
    return low - mshift, low + 1 - mshift, low + 2 - mshift, 15 - sshift


@dsl_user_op
def mad_lo(a: Int32, b: int, c: int, *, loc=None, ip=None) -> Int32:
    """a * b + c (low 32 bits), b and c constants."""
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(_signed(b), loc, ip), _i32(_signed(c), loc, ip)],
                      "mad.lo.u32 $0, $1, $2, $3;", "=r,r,r,r"))


@cute.jit
def packed_pair_bits(w: Int32, pair: cutlass.Constexpr[int], is_f16: cutlass.Constexpr[bool]) -> Int32:
    """Pair `pair` of a packed word as a 16-bit float pair: e2m1 * 2^-126 (bf16) or 2^-14 (f16)."""
    mshift, sshift = PACK_PAIRS[is_f16][pair]
    mag = nvfp4_magnitude_field(is_f16)
    out = w
    if const_expr(mshift == sshift):
        out = and_bits(shift(w, mshift), mag | SIGN_FIELD)
    else:
        out = select_bits(and_bits(shift(w, mshift), mag), shift(w, sshift), ~SIGN_FIELD & 0xFFFFFFFF)
    return out


class W4A16DecodeGemm:
    """One compiled variant per (x dtype, format, x row groups `groups` (M <= 8 * groups), split or not, bias
    or not, row tiles per warp, CTA shape WARPS_N x WARPS_K, load path: "registers", "rolling" (registers capped
    for `min_ctas` CTAs a SM, or not), or "bulk" with a ring of `stages` stages and the options `ahead`,
    `prefetch`, `scales`; PDL or not; NVFP4 packed or not); N, K, M, strides and the split count are runtime
    values.

    pdl: launched as a programmatic dependent (Hopper PDL). When the kernel before it in the stream is another
    of these GEMMs (q, k, v or gate, up: one x, one after the other), its CTAs may start while that one drains and
    load their first weights before `griddepcontrol.wait` (the register path's first two steps; the bulk path's
    producer copies); it lets the next kernel be scheduled once past its own wait.

    Call: (mX, mW, mBlock (nvfp4) or None, mScale, mBias [N] or None, mOut [M, N] (unit stride on N) or None
    when split, mPart [splits, M, N] fp32 or None when not split, mRowScale (fp8) or None, stream)."""

    def __init__(self, dtype, fmt: str, groups: int, split: bool, has_bias: bool, row_tiles: int,
                 warps_n: int, warps_k: int, load: str = "registers", stages: int = 0, ahead: bool = False,
                 prefetch: bool = False, scales: bool = False, pdl: bool = False, pack: bool = False,
                 tiled: bool = False, min_ctas: int = 0, x_steps: int = 0, sets: int = 2, l2_burst: int = 0,
                 x_parts: int = 1, x_permute: bool = False, rotate_signs: bool = False):
        assert fmt in FORMATS and 1 <= groups <= MAX_GROUPS and row_tiles >= 1, (fmt, groups, row_tiles)
        assert (x_steps >= 1) == (load == "xsmem") and (load != "xsmem" or warps_k == 1 and sets >= 2 and not tiled), (
            load, x_steps, warps_k, sets, tiled)
        assert load in LOADS and (stages >= 1) == (load == "bulk") and (
            load == "bulk" or not (ahead or prefetch or scales)), (load, stages, ahead, prefetch, scales)
        self.dtype = dtype
        self.is_f16 = dtype == cutlass.Float16
        self.fmt = fmt
        self.groups = groups
        self.split = split
        self.has_bias = has_bias
        self.row_tiles = row_tiles
        self.warps_n = warps_n
        self.warps_k = warps_k
        self.x_words = CODES_PER_CHUNK[fmt] // 2
        self.acc_size = row_tiles * groups * 4
        self.load = load
        self.stages = stages
        self.ahead = ahead
        self.prefetch = prefetch and fmt == "nvfp4"
        self.ring_scales = scales and fmt == "nvfp4"
        self.stage = BulkStage(TILE_ROWS * row_tiles * warps_n, warps_k, self.ring_scales)
        self.pdl = pdl
        assert not pack or fmt == "nvfp4", fmt
        assert not tiled or (pack and load != "bulk"), (tiled, pack, load)
        self.pack = pack
        self.tiled = tiled
        assert min_ctas <= 1 or load in ("rolling", "xsmem"), (min_ctas, load)
        self.min_ctas = min_ctas  # > 1: registers capped so that this many CTAs fit a SM (nvvm.minctasm)
        self.x_steps = x_steps  # xsmem: the CTA's K range, in steps, that x's shared copy holds
        self.sets = sets  # xsmem: register sets of weight operands, each loaded sets - 1 steps ahead of its use
        assert l2_burst == 0 or load == "xsmem" and l2_burst % sets == 0, (l2_burst, load, sets)
        self.l2_burst = l2_burst  # xsmem: steps of the lane's rows prefetched into L2 at once, past the register sets'
        assert x_parts == 1 or load == "xsmem" and x_parts >= 2, (x_parts, load)
        self.x_parts = x_parts  # xsmem: x's copy lands in this many parts, each waited for by its own mbarrier
        assert not x_permute or load == "xsmem" and x_parts == 1, (x_permute, load, x_parts)
        # xsmem, plain NVFP4: x's copy rewritten once into the MMA's operand pairs (`permute_x`)
        self.x_permuted = x_permute and fmt == "nvfp4" and not pack
        # plain NVFP4: each pair's sign bits from one rotation of the word (`nvfp4_rotated_pair`), two instructions a
        # word fewer
        self.rotate_signs = rotate_signs and fmt == "nvfp4" and not pack
        per_part = -(-max(x_steps, 1) // x_parts)
        self.part_steps = -(-per_part // sets) * sets  # whole K-loop iterations a part
        self.x_pitch = XSmemLayout.pitch(x_steps, self.x_words)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], mScale: cute.Tensor,
                 mBias: Optional[cute.Tensor], mOut: Optional[cute.Tensor], mPart: Optional[cute.Tensor],
                 mRowScale: Optional[cute.Tensor], stream):
        rows_per_cta = TILE_ROWS * self.row_tiles * self.warps_n
        num_splits = 1
        if const_expr(self.split):
            num_splits = mPart.shape[0]
        red_words = reduction_words(self.row_tiles, self.groups, self.warps_n, self.warps_k)
        threads = 32 * self.warps_n * self.warps_k

        if const_expr(self.load == "bulk"):
            threads += 32  # the producer warp
            ring_words = self.stages * self.stage.bytes // 4

            @cute.struct
            class SharedStorage:
                ring: cute.struct.Align[cute.struct.MemRange[Int32, ring_words], 128]
                sRed: cute.struct.Align[cute.struct.MemRange[Float32, red_words], 16]
                full: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, self.stages], 8]
                empty: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, self.stages], 8]
        elif const_expr(self.load == "xsmem"):
            x_words = XSmemLayout.bytes(self.x_steps, self.x_words, self.groups) // 4

            @cute.struct
            class SharedStorage:
                sX: cute.struct.Align[cute.struct.MemRange[Int32, x_words], 128]
                sRed: cute.struct.Align[cute.struct.MemRange[Float32, red_words], 16]
                x_landed: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, self.x_parts], 8]
        else:

            @cute.struct
            class SharedStorage:
                sRed: cute.struct.Align[cute.struct.MemRange[Float32, red_words], 16]

        n_rows = mBlock.shape[0] if const_expr(self.tiled) else mW.shape[0]
        self.kernel(mX, mW, mBlock, mScale, mBias, mOut, mPart, mRowScale, SharedStorage).launch(
            grid=((n_rows + rows_per_cta - 1) // rows_per_cta, num_splits, 1),
            block=(threads, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            use_pdl=self.pdl,
            min_blocks_per_mp=self.min_ctas,
            # a preference (which spares the DSL a device query) that leaves L1 most of the SM's memory where x is
            # shared through L1, all of it to shared memory where x is copied there; the driver still gives shared
            # memory for min_ctas CTAs
            preferred_smem_carveout=(None if self.min_ctas <= 1 else 100 if self.load == "xsmem" else
                                     CAPPED_SMEM_CARVEOUT),
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], mScale: cute.Tensor,
               mBias: Optional[cute.Tensor], mOut: Optional[cute.Tensor], mPart: Optional[cute.Tensor],
               mRowScale: Optional[cute.Tensor], SharedStorage: cutlass.Constexpr):
        RT = self.row_tiles
        bx, split_idx, _ = cute.arch.block_idx()
        _, num_splits, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        g = lane // LANES_K
        t = lane % LANES_K
        wn = warp_idx % self.warps_n
        wk = warp_idx // self.warps_n
        n_rows = mW.shape[0]
        if const_expr(self.tiled):
            n_rows = mBlock.shape[0]
        m_rows = mX.shape[0]
        row0 = (bx * self.warps_n + wn) * (TILE_ROWS * RT)

        chunks = mW.shape[1] // CHUNK_WORDS
        if const_expr(self.tiled):
            chunks = mBlock.shape[1]
        cta_begin = split_idx * chunks // num_splits
        cta_chunks = (split_idx + 1) * chunks // num_splits - cta_begin
        c_begin = cta_begin + wk * cta_chunks // self.warps_k
        c_end = cta_begin + (wk + 1) * cta_chunks // self.warps_k

        acc = cute.make_rmem_tensor((self.acc_size,), Float32)
        acc.fill(0.0)
        if const_expr(self.load == "bulk"):
            self.bulk_kernel(mX, mW, mBlock, mScale, mBias, mOut, mPart, mRowScale, SharedStorage, acc, bx,
                             split_idx, warp_idx, row0, n_rows, m_rows, cta_begin, cta_begin + cta_chunks)
        else:
            storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
            if const_expr(self.load == "xsmem"):
                self.xsmem_loop(mX, mW, mBlock, storage, acc, row0, n_rows, m_rows, c_begin, c_end)
            elif const_expr(self.load == "rolling"):
                self.rolling_loop(mX, mW, mBlock, acc, row0, n_rows, m_rows, c_begin, c_end)
            else:
                self.register_loop(mX, mW, mBlock, acc, row0, n_rows, m_rows, c_begin, c_end)

            # ---- the CTA's K slices add up through shared memory ----
            self.add_k_slices_and_store(storage, acc, mScale, mRowScale, mBias, mOut, mPart, row0, n_rows, m_rows,
                                        split_idx, lane, g, t, wn, wk, False)

    @cute.jit
    def register_loop(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], acc: cute.Tensor,
                      row0: Int32, n_rows: Int32, m_rows: Int32, c_begin: Int32, c_end: Int32):
        """The "registers" load path's K loop over the warp's chunks c_begin..c_end: two register sets of
        operands (weights [word, row (tile, half)], block scales, x [word, group]), alternating; a step's loads
        are issued as soon as its set is free, a step ahead of their use."""
        t = cute.arch.lane_idx() % LANES_K
        RT = self.row_tiles
        rW = [cute.make_rmem_tensor((CHUNK_WORDS, 2 * RT), Int32) for _ in range(2)]
        rS = [cute.make_rmem_tensor((2 * RT,), Int32) for _ in range(2)]
        rX = [cute.make_rmem_tensor((self.x_words, self.groups), Int32) for _ in range(2)]
        rA = cute.make_rmem_tensor((4,), Int32)

        self.first_loads(mX, mW, mBlock, rW, rS, rX, row0, n_rows, m_rows, c_begin, c_end)
        for c0 in range(c_begin, c_end, 2 * LANES_K):
            for b in cutlass.range_constexpr(2):
                if c0 + LANES_K * b < c_end:
                    self.step(rW[b], rS[b], rX[b], rA, acc)
                    self.load_step(mX, mW, mBlock, rW[b], rS[b], rX[b], row0, n_rows, m_rows,
                                   c0 + LANES_K * (b + 2) + t, c_end)

    @cute.jit
    def first_loads(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], rW: list, rS: list,
                    rX: list, row0: Int32, n_rows: Int32, m_rows: Int32, c_begin: Int32, c_end: Int32):
        """The first step into each register set b (chunk c_begin + LANES_K b + t) before the K loop.
        With PDL: before the wait only the primary may still run, and every kernel that lets dependents start
        early (these GEMMs, past their own wait; FA4, decode attention) writes activations, never quantized
        weights or block scales: their first loads go out before the wait. x may be the primary's output."""
        t = cute.arch.lane_idx() % LANES_K
        sets = len(rW)
        if const_expr(self.pdl):
            for b in cutlass.range_constexpr(sets):
                self.load_step(None, mW, mBlock, rW[b], rS[b], rX[b], row0, n_rows, m_rows,
                               c_begin + LANES_K * b + t, c_end)
            self.dependent_wait()
            for b in cutlass.range_constexpr(sets):
                self.load_step(mX, None, None, None, rS[b], rX[b], row0, n_rows, m_rows,
                               c_begin + LANES_K * b + t, c_end)
        else:
            for b in cutlass.range_constexpr(sets):
                self.load_step(mX, mW, mBlock, rW[b], rS[b], rX[b], row0, n_rows, m_rows,
                               c_begin + LANES_K * b + t, c_end)

    @cute.jit
    def xsmem_loop(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], storage, acc: cute.Tensor,
                   row0: Int32, n_rows: Int32, m_rows: Int32, c_begin: Int32, c_end: Int32):
        """The "xsmem" load path (one K warp a CTA: every warp takes the CTA's whole K range): the CTA copies its
        range of x into shared memory once (`stage_x`), then each warp streams its weights through `sets` register
        sets, each step's loads issued sets - 1 steps ahead of its use, and takes x's MMA operands from shared
        memory as it needs them (no register set of x). With `x_parts` > 1 the copy lands in parts of `part_steps`
        steps, each completing its own mbarrier (`x_landed`), and a warp waits for a part only when its K loop reaches
        it: the first MMAs wait for the first part alone, not for the whole range."""
        lane = cute.arch.lane_idx()
        t = lane % LANES_K
        RT = self.row_tiles
        rW = [cute.make_rmem_tensor((CHUNK_WORDS, 2 * RT), Int32) for _ in range(self.sets)]
        rS = [cute.make_rmem_tensor((2 * RT,), Int32) for _ in range(self.sets)]
        rA = cute.make_rmem_tensor((4,), Int32)
        x_landed = storage.x_landed.data_ptr()
        if const_expr(self.x_parts > 1):
            if cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0:
                if lane == 0:
                    for p in cutlass.range_constexpr(self.x_parts):
                        cute.arch.mbarrier_init(x_landed + p, 32 * self.warps_n)  # every thread's copies
                    cute.arch.mbarrier_init_fence()
            cute.arch.barrier()
        for b in cutlass.range_constexpr(self.sets):
            self.load_step(None, mW, mBlock, rW[b], rS[b], None, row0, n_rows, m_rows, c_begin + LANES_K * b + t,
                           c_end)
        if const_expr(self.pdl):
            self.dependent_wait()  # the weights' first loads may precede it (`first_loads`); x may not
        base = storage.sX.data_ptr().toint()
        self.stage_x(mX, base, m_rows, c_begin, c_end, x_landed)
        if const_expr(self.x_parts == 1):
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
        if const_expr(self.x_permuted):
            self.permute_x(base, c_begin, c_end)
            cute.arch.barrier()
        chunk_words = XSmemLayout.chunk_words(self.x_words)
        lane_addr = base + 4 * ((lane // LANES_K) * self.x_pitch + t * chunk_words)
        step_words = LANES_K * chunk_words
        burst_rows = self.burst_rows(mW, mBlock, row0, n_rows) if const_expr(self.l2_burst) else []
        for c0 in range(c_begin, c_end, self.sets * LANES_K):
            step0 = (c0 - c_begin) // LANES_K  # the CTA range's step of register set 0
            if const_expr(self.x_parts > 1):
                if step0 % self.part_steps == 0:
                    cute.arch.mbarrier_wait(x_landed + step0 // self.part_steps, 0)
            if const_expr(self.l2_burst):
                if step0 % self.l2_burst == 0:
                    self.prefetch_burst(burst_rows, c0 + LANES_K * self.sets, c_end)
            for b in cutlass.range_constexpr(self.sets):
                if c0 + LANES_K * b < c_end:
                    self.shared_x_step(rW[b], rS[b], rA, acc, lane_addr + 4 * step_words * (step0 + b))
                    self.load_step(None, mW, mBlock, rW[b], rS[b], None, row0, n_rows, m_rows,
                                   c0 + LANES_K * (b + self.sets) + t, c_end)

    def row_addresses(self, mW: cute.Tensor, mBlock: Optional[cute.Tensor], n: Int32) -> tuple:
        """Weight row n's chunk 0 as (its weights' global address, its block scales' or None)."""
        n = cutlass.Int64(n)
        scales = None
        if mBlock is not None:
            scales = mBlock.iterator.toint() + n * (cutlass.Int64(mBlock.layout.stride[0]) * 4)
        return mW.iterator.toint() + n * (cutlass.Int64(mW.layout.stride[0]) * 4), scales

    def burst_rows(self, mW: cute.Tensor, mBlock: Optional[cute.Tensor], row0: Int32, n_rows: Int32) -> list:
        """The rows whose L2 bursts the lane asks for (`prefetch_burst`), as (weights' address, block scales' address or
        None) at chunk 0: lane t takes the lane group's rows r = t, t + 4, ... (mod 2 x row_tiles: with fewer than four
        rows two lanes ask for the same lines)."""
        t = cute.arch.lane_idx() % LANES_K
        return [self.row_addresses(mW, mBlock, self.weight_row(row0, (t + LANES_K * i) % (2 * self.row_tiles), n_rows))
                for i in range((2 * self.row_tiles + LANES_K - 1) // LANES_K)]

    @cute.jit
    def prefetch_burst(self, rows: list, c: Int32, c_end: Int32):
        """L2 prefetch of `l2_burst` steps from chunk c (the step after those the register sets hold: the K loop asks
        every `l2_burst` steps) of the lane's `burst_rows`: one 128-byte line a step (the step's four chunks), and
        the line of block-scale words that holds the burst's (NVFP4; 16 bytes a step). Requested together, a row's
        lines reach DRAM as one run, where the loads a step ahead each ask for 128 bytes of 2 x row_tiles x 8 rows
        a weight row apart. Nothing past c_end."""
        for weights, scales in rows:
            for j in cutlass.range_constexpr(self.l2_burst):
                if c + LANES_K * j < c_end:
                    prefetch_line_l2(weights + cutlass.Int64(c + LANES_K * j) * CHUNK_BYTES)
            if const_expr(scales is not None):
                prefetch_line_l2(scales + cutlass.Int64(cutlass.min(c, c_end - 1)) * 4)

    @cute.jit
    def stage_x(self, mX: cute.Tensor, base: Int32, m_rows: Int32, c_begin: Int32, c_end: Int32, x_landed):
        """16-byte cp.async of x's rows (8 a group) over chunks c_begin .. c_end into `XSmemLayout` at shared address
        `base`: thread i copies piece i % pieces of chunks i // pieces, + threads / pieces, ... of every row (a warp's
        lanes: consecutive pieces of consecutive chunks); zeros past M and past the range, up to the step's end.
        Part by part (`x_parts`): each part's copies, then the thread's arrive on the part's mbarrier in `x_landed`
        (one part: no arrive). Not waited for."""
        pieces = self.x_words // 4  # a chunk's 16-byte pieces
        threads = 32 * self.warps_n
        tid = cute.arch.make_warp_uniform(cute.arch.warp_idx()) * 32 + cute.arch.lane_idx()
        e = tid % pieces
        chunk_words = XSmemLayout.chunk_words(self.x_words)
        cta_chunks = c_end - c_begin
        row_bytes = cutlass.Int64(mX.layout.stride[0]) * 4
        x_at = mX.iterator.toint() + cutlass.Int64(c_begin * pieces + e) * 16
        padded_chunks = self.staged_chunks(c_begin, c_end)
        part_chunks = padded_chunks
        if const_expr(self.x_parts > 1):
            part_chunks = LANES_K * self.part_steps
        for p in cutlass.range_constexpr(self.x_parts):
            for cc in range(p * part_chunks + tid // pieces, cutlass.min((p + 1) * part_chunks, padded_chunks),
                            threads // pieces):
                src = x_at + cutlass.Int64(cutlass.min(cc, cta_chunks - 1) * pieces) * 16
                dst = base + 4 * (cc * chunk_words + 4 * e)
                size = Int32(0)
                if cc < cta_chunks:
                    size = Int32(16)
                for m in cutlass.range_constexpr(8 * self.groups):
                    row_size = size
                    if m >= m_rows:
                        row_size = Int32(0)
                    cp_async(dst + 4 * m * self.x_pitch, src + cutlass.Int64(cutlass.min(m, m_rows - 1)) * row_bytes,
                             16, row_size)
            if const_expr(self.x_parts > 1):
                cute.arch.cp_async_mbarrier_arrive_noinc(x_landed + p)

    def staged_chunks(self, c_begin: Int32, c_end: Int32) -> Int32:
        """The chunks of x's shared copy `stage_x` fills for the CTA range c_begin .. c_end: up to the step's end."""
        return (c_end - c_begin + LANES_K - 1) // LANES_K * LANES_K

    @cute.jit
    def permute_x(self, base: Int32, c_begin: Int32, c_end: Int32):
        """x's shared copy (`stage_x`'s chunks c_begin .. c_end, up to the step's end, every row) rewritten once, each
        16-byte block (w0, w1, w2, w3) as (prmt(w0, w2, lo), prmt(w0, w2, hi), prmt(w1, w3, lo), prmt(w1, w3, hi)):
        the x operands of the plain NVFP4 word's two MMAs (its pairs (j, j + 4) against k slots 2t, 2t + 1, 2t + 8,
        2t + 9), which `word_products` then takes as they are loaded instead of building them with two prmt a
        MMA in every warp. Thread i takes blocks i, i + threads, ... of the range, rows one after the other."""
        blocks = self.x_words // 4
        chunk_words = XSmemLayout.chunk_words(self.x_words)
        per_row = self.staged_chunks(c_begin, c_end) * blocks
        tid = cute.arch.make_warp_uniform(cute.arch.warp_idx()) * 32 + cute.arch.lane_idx()
        for i in range(tid, 8 * self.groups * per_row, 32 * self.warps_n):
            m = i // per_row
            cc = (i - m * per_row) // blocks
            blk = i - m * per_row - cc * blocks
            addr = base + 4 * (m * self.x_pitch + cc * chunk_words + 4 * blk)
            w = ld_shared_x4(addr)
            st_shared_x4(addr, *[prmt(w[a], w[b], X_PAIR_SELECTORS[sel]) for a, b, sel in PERMUTED_X])

    @cute.jit
    def shared_x_step(self, rW: cute.Tensor, rS: cute.Tensor, rA: cute.Tensor, acc: cute.Tensor, step_addr: Int32):
        """One step of the lane's chunk with x from shared memory (`step_addr`: the lane's chunk of x's row g in the
        step): for each 4-word block of x (an NVFP4 word's, two int8 / fp8 words'), one 16-byte shared load a group,
        then the words that read it over every row tile."""
        splats = [self.row_splats(rS, rt) for rt in range(self.row_tiles)]
        words_per_block = 1 if self.fmt == "nvfp4" else 2
        for blk in cutlass.range_constexpr(CHUNK_WORDS // words_per_block):
            frags = [ld_shared_x4(step_addr + 4 * (8 * gi * self.x_pitch + 4 * blk)) for gi in range(self.groups)]
            x_word = lambda w, gi, blk=blk, frags=frags: frags[gi][w - 4 * blk]  # noqa: E731
            for i in cutlass.range_constexpr(words_per_block * blk, words_per_block * (blk + 1)):
                for rt in cutlass.range_constexpr(self.row_tiles):
                    self.word_products(rW, splats[rt], x_word, rA, acc, rt, i)

    @cute.jit
    def rolling_loop(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], acc: cute.Tensor,
                     row0: Int32, n_rows: Int32, m_rows: Int32, c_begin: Int32, c_end: Int32):
        """The "rolling" load path's K loop: one register set, refilled piece by piece for the next step as
        the step uses it up: the block scales once their multipliers are made, each 16-byte piece of the
        weights and of x right after the words that read it. Every load is still issued a step ahead of its
        use, as on the register path, with half its operand registers (x's 64 words a step at M = 16).
        The words go word-major over the row tiles, so that x's words are free after their last tile."""
        t = cute.arch.lane_idx() % LANES_K
        RT = self.row_tiles
        x_per_word = self.x_words // CHUNK_WORDS
        rW = cute.make_rmem_tensor((CHUNK_WORDS, 2 * RT), Int32)
        rS = cute.make_rmem_tensor((2 * RT,), Int32)
        rX = cute.make_rmem_tensor((self.x_words, self.groups), Int32)
        rA = cute.make_rmem_tensor((4,), Int32)

        self.first_loads(mX, mW, mBlock, [rW], [rS], [rX], row0, n_rows, m_rows, c_begin, c_end)
        for c0 in range(c_begin, c_end, LANES_K):
            c_next = c0 + LANES_K + t
            splats = [self.row_splats(rS, rt) for rt in range(RT)]
            if const_expr(mBlock is not None):
                self.load_step(None, None, mBlock, None, rS, rX, row0, n_rows, m_rows, c_next, c_end)
            for i in cutlass.range_constexpr(CHUNK_WORDS):
                for rt in cutlass.range_constexpr(RT):
                    self.word_products(rW, splats[rt], register_x(rX), rA, acc, rt, i)
                if const_expr(i % 4 == 3):
                    self.load_weight_piece(mW, mBlock, rW, row0, n_rows, c_next, c_end, i // 4)
                if const_expr((i + 1) * x_per_word % 4 == 0):
                    self.load_x_piece(mX, rX, m_rows, c_next, c_end, (i + 1) * x_per_word // 4 - 1)

    @cute.jit
    def bulk_kernel(self, mX: cute.Tensor, mW: cute.Tensor, mBlock: Optional[cute.Tensor], mScale: cute.Tensor,
                    mBias: Optional[cute.Tensor], mOut: Optional[cute.Tensor], mPart: Optional[cute.Tensor],
                    mRowScale: Optional[cute.Tensor], SharedStorage: cutlass.Constexpr, acc: cute.Tensor, bx: Int32,
                    split_idx: Int32, warp_idx: Int32,
                    row0: Int32, n_rows: Int32, m_rows: Int32, cta_begin: Int32, cta_end: Int32):
        """The bulk load path: the ring's barriers, the producer warp, the consumer warps' K loop, the K slices'
        reduction and the epilogue."""
        consumers = self.warps_n * self.warps_k
        lane = cute.arch.lane_idx()
        g = lane // LANES_K
        t = lane % LANES_K
        wn = warp_idx % self.warps_n
        wk = warp_idx // self.warps_n
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        full = storage.full.data_ptr()
        empty = storage.empty.data_ptr()
        if warp_idx == consumers:
            if lane == 0:
                for s in cutlass.range_constexpr(self.stages):
                    cute.arch.mbarrier_init(full + s, 1 + (32 if self.ring_scales else 0))  # + the scale copiers
                    cute.arch.mbarrier_init(empty + s, consumers)
                cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        n_steps = (cta_end - cta_begin + self.stage.chunks - 1) // self.stage.chunks
        if warp_idx == consumers:
            self.produce(mW, mBlock, storage.ring.data_ptr().toint(), full, empty, bx, cta_begin, cta_end, n_steps,
                         n_rows)
        else:
            if const_expr(self.pdl):
                self.dependent_wait()  # the producer's weight copies may precede it (see `kernel`); x may not
            sPiece = storage.ring.get_tensor(cute.make_layout((4, self.stages * self.stage.bytes // 16), stride=(1, 4)))
            sWord = storage.ring.get_tensor(cute.make_layout((self.stages * self.stage.bytes // 4,)))
            # the lane's first 16 bytes in a stage: row g of its warp's first tile, its chunk of the step
            lane_row = (wn * self.row_tiles) * TILE_ROWS + g
            lane_piece = (self.stage.offset(lane_row, LANES_K * wk + t, 0)) // 16
            lane_word = self.stage.scale_offset(lane_row, LANES_K * wk + t) // 4
            self.consume(mX, mBlock, sPiece, sWord, full, empty, acc, lane_piece, lane_word, row0, n_rows, m_rows,
                         cta_begin + LANES_K * wk + t, cta_end, n_steps)

            self.add_k_slices_and_store(storage, acc, mScale, mRowScale, mBias, mOut, mPart, row0, n_rows, m_rows,
                                        split_idx, lane, g, t, wn, wk, True)

    @cute.jit
    def add_k_slices_and_store(self, storage, acc: cute.Tensor, mScale: cute.Tensor,
                               mRowScale: Optional[cute.Tensor], mBias: Optional[cute.Tensor],
                               mOut: Optional[cute.Tensor], mPart: Optional[cute.Tensor], row0: Int32, n_rows: Int32,
                               m_rows: Int32, split_idx: Int32, lane: Int32, g: Int32, t: Int32, wn: Int32,
                               wk: Int32, consumers_only: cutlass.Constexpr[bool]):
        """The CTA's K slices add up through shared memory into warp wk = 0's accumulators, which it stores;
        `consumers_only`: the barrier spares the bulk path's producer warp (named barrier 1)."""
        if const_expr(self.warps_k > 1):
            sRed = storage.sRed.get_tensor(cute.make_layout((32, self.acc_size, self.warps_n, self.warps_k - 1)))
            if wk > 0:
                for i in cutlass.range_constexpr(self.acc_size):
                    sRed[lane, i, wn, wk - 1] = acc[i]
            if const_expr(consumers_only):
                cute.arch.barrier(barrier_id=1, number_of_threads=32 * self.warps_n * self.warps_k)
            else:
                cute.arch.barrier()
            if wk == 0:
                for s in cutlass.range_constexpr(self.warps_k - 1):
                    for i in cutlass.range_constexpr(self.acc_size):
                        acc[i] = acc[i] + sRed[lane, i, wn, s]
        if wk == 0:
            self.store(acc, mScale, mRowScale, mBias, mOut, mPart, row0, n_rows, m_rows, g, t, split_idx)

    @cute.jit
    def produce(self, mW: cute.Tensor, mBlock: Optional[cute.Tensor], ring: Int32, full: cute.Pointer,
                empty: cute.Pointer, bx: Int32, cta_begin: Int32, cta_end: Int32, n_steps: Int32, n_rows: Int32):
        """The producer warp: step j of the CTA's K range into stage j % stages once its consumers released
        it, one bulk copy a row (lane L copies rows L, L + 32, ...; past N: row N - 1, results dropped); with
        `prefetch`, first the step's block-scale rows into L2."""
        st = self.stage
        lane = cute.arch.lane_idx()
        row_bytes = cutlass.Int64(mW.layout.stride[0]) * 4
        base = mW.iterator.toint()
        first_row = bx * st.rows
        for j in range(n_steps):
            s = j % self.stages
            c = cta_begin + st.chunks * j
            size = cutlass.min(cta_end - c, st.chunks) * CHUNK_BYTES
            if const_expr(self.prefetch):
                self.prefetch_scales(mBlock, first_row, n_rows, c, size // CHUNK_BYTES)
            cute.arch.mbarrier_wait(empty + s, ((j // self.stages) & 1) ^ 1)  # passes at once on a first use
            if lane == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(full + s, size * st.rows)
            cute.arch.sync_warp()
            mbar = (full + s).toint()
            if const_expr(self.ring_scales):
                self.copy_scales(mBlock, ring + s * st.bytes, first_row, n_rows, c, size // CHUNK_BYTES)
                cute.arch.cp_async_mbarrier_arrive_noinc(full + s)
            for i in cutlass.range_constexpr((st.rows + 31) // 32):
                r = lane + 32 * i
                if const_expr(st.rows % 32 == 0):
                    n = cutlass.min(first_row + r, n_rows - 1)
                    src = base + cutlass.Int64(n) * row_bytes + cutlass.Int64(c) * CHUNK_BYTES
                    bulk_copy_g2s(ring + s * st.bytes + r * st.pitch, src, size, mbar)
                else:
                    if r < st.rows:
                        n = cutlass.min(first_row + r, n_rows - 1)
                        src = base + cutlass.Int64(n) * row_bytes + cutlass.Int64(c) * CHUNK_BYTES
                        bulk_copy_g2s(ring + s * st.bytes + r * st.pitch, src, size, mbar)

    @cute.jit
    def copy_scales(self, mBlock: cute.Tensor, stage: Int32, first_row: Int32, n_rows: Int32, c: Int32,
                    n_chunks: Int32):
        """cp.async of block-scale words c .. c + n_chunks of the CTA's rows into the stage at shared address
        `stage` (lane L: word L % chunks of rows L // chunks, + 32 // chunks, ...: each row's words from
        consecutive lanes); words past the range are zero-filled without a read."""
        st = self.stage
        row_bytes = cutlass.Int64(mBlock.layout.stride[0]) * 4
        base = mBlock.iterator.toint()
        lane = cute.arch.lane_idx()
        for i in cutlass.range_constexpr(st.rows * st.chunks // 32):
            r = (lane + 32 * i) // st.chunks
            w = (lane + 32 * i) % st.chunks
            n = cutlass.min(first_row + r, n_rows - 1)
            src = base + cutlass.Int64(n) * row_bytes + cutlass.Int64(c + cutlass.min(w, n_chunks - 1)) * 4
            cp_async(stage + st.scale_offset(r, w), src, 4, 4 * cutlass.max(cutlass.min(n_chunks - w, 1), 0))

    @cute.jit
    def prefetch_scales(self, mBlock: cute.Tensor, first_row: Int32, n_rows: Int32, c: Int32, n_chunks: Int32):
        """L2 prefetch of block-scale words c .. c + n_chunks of the CTA's rows (lane L: rows L, L + 32, ...),
        each widened to the 16-byte blocks it touches (every such block holds a byte of the row's segment, so
        it is mapped memory)."""
        row_bytes = cutlass.Int64(mBlock.layout.stride[0]) * 4
        base = mBlock.iterator.toint()
        lane = cute.arch.lane_idx()
        for i in cutlass.range_constexpr((self.stage.rows + 31) // 32):
            r = lane + 32 * i
            if r < self.stage.rows:
                start = base + cutlass.Int64(cutlass.min(first_row + r, n_rows - 1)) * row_bytes + cutlass.Int64(c) * 4
                prefetch_l2_span(start, cutlass.Int64(n_chunks) * 4)

    @cute.jit
    def consume(self, mX: cute.Tensor, mBlock: Optional[cute.Tensor], sPiece: cute.Tensor, sWord: cute.Tensor,
                full: cute.Pointer, empty: cute.Pointer, acc: cute.Tensor, lane_piece: Int32, lane_word: Int32,
                row0: Int32, n_rows: Int32, m_rows: Int32, c_first: Int32, cta_end: Int32, n_steps: Int32):
        """A consumer warp's K loop over the CTA's steps: the lane's chunk of step j is c_first + chunks * j.
        x (and the block scales, unless `scales`) go to two alternating register sets a step ahead; the weights
        (and with `scales` the block scales) come from the ring into one register set, or two with `ahead`
        (step j + 1's copied out before step j's MMAs)."""
        RT = self.row_tiles
        step = self.stage.chunks
        rW = [cute.make_rmem_tensor((CHUNK_WORDS, 2 * RT), Int32) for _ in range(2 if self.ahead else 1)]
        rS = [cute.make_rmem_tensor((2 * RT,), Int32) for _ in range(2)]
        rX = [cute.make_rmem_tensor((self.x_words, self.groups), Int32) for _ in range(2)]
        rA = cute.make_rmem_tensor((4,), Int32)
        mLoad = self.global_scales(mBlock)
        rs = self.scale_set(len(rW))

        self.load_step(mX, None, mLoad, None, rS[0], rX[0], row0, n_rows, m_rows, c_first, cta_end)
        if const_expr(self.ahead):
            if n_steps > 0:
                self.read_stage(sPiece, sWord, full, empty, rW[0], rS[0], lane_piece, lane_word, 0, c_first, cta_end)
        for j0 in range(0, n_steps, 2):
            for b in cutlass.range_constexpr(2):
                j = j0 + b
                if j < n_steps:
                    w = rW[b % len(rW)]
                    if const_expr(not self.ahead):
                        self.read_stage(sPiece, sWord, full, empty, w, rS[rs(b)], lane_piece, lane_word, j,
                                        c_first + step * j, cta_end)
                    self.load_step(mX, None, mLoad, None, rS[1 - b], rX[1 - b], row0, n_rows, m_rows,
                                   c_first + step * (j + 1), cta_end)
                    if const_expr(self.ahead):
                        if j + 1 < n_steps:
                            self.read_stage(sPiece, sWord, full, empty, rW[1 - b], rS[1 - b], lane_piece, lane_word,
                                            j + 1, c_first + step * (j + 1), cta_end)
                    self.step(w, rS[rs(b)], rX[b], rA, acc)

    def global_scales(self, mBlock):
        """The block-scale tensor the consumers load from global memory a step ahead: none with `scales`."""
        return None if self.ring_scales else mBlock

    def scale_set(self, weight_sets: int):
        """Register set b's step -> its block scales' set: the weights' with `scales`, else x's (b)."""
        return (lambda b: b % weight_sets) if self.ring_scales else (lambda b: b)

    @cute.jit
    def read_stage(self, sPiece: cute.Tensor, sWord: cute.Tensor, full: cute.Pointer, empty: cute.Pointer,
                   rW: cute.Tensor, rS: cute.Tensor, lane_piece: Int32, lane_word: Int32, j: Int32, c: Int32,
                   cta_end: Int32):
        """Wait for step j's stage, copy the lane's chunk c of its rows (g, g + 8 of each tile) to rW with
        16-byte shared loads (with `scales`, their block-scale words to rS; zeros past the range), then release
        the stage (one arrive a warp)."""
        st = self.stage
        s = j % self.stages
        cute.arch.mbarrier_wait(full + s, (j // self.stages) & 1)
        first = lane_piece + s * (st.bytes // 16)
        for r in cutlass.range_constexpr(2 * self.row_tiles):
            row = (r // 2) * TILE_ROWS + (r % 2) * 8
            at = first + st.offset(row, 0, 0) // 16
            at_scale = lane_word + s * (st.bytes // 4) + (st.scale_offset(row, 0) - st.scales_at) // 4
            if c < cta_end:
                for h in cutlass.range_constexpr(2):
                    cute.autovec_copy(sPiece[None, at + h], cute.local_tile(rW[None, r], (4,), (h,)))
                if const_expr(self.ring_scales):
                    rS[r] = sWord[at_scale]
            else:
                for i in cutlass.range_constexpr(CHUNK_WORDS):
                    rW[i, r] = Int32(0)
                if const_expr(self.ring_scales):
                    rS[r] = Int32(0)
        cute.arch.sync_warp()
        if cute.arch.lane_idx() == 0:
            cute.arch.mbarrier_arrive(empty + s)

    @cute.jit
    def dependent_wait(self):
        """PDL: wait for the kernel before this one to finish, then let the next one be scheduled."""
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()

    @cute.jit
    def load_step(self, mX: Optional[cute.Tensor], mW: Optional[cute.Tensor], mBlock: Optional[cute.Tensor],
                  rW: Optional[cute.Tensor], rS: cute.Tensor, rX: cute.Tensor, row0: Int32, n_rows: Int32,
                  m_rows: Int32, c: Int32, c_end: Int32):
        """Chunk c of the lane's rows (g, g + 8 of each tile) (no weights when mW is None), their block scales
        (none when mBlock is None) and the x row of each group over the same k (none when mX is None); zeros
        past the range and past M."""
        g = cute.arch.lane_idx() // LANES_K
        for r in cutlass.range_constexpr(2 * self.row_tiles):
            n = self.weight_row(row0, r, n_rows)
            if c < c_end:
                if const_expr(mW is not None):
                    cute.autovec_copy(self.weight_chunk(mW, mBlock, n, c), rW[None, r])
                if const_expr(mBlock is not None):
                    rS[r] = mBlock[n, c]
            else:
                if const_expr(mW is not None):
                    for i in cutlass.range_constexpr(CHUNK_WORDS):
                        rW[i, r] = Int32(0)
                if const_expr(mBlock is not None):
                    rS[r] = Int32(0)
        if const_expr(mX is not None):
            for gi in cutlass.range_constexpr(self.groups):
                m = gi * 8 + g
                for i in cutlass.range_constexpr(self.x_words):
                    rX[i, gi] = Int32(0)
                if c < c_end:
                    if m < m_rows:
                        cute.autovec_copy(cute.local_tile(mX[m, None], (self.x_words,), (c,)), rX[None, gi])

    def weight_row(self, row0: Int32, r, n_rows: Int32) -> Int32:
        """Weight row r (an int, or a lane's Int32) of the lane's (rows g and g + 8 of each tile); past N, row N - 1
        (its products dropped)."""
        g = cute.arch.lane_idx() // LANES_K
        return cutlass.min(row0 + (r // 2) * TILE_ROWS + (r % 2) * 8 + g, n_rows - 1)

    def weight_chunk(self, mW: cute.Tensor, mBlock: Optional[cute.Tensor], n: Int32, c: Int32) -> cute.Tensor:
        """Row n's chunk c (CHUNK_WORDS words) of the weights; in the tiled layout (16-row tiles, each chunk's
        16 rows back to back) a row of mW."""
        if self.tiled:
            return mW[((n >> 4) * mBlock.shape[1] + c) * TILE_ROWS + (n & (TILE_ROWS - 1)), None]
        return cute.local_tile(mW[n, None], (CHUNK_WORDS,), (c,))

    @cute.jit
    def load_weight_piece(self, mW: cute.Tensor, mBlock: Optional[cute.Tensor], rW: cute.Tensor, row0: Int32,
                          n_rows: Int32, c: Int32, c_end: Int32, piece: cutlass.Constexpr[int]):
        """16-byte piece `piece` (words 4 piece .. + 4) of chunk c of the lane's rows into rW; zeros past the
        range (the rolling load path)."""
        for r in cutlass.range_constexpr(2 * self.row_tiles):
            n = self.weight_row(row0, r, n_rows)
            if c < c_end:
                cute.autovec_copy(cute.local_tile(self.weight_chunk(mW, mBlock, n, c), (4,), (piece,)),
                                  cute.local_tile(rW[None, r], (4,), (piece,)))
            else:
                for i in cutlass.range_constexpr(4):
                    rW[4 * piece + i, r] = Int32(0)

    @cute.jit
    def load_x_piece(self, mX: cute.Tensor, rX: cute.Tensor, m_rows: Int32, c: Int32, c_end: Int32,
                     piece: cutlass.Constexpr[int]):
        """16-byte piece `piece` (words 4 piece .. + 4) of x over chunk c, each group's row, into rX; zeros past
        the range and past M (the rolling load path)."""
        g = cute.arch.lane_idx() // LANES_K
        for gi in cutlass.range_constexpr(self.groups):
            m = gi * 8 + g
            for i in cutlass.range_constexpr(4):
                rX[4 * piece + i, gi] = Int32(0)
            if c < c_end:
                if m < m_rows:
                    cute.autovec_copy(cute.local_tile(mX[m, None], (4,), (c * (self.x_words // 4) + piece,)),
                                      cute.local_tile(rX[None, gi], (4,), (piece,)))

    @cute.jit
    def step(self, rW: cute.Tensor, rS: cute.Tensor, rX: cute.Tensor, rA: cute.Tensor, acc: cute.Tensor):
        """One step of the lane's chunk from one register set: every word of each row tile in turn."""
        for rt in cutlass.range_constexpr(self.row_tiles):
            splats = self.row_splats(rS, rt)
            for i in cutlass.range_constexpr(CHUNK_WORDS):
                self.word_products(rW, splats, register_x(rX), rA, acc, rt, i)

    def row_splats(self, rS: cute.Tensor, rt: int):
        """Row tile rt's block-scale multipliers, [half][block of the chunk] (bf16x2 / f16x2 splats of the
        e4m3 scale; `e4m3_splats`, or the packed layout's one prmt and one mad); None for int8 and fp8."""
        if self.fmt in BYTE_FORMATS:
            return None
        if self.pack:
            mul, add = PACK_SCALE_SPLAT[self.is_f16]
            return [[mad_lo(prmt(rS[2 * rt + h], Int32(0), PACK_SCALE_SELECTORS[b]), mul, add) for b in range(4)]
                    for h in range(2)]
        return [e4m3_splats(rS[2 * rt + h], self.is_f16) for h in range(2)]

    def word_products(self, rW: cute.Tensor, splats, x_word, rA: cute.Tensor, acc: cute.Tensor, rt: int, i: int):
        """Word i of row tile rt's two rows decoded (`splats`: the tile's `row_splats`) and multiplied with the
        x words of the same k slots (`x_word(word, group)`: a register) into the tile's accumulators: NVFP4, two
        MMAs (pairs (0, 1) and (2, 3) of the plain word, x words 4i + q and 4i + q + 2; pairs 2q, 2q + 1 of the
        packed word, x words 4i + 2q and 4i + 2q + 1); int8 and fp8, one MMA (x words 2i, 2i + 1)."""
        f16 = self.is_f16
        words = [rW[i, 2 * rt + h] for h in range(2)]
        if self.fmt == "fp8":
            for h in range(2):
                pairs = e4m3_pairs(words[h], f16)
                for p in range(2):
                    rA[2 * p + h] = pairs[p]
            for gi in range(self.groups):
                self.mma_into(acc, rt, gi, rA, x_word(2 * i, gi), x_word(2 * i + 1, gi))
            return
        if self.fmt == "int8":
            for h in range(2):
                if f16:
                    flipped = words[h] ^ Int32(-0x7F7F7F80)  # 0x80808080
                    for p in range(2):
                        biased = prmt(flipped, Int32(INT8_F16_HIGH), INT8_SELECTORS[p])
                        rA[2 * p + h] = fma_x2(biased, F16_ONE, INT8_F16_BIAS, True)
                else:
                    for p in range(2):
                        biased = prmt(words[h], Int32(INT8_BF16_HIGH), INT8_SELECTORS[p])
                        low = and_bits(biased, 0xFF7FFF7F)
                        high = and_bits(biased, 0xFF80FF80)
                        rA[2 * p + h] = fma_x2(high, BF16_MINUS_ONE, low, False)  # low - high
            for gi in range(self.groups):
                self.mma_into(acc, rt, gi, rA, x_word(2 * i, gi), x_word(2 * i + 1, gi))
            return
        if not self.pack:
            mag = nvfp4_magnitude_field(f16)
            sources, sign_mask = words, lambda j: nvfp4_sign_mask(j, f16)  # noqa: E731
            if self.rotate_signs:
                sources = [rotate_bits(words[h], nvfp4_sign_rotation(f16)) for h in range(2)]
                sign_mask = lambda j: nvfp4_rotated_pair(j, f16)[0]  # noqa: E731
            masks = 4 if f16 else 2  # bf16: one mask a parity of j (`nvfp4_sign_mask`)
            signs = [[and_bits(sources[h], sign_mask(j)) for j in range(masks)] for h in range(2)]
            signs = [[signs[h][j % masks] for j in range(4)] for h in range(2)]
        for q in range(2):
            for jj in range(2):
                j = 2 * q + jj
                for h in range(2):
                    if self.pack:
                        bits = packed_pair_bits(words[h], j, f16)
                    elif self.rotate_signs:
                        _, select, final = nvfp4_rotated_pair(j, f16)
                        merged = select_bits(words[h], signs[h][j], select)
                        bits = shift(merged, final) if final > 0 else rotate_bits(merged, final)
                    else:
                        mshift, sshift = nvfp4_shifts(j, f16)
                        bits = select_bits(shift(words[h], mshift), shift(signs[h][j], sshift), mag)
                    rA[2 * jj + h] = fma_x2(bits, splats[h][i // 2], MINUS_ZERO, f16)
            for gi in range(self.groups):
                if self.pack or self.x_permuted:
                    self.mma_into(acc, rt, gi, rA, x_word(4 * i + 2 * q, gi), x_word(4 * i + 2 * q + 1, gi))
                else:
                    x0 = x_word(4 * i + q, gi)
                    x2 = x_word(4 * i + q + 2, gi)
                    self.mma_into(acc, rt, gi, rA, prmt(x0, x2, X_PAIR_SELECTORS[0]), prmt(x0, x2, X_PAIR_SELECTORS[1]))

    @cute.jit
    def mma_into(self, acc: cute.Tensor, rt: cutlass.Constexpr[int], gi: cutlass.Constexpr[int], rA: cute.Tensor,
                 b0: Int32, b1: Int32):
        base = (rt * self.groups + gi) * 4
        d = mma_16816(rA[0], rA[1], rA[2], rA[3], b0, b1, acc[base], acc[base + 1], acc[base + 2], acc[base + 3],
                      self.is_f16)
        for e in cutlass.range_constexpr(4):
            acc[base + e] = d[e]

    @cute.jit
    def store(self, acc: cute.Tensor, mScale: cute.Tensor, mRowScale: Optional[cute.Tensor],
              mBias: Optional[cute.Tensor], mOut: Optional[cute.Tensor], mPart: Optional[cute.Tensor], row0: Int32,
              n_rows: Int32, m_rows: Int32, g: Int32, t: Int32, split_idx: Int32):
        """Accumulator e of tile (rt, group gi) is out[m = 8 gi + 2t + e % 2, n = row0 + 16 rt + g + 8 (e // 2)]."""
        scale = Float32(1.0)
        if const_expr(self.fmt == "nvfp4" and not self.split):
            scale = mScale[0] * Float32(float(2 ** decode_exponent(self.is_f16)))
        for rt in cutlass.range_constexpr(self.row_tiles):
            for half in cutlass.range_constexpr(2):
                n = row0 + rt * TILE_ROWS + half * 8 + g
                if n < n_rows:
                    if const_expr(self.fmt == "int8" and not self.split):
                        scale = mScale[n].to(Float32)
                    if const_expr(self.fmt == "fp8" and not self.split):
                        scale = mScale[n % mScale.shape[0]]
                    for gi in cutlass.range_constexpr(self.groups):
                        for col in cutlass.range_constexpr(2):
                            m = gi * 8 + 2 * t + col
                            if m < m_rows:
                                total = acc[(rt * self.groups + gi) * 4 + 2 * half + col]
                                if const_expr(self.split):
                                    mPart[split_idx, m, n] = total
                                else:
                                    y = total * scale
                                    if const_expr(mRowScale is not None):
                                        y = y * mRowScale[m % mRowScale.shape[0]]
                                    if const_expr(self.has_bias):
                                        y = y + Float32(mBias[n])
                                    mOut[m, n] = y.to(self.dtype)

