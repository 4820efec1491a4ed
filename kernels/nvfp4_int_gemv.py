"""Host side of the integer NVFP4 GEMV (`cute/nvfp4_int_gemv.py`): out[M, N] = x[M, K] @ dequant(W)[N, K]^T for
M = 1..4 on the dp4a units, with x held as 16-bit integers per 16-value block (exact where |x| >= 2^-7 of its block's
max for bf16 x, 2^-4 for fp16; at most 2^-15 of the block max off below that: `emulate` and `x_error_bound`).

    matmul(x2d [M, K], w_fp4, w_block_scale, w_global_scale, forced=None) -> [M, N] in x's dtype
    run(x2d, w_fp4, w_block_scale, w_global_scale, n, forced=None)    the same without the checks
    emulate(x2d, w_fp4, w_block_scale, w_global_scale) -> float64 [M, N]    the kernel's arithmetic, on the CPU

Routed (`w4a16_decode.nvfp4_matmul`): one-row NVFP4 calls where it measured faster than the fp32 GEMV
(`cute/w4a16_gemv.py`), `w4a16_decode.int_gemv_auto`; FA4_INDUCTOR_W4A16_INT_GEMV=on sends it every call of 1..4 rows,
off none; `gemv="int"` or `("int", rows, warps_k)` forces it (tests, `tests/bench_w4a16.py --gemv int,int:4x1`).
Operands and work split are that GEMV's (`w4a16_decode.prepare_nvfp4`), its CTA shape and split `shape`; x's planes
take 80 bytes of shared memory a 16-byte piece of a weight row (of a CTA's share of it, split) and row of x, so a
variant is compiled per power-of-two bucket of pieces (`max_pieces`), up to K = 16384.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import layout, switches
from .cute import compile_utils

MAX_PIECES = 512  # K <= 16384
SPLIT_BY_DEFAULT = False  # FA4_INDUCTOR_GEMV_SPLIT=auto (both GEMVs): measured slower where it would split (session 29)
SPLIT_TARGET_CTAS = 3  # a split raises a weight's CTAs towards this many a SM (4 fit; 8192 x 8192 unsplit has 3.9)
MIN_SPLIT_STEPS = 2  # 32-piece steps a K warp keeps in each split: the two the registers hold
SHAPE_ORDER = ((4, 1), (4, 2), (2, 2), (1, 2), (1, 4), (2, 1), (1, 1))  # (rows a warp, K warps) by preference (`shape`)
MAX_ROW_PRODUCT = 8  # weight rows a warp times rows of x: a warp's accumulators and x planes stay in registers
MIN_PIECES = 16  # the smallest bucket (K = 512)
CAPPED_MIN_CTAS = 4
SIBLINGS_MIN_CTAS = 4


class Key(NamedTuple):
    dtype: torch.dtype
    m: int
    arch: str
    rows: int
    warps_k: int
    max_pieces: int
    pdl: bool = False
    prefetch: int = 0
    weights: int = 1  # > 1: `NVFP4IntGemvSiblings`, that many weights of one x in one launch
    splits: int = 1  # CTAs of a cluster that split a row group's K
    warps: int = 4  # a CTA (`cute/w4a16_gemv.py`'s CTA_WARPS): more warps quantize x once for more rows
    gated: str = ""  # `NVFP4IntGemvGated`'s activation (weights = 2): act(x @ gate^T) * (x @ up^T)


def pieces_bucket(pieces: int, max_pieces: int = MAX_PIECES, piece_values: int = 32) -> int:
    """The power of two of pieces (from MIN_PIECES) a variant is compiled for; `max_pieces` of `piece_values` weights
    the most a row may have (NVFP4's; the int8 GEMV's: `int8_int_gemv`)."""
    if not 1 <= pieces <= max_pieces:
        raise ValueError(f"the integer GEMV takes rows of 1..{max_pieces} pieces (K <= {piece_values * max_pieces}), "
                         f"got {pieces}")
    bucket = MIN_PIECES
    while bucket < pieces:
        bucket *= 2
    return bucket


def shape(n: int, m: int, num_sms: int, pieces: int, split: bool = False) -> tuple[int, int, int]:
    """(rows a warp, K warps, splits) for an n-row weight of `pieces` 16-byte pieces a row and m rows of x: the first
    CTA shape in SHAPE_ORDER (rows * m <= MAX_ROW_PRODUCT, each K warp at least one 32-piece step) whose CTAs cover
    the SMs, else the one of the most CTAs. Each CTA writes all of x's planes first, so more CTAs cost more of that; 4
    rows a warp keep 4 CTAs a SM resident (128 registers with two pieces in flight; 8 rows take 253).

    `split`: each shape's CTAs first grow by splitting K in two, four or eight (`splits`), and a shape whose split
    CTAs cover the SMs comes first (2048 x 8192: 4 rows a warp, one K warp, 4 splits; 512 CTAs, not 256 of 2 K
    warps)."""
    from .cute.nvfp4_int_gemv import NUM_WARPS

    fits = [(r, wk) for r, wk in SHAPE_ORDER if r * m <= MAX_ROW_PRODUCT and (wk == 1 or pieces >= 32 * wk)]
    ctas = {s: -(-n // (s[0] * (NUM_WARPS // s[1]))) for s in fits}
    split_of = {s: splits(ctas[s], pieces, s[1], num_sms) if split else 1 for s in fits}
    chosen = next((s for s in fits if ctas[s] * split_of[s] >= num_sms), None)
    if chosen is None:
        chosen = max(fits, key=lambda s: ctas[s] * split_of[s])
    return (*chosen, split_of[chosen])


WIDE_MIN_ROWS = 4096
WIDE_MIN_PIECES = 256  # K >= 8192
"""One-row calls over weights of at least WIDE_MIN_ROWS rows and WIDE_MIN_PIECES pieces a row take CTAs of 8 warps
(`wide_shape`), which quantize x once for 32 rows; past WIDE_MIN_PIECES, with K split in 2. H200, docs/benchmarks.md
session 29 run 2, us against `shape`'s: 8192 x 8192 15.4 / 16.1, 4096 x 14336 13.8 / 16.8 (2.55x bf16); 4096 x 4096
5.8 / 5.8 and the small weights lose or tie, hence the lines."""


def wide_shape(n: int, m: int, pieces: int) -> tuple[int, int, int, int] | None:
    """(rows a warp, K warps, splits, warps a CTA) for the long weights CTAs of 8 warps serve better (WIDE_MIN_ROWS,
    WIDE_MIN_PIECES), else None."""
    if m != 1 or n < WIDE_MIN_ROWS or pieces < WIDE_MIN_PIECES:
        return None
    return 4, 1, 2 if pieces > WIDE_MIN_PIECES else 1, 8


def splits(ctas: int, pieces: int, warps_k: int, num_sms: int) -> int:
    """CTAs of a cluster that split K for a weight of `ctas` row groups: the fewest (a power of two up to 8) that
    bring the CTAs to SPLIT_TARGET_CTAS a SM, each split keeping MIN_SPLIT_STEPS steps a K warp."""
    from .cute.w4a16_gemv import SPLITS

    chosen = 1
    for s in SPLITS[1:]:
        if ctas * chosen >= SPLIT_TARGET_CTAS * num_sms or pieces < s * MIN_SPLIT_STEPS * 32 * warps_k:
            break
        chosen = s
    return chosen


def split_pieces(pieces: int, warps_k: int, splits: int) -> int:
    """The pieces a row each CTA of a split takes (`W4A16Gemv.start`): whole steps of 32 * warps_k."""
    step = 32 * warps_k
    return -(-pieces // (splits * step)) * step if splits > 1 else pieces


def forced_shape(forced: tuple[int, ...]) -> tuple[int, int, int, int]:
    """A forced (rows a warp, K warps[, splits[, warps a CTA]]) with the defaults filled in: unsplit, 4 warps."""
    if not 2 <= len(forced) <= 4:
        raise ValueError(f"a forced integer-GEMV shape is (rows, K warps[, splits[, warps]]), not {forced}")
    return (*forced, *(1, 4)[len(forced) - 2:])


def configured_split() -> bool:
    """FA4_INDUCTOR_GEMV_SPLIT (auto: SPLIT_BY_DEFAULT), for both GEMVs."""
    setting = switches.current().gemv_split
    return SPLIT_BY_DEFAULT if setting is None else setting


def unsupported_reason(x2d: Tensor, n: int, k: int) -> str | None:
    """Why the kernel cannot take this call (beyond `w4a16_decode.unsupported_reason`, which the caller asks first),
    or None."""
    from .cute.nvfp4_int_gemv import MAX_M

    return limits_reason("NVFP4", x2d.shape[0], k, MAX_M, 32, MAX_PIECES)


def limits_reason(fmt: str, m: int, k: int, max_m: int, piece_values: int, max_pieces: int) -> str | None:
    """Why an integer GEMV (of weights `fmt`) cannot take m rows of x over K = k, or None: at most max_m rows, K at
    most max_pieces pieces of piece_values weights."""
    if not 1 <= m <= max_m:
        return f"the integer {fmt} GEMV takes 1..{max_m} rows of x, got {m}"
    if -(-k // piece_values) > max_pieces:
        return f"the integer {fmt} GEMV takes K <= {piece_values * max_pieces}, got {k}"
    return None


def _compile(key: Key):
    cute = compile_utils.cute_for(key.arch)
    from cutlass import Float32, Int32

    from .cute.nvfp4_int_gemv import NVFP4IntGemv, NVFP4IntGemvGated, NVFP4IntGemvSiblings

    dt = compile_utils.cutlass_dtype(key.dtype)
    sym, sym64 = cute.sym_int, cute.sym_int64

    def operands():  # (w, block, scale, out) of one weight
        return (cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(divisibility=4), 1), assumed_align=16),
                cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(), 1)),
                cute.runtime.make_fake_compact_tensor(Float32, (sym(),)),
                cute.runtime.make_fake_tensor(dt, (key.m, sym()), (sym64(), 1)))

    x = cute.runtime.make_fake_tensor(Int32, (key.m, sym()), (sym64(divisibility=4), 1), assumed_align=16)
    if key.gated:
        kernel = NVFP4IntGemvGated(dt, key.m, key.rows, key.warps_k, key.max_pieces, pdl=key.pdl,
                                   min_ctas=SIBLINGS_MIN_CTAS if key.m == 1 else 0, activation=key.gated)
        (w0, block0, scale0, out), (w1, block1, scale1, _) = operands(), operands()
        return compile_utils.compile_for_tvm_ffi(cute, kernel, x, w0, block0, scale0, w1, block1, scale1, out)
    if key.weights > 1:
        # one row of x: held to the one-weight kernel's 128 registers (4 CTAs a SM at 4 rows a warp; 146 uncapped)
        kernel = NVFP4IntGemvSiblings(dt, key.weights, key.m, key.rows, key.warps_k, key.max_pieces, pdl=key.pdl,
                                      min_ctas=SIBLINGS_MIN_CTAS if key.m == 1 else 0)
        return compile_utils.compile_for_tvm_ffi(cute, kernel, x, *operands(), *operands(), *operands())
    # one row of x: the prefetch window (156 registers at 4 rows a warp) and the split's cluster sums (146) would cost
    # a CTA a SM; capped at 128, no spills (more rows of x would spill). CTAs of 8 and 16 warps: 128 too
    capped = key.m == 1 and (key.prefetch or key.splits > 1) or key.warps > 4
    kernel = NVFP4IntGemv(dt, key.m, key.rows, key.warps_k, key.max_pieces, pdl=key.pdl, prefetch=key.prefetch,
                          min_ctas=CAPPED_MIN_CTAS * 4 // key.warps if capped else 0, splits=key.splits,
                          warps=key.warps)
    return compile_utils.compile_for_tvm_ffi(cute, kernel, x, *operands())


compiled = compile_utils.CompiledVariants(_compile)
"""`compiled(key)`: the variant `key` names, compiled on first use."""


def matmul(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor,
           forced: Optional[tuple[int, ...]] = None) -> Tensor:
    """x2d [M, K] @ dequant(w)^T -> [M, N] in x's dtype; `forced` (rows a warp, K warps[, splits[, warps a CTA]])
    overrides `shape`."""
    from . import w4a16_decode as w4

    n, k = layout.nvfp4_operands(w_fp4, w_block_scale, w_global_scale)
    reason = w4.unsupported_reason(x2d, "nvfp4", n, k) or unsupported_reason(x2d, n, k)
    if reason is not None:
        raise ValueError(reason)
    return run(x2d, w_fp4, w_block_scale, w_global_scale, n, forced)


def run(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor, n: int,
        forced: Optional[tuple[int, ...]] = None) -> Tensor:
    """`matmul` without its checks, for a caller that has made them (`w4a16_decode.nvfp4_matmul`, every call)."""
    return _launch(x2d, [(w_fp4, w_block_scale, w_global_scale, n)], forced, switches.current().int_gemv_prefetch)[0]


def run_siblings(x2d: Tensor, weights: list[tuple[Tensor, Tensor, Tensor]],
                 forced: Optional[tuple[int, int]] = None) -> list[Tensor]:
    """x2d @ dequant(w)^T for each of 2 or 3 (w_fp4, w_block_scale, w_global_scale) of one K, in one launch
    (`NVFP4IntGemvSiblings`), each output as `run`'s; the CTA shape is `shape`'s for their rows together, unsplit.
    The caller has made `matmul`'s checks for each."""
    if len(weights) not in (2, 3):
        raise ValueError(f"the sibling GEMV takes 2 or 3 weights, got {len(weights)}")
    return _launch(x2d, [(*w, w[0].shape[0]) for w in weights], forced, 0)


def run_gated(x2d: Tensor, gate: tuple[Tensor, Tensor, Tensor], up: tuple[Tensor, Tensor, Tensor],
              forced: Optional[tuple[int, int]] = None, activation: str = "silu") -> Tensor:
    """act(x2d @ dequant(gate)^T) * (x2d @ dequant(up)^T) -> [M, N] in x's dtype, in one launch
    (`NVFP4IntGemvGated`; act silu or gelu_tanh); gate and up (w_fp4, w_block_scale, w_global_scale) of one shape.
    The CTA shape is `shape`'s for their rows together (rows a warp at least 2: one of each). The caller has made
    `matmul`'s checks for each."""
    from .cute.nvfp4_int_gemv import ACTIVATIONS

    if activation not in ACTIVATIONS:
        raise ValueError(f"the gated GEMV takes the activations {ACTIVATIONS}, not {activation!r}")
    if gate[0].shape != up[0].shape or gate[1].shape != up[1].shape:
        raise ValueError(f"the gated GEMV takes gate and up weights of one shape, got {tuple(gate[0].shape)} and "
                         f"{tuple(up[0].shape)}")
    n = gate[0].shape[0]
    x, (gate_operands, up_operands), pieces, num_sms = _prepared(x2d, [gate, up])
    m = x.shape[0]
    rows, warps_k = forced or shape(2 * n, m, num_sms, pieces)[:2]
    rows = max(rows, 2)
    if rows % 2 or rows * m > MAX_ROW_PRODUCT:
        raise ValueError(f"the gated GEMV takes an even number of rows a warp, at most {MAX_ROW_PRODUCT} // {m}; got "
                         f"{rows}")
    key = Key(x.dtype, m, compile_utils.target_arch(x.device), rows, warps_k, pieces_bucket(pieces),
              switches.current().w4a16_pdl, weights=2, gated=activation)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _call(key, x, *gate_operands, *up_operands, out)
    return out


def _prepared(x2d: Tensor, weights: list) -> tuple[Tensor, list[list[Tensor]], int, int]:
    """(x padded to the weights' K, each (w_fp4, w_block_scale, w_global_scale) as the kernels take it: [words,
    blocks, global scale], the 16-byte pieces of a row, the SMs of x's device)."""
    from . import w4a16_decode as w4

    operands = []
    for w_fp4, w_block_scale, w_global_scale in weights:
        words, blocks = w4.prepare_nvfp4(w_fp4, w_block_scale)
        operands.append([words, blocks, w_global_scale.reshape(1).float()])
    pieces = operands[0][0].shape[1] // 4
    x = w4.prepare_x(x2d, 32 * pieces)
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return x, operands, pieces, w4._num_sms(device)


def _call(key: Key, x: Tensor, *operands) -> None:
    with torch.cuda.device(x.device):
        compiled(key)(x.view(torch.int32), *operands)


def _launch(x2d: Tensor, weights: list, forced: Optional[tuple[int, ...]], prefetch: int) -> list[Tensor]:
    x, prepared, pieces, num_sms = _prepared(x2d, [w[:3] for w in weights])
    m = x.shape[0]
    outs = [torch.empty(m, w[3], dtype=x.dtype, device=x.device) for w in weights]
    operands = [t for ops, out in zip(prepared, outs) for t in (*ops, out)]
    split = len(weights) == 1 and configured_split()
    n = sum(w[3] for w in weights)
    wide = wide_shape(n, m, pieces) if len(weights) == 1 and not split else None
    rows, warps_k, n_splits, warps = forced_shape(forced) if forced else wide or (
        *shape(n, m, num_sms, pieces, split), 4)
    if (n_splits > 1 or warps != 4) and len(weights) > 1:
        raise ValueError("the sibling GEMV does not split K and has CTAs of 4 warps")
    key = Key(x.dtype, m, compile_utils.target_arch(x.device), rows, warps_k,
              pieces_bucket(split_pieces(pieces, warps_k, n_splits)), switches.current().w4a16_pdl, prefetch,
              len(weights), n_splits, warps)
    if len(weights) == 2:
        operands += operands[4:]  # the third weight's slot, not read
    _call(key, x, *operands)
    return outs


# ---- the kernel's arithmetic on the CPU ----


def x_integers(x: Tensor) -> tuple[Tensor, Tensor]:
    """(y int64 [K], s int64 [K / 16]): each block of 16 values of a 1-D x (K a multiple of 16) as the kernel holds it,
    y = rint(x * 2^s) (ties to even) with 2^s putting the block's max |x| in [2^14, 2^15), s <= 126. A non-finite
    block gets y = 0 and s = None's stand-in -1000 (its multiplier is NaN)."""
    from .cute import nvfp4_int_gemv as kern

    v = x.float().reshape(-1, kern.BLOCK)
    amax = v.abs().amax(dim=1)
    field = (amax.view(torch.int32).long() >> 23) & 0xFF
    finite = field < 255
    field = field.clamp(min=kern.TOP_EXPONENT + 127 - kern.MAX_SHIFT)
    s = 2 * 127 + kern.TOP_EXPONENT - field - 127
    scaled = v.double() * torch.pow(2.0, s.double())[:, None]
    y = torch.where(finite[:, None], torch.round(scaled), torch.zeros_like(scaled)).long()  # round: ties to even
    return y.reshape(-1), torch.where(finite, s, torch.full_like(s, -1000))


def block_multipliers(s: Tensor) -> Tensor:
    """float64 2^-s of `x_integers`' shifts, NaN for a non-finite block (s = -1000)."""
    return torch.where(s > -1000, torch.pow(2.0, -s.double()), torch.full_like(s, float("nan"), dtype=torch.float64))


def x_error_bound(x: Tensor) -> Tensor:
    """Per value, the most the kernel's integer x is off the value (0 where exact): half a unit of 2^-s."""
    y, s = x_integers(x)
    return (torch.pow(2.0, -s.double() - 1)).repeat_interleave(16)


def emulate(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor) -> Tensor:
    """float64 [M, N]: the kernel's result before the fp32 sums' rounding and the output cast: per row of x and block
    the exact integer sum(2 e2m1 * y) times e4m3 * 2^-s, summed, times global / 2. NaN for a non-finite block of x."""
    from .cute import nvfp4_int_gemv as kern

    n, k = layout.nvfp4_operands(w_fp4, w_block_scale, w_global_scale)
    kp = -(-k // 64) * 64
    codes = w_fp4.view(torch.uint8).cpu().long()
    codes = torch.stack([codes & 0xF, codes >> 4], dim=-1).reshape(n, -1)  # code 2i low nibble
    codes = torch.nn.functional.pad(codes, (0, kp - codes.shape[1]))
    table = torch.tensor(kern.POSITIVE_TABLE + kern.NEGATIVE_TABLE) - kern.WEIGHT_OFFSET
    w2 = table[codes]  # 2 * e2m1
    scales = w_block_scale.cpu().view(torch.float8_e4m3fn).double()
    scales = torch.nn.functional.pad(scales, (0, kp // kern.BLOCK - scales.shape[1]))
    rows = []
    for x in x2d.reshape(-1, x2d.shape[-1]).cpu():
        y, s = x_integers(torch.nn.functional.pad(x[:k], (0, kp - k)))
        sums = (w2 * y[None, :]).reshape(n, -1, kern.BLOCK).sum(-1)  # [N, Kp / 16], exact
        rows.append((sums.double() * scales * block_multipliers(s)[None, :]).sum(-1))
    return torch.stack(rows) * (w_global_scale.cpu().double().reshape(()) / 2)


def weight_bytes(codes: Tensor) -> Tensor:
    """`cute/nvfp4_int_gemv.weight_bytes` on the low 16 bits of int64 words: the two prmt, the xor and the or."""
    from . import w4a16_decode as w4
    from .cute import nvfp4_int_gemv as kern

    p_lo, p_hi = kern.table_words(kern.POSITIVE_TABLE)
    n_lo, n_hi = kern.table_words(kern.NEGATIVE_TABLE)
    return w4._prmt(p_lo, p_hi, codes) | w4._prmt(n_lo, n_hi, codes ^ 0x88888888)


def plane_words(bits: Tensor) -> tuple[Tensor, Tensor]:
    """`quantize_block`'s packing: int64 [..., 4] fp32 bit patterns of four values -> (the words of their bytes 0,
    of their bytes 1)."""
    from . import w4a16_decode as w4

    ab = w4._prmt(bits[..., 0], bits[..., 1], 0x5140)
    cd = w4._prmt(bits[..., 2], bits[..., 3], 0x5140)
    return w4._prmt(ab, cd, 0x5410), w4._prmt(ab, cd, 0x7632)


def quantize_blocks(x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`cute/nvfp4_int_gemv.quantize_block` step by step in fp32 and int32 bit patterns, for a 1-D x of whole blocks:
    (plane-0 words, plane-1 words) int64 [K / 4], and per block the multiplier's inverse bits and the correction 64 *
    sum(y), int64 [K / 16]."""
    from .cute import nvfp4_int_gemv as kern

    v = x.float().reshape(-1, kern.BLOCK)
    amax = v.abs().amax(dim=1)
    amax = torch.where(v.isnan().any(dim=1), torch.full_like(amax, float("nan")), amax)
    field = amax.view(torch.int32).long() >> 23
    field = field.clamp(min=kern.TOP_EXPONENT + 127 - kern.MAX_SHIFT)
    finite = field < 255
    multiplier = ((2 * 127 + kern.TOP_EXPONENT - field) << 23).to(torch.int32).view(torch.float32)
    multiplier = torch.where(finite, multiplier, torch.zeros_like(multiplier))
    inverse = torch.where(finite, (field - kern.TOP_EXPONENT) << 23, torch.full_like(field, kern.NAN_BITS))
    rounded = v * multiplier[:, None] + kern.ROUNDER  # the product is exact: one rounding, as the fma's
    bits = rounded.view(torch.int32).long() & 0xFFFFFFFF
    total = (bits - kern.ROUNDER_BITS).sum(dim=1)
    low, high = plane_words(bits.reshape(-1, 4))
    return low, high, inverse, total * kern.WEIGHT_OFFSET


def block_sums(words: Tensor, low: Tensor, high: Tensor, correction: Tensor) -> Tensor:
    """`cute/nvfp4_int_gemv.piece`'s integer part for weight words int64 [N, Kp / 8] against `quantize_blocks`' planes:
    per row and block, the dp4a sums s0 (u8 x u8), s1 (u8 x s8) and v = s0 + 256 s1 - correction, int64 [N, Kp / 16]."""
    n, nwords = words.shape
    lo_codes, hi_codes = words & 0xFFFF, words >> 16 & 0xFFFF
    w_lo, w_hi = weight_bytes(lo_codes), weight_bytes(hi_codes)  # [N, W]: codes 8j..8j+3, 8j+4..8j+7
    s0 = dp4a_dot(w_lo, low[0::2][None, :], False, False) + dp4a_dot(w_hi, low[1::2][None, :], False, False)
    s1 = dp4a_dot(w_lo, high[0::2][None, :], False, True) + dp4a_dot(w_hi, high[1::2][None, :], False, True)
    per_block = lambda t: t.reshape(n, nwords // 2, 2).sum(-1)  # noqa: E731 (two words a block)
    return per_block(s0) + 256 * per_block(s1) - correction[None, :]


def dp4a_dot(a: Tensor, b: Tensor, a_signed: bool, b_signed: bool) -> Tensor:
    """`dp4a` on int64 tensors of 32-bit words (broadcast): the sum of the products of their four bytes, each byte
    unsigned or, where a_signed / b_signed, signed."""
    def byte(t, i, signed):
        v = t >> 8 * i & 0xFF
        return (v + 128) % 256 - 128 if signed else v

    return sum(byte(a, i, a_signed) * byte(b, i, b_signed) for i in range(4))
