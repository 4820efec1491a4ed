"""Host side of the integer int8-weight GEMV (`cute/int8_int_gemv.py`): out[M, N] = (x[M, K] @ W[N, K]^T) * scale[N]
(+ bias) for M = 1..4 on the dp4a units, x held as 16-bit integers per 16-value block as the integer NVFP4 GEMV holds
it (`nvfp4_int_gemv.x_integers`: exact where |x| >= 2^-7 of its block's max for bf16 x, 2^-4 for fp16; at most 2^-15
of the block max off below that).

    run(x2d [M, K], w_int8 [N, K], scale [N], bias [N] or None, forced=None) -> [M, N] in x's dtype
    emulate(x2d, w_int8, w_scale, bias=None) -> float64 [M, N]    the kernel's arithmetic, on the CPU

Routed (`w4a16_decode.int8_matmul`) where FA4_INDUCTOR_W4A16_INT_GEMV=on sends 1..4-row calls to the integer GEMVs, or
`gemv="int"` / ("int", rows, K warps[, 1, warps a CTA]) forces it (tests, `tests/bench_w4a16.py --gemv int`);
`int8_auto` keeps it off by default until the H200 has timed it against the fp32 GEMV (issue 15's int8 row:
19.6 us at 8192 x 8192 against 18). CTA shapes are `nvfp4_int_gemv.shape`'s, unsplit; x's planes take 40 bytes of
shared memory a 16-byte piece of a weight row and row of x, a variant per power-of-two bucket of pieces up to K =
16384.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import nvfp4_int_gemv, switches
from .cute import compile_utils

PIECE_VALUES = 16  # a 16-byte piece of an int8 weight row
MAX_PIECES = 1024  # K <= 16384
MIN_CTAS = 4  # one row of x: the registers capped for 16 warps a SM (4 CTAs of 4 warps; 82 used at 4 rows a warp)


class Key(NamedTuple):
    dtype: torch.dtype
    m: int
    bias: bool
    scale_dtype: torch.dtype
    arch: str
    rows: int
    warps_k: int
    max_pieces: int
    pdl: bool = False
    warps: int = 4


def int8_auto(m: int, n: int, k: int) -> bool:
    """Whether an int8 call takes the integer GEMV by default: not yet (no GPU timing)."""
    return False


def unsupported_reason(x2d: Tensor, n: int, k: int) -> str | None:
    """Why the kernel cannot take this call (beyond `w4a16_decode`'s int8 checks, which the caller makes first), or
    None."""
    from .cute.int8_int_gemv import MAX_M

    return nvfp4_int_gemv.limits_reason("int8", x2d.shape[0], k, MAX_M, PIECE_VALUES, MAX_PIECES)


def _compile(key: Key):
    cute = compile_utils.cute_for(key.arch)
    from cutlass import Int32

    from .cute.int8_int_gemv import Int8IntGemv

    dt = compile_utils.cutlass_dtype(key.dtype)
    sym, sym64 = cute.sym_int, cute.sym_int64
    x = cute.runtime.make_fake_tensor(Int32, (key.m, sym()), (sym64(divisibility=4), 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(divisibility=4), 1), assumed_align=16)
    scale = cute.runtime.make_fake_compact_tensor(compile_utils.cutlass_dtype(key.scale_dtype), (sym(),))
    bias = cute.runtime.make_fake_compact_tensor(dt, (sym(),)) if key.bias else None
    out = cute.runtime.make_fake_tensor(dt, (key.m, sym()), (sym64(), 1))
    kernel = Int8IntGemv(dt, key.m, key.bias, key.rows, key.warps_k, key.max_pieces, pdl=key.pdl,
                         min_ctas=MIN_CTAS * 4 // key.warps if key.m == 1 else 0, warps=key.warps)
    return compile_utils.compile_for_tvm_ffi(cute, kernel, x, w, scale, bias, out)


compiled = compile_utils.CompiledVariants(_compile)
"""`compiled(key)`: the variant `key` names, compiled on first use."""


def key_for(x: Tensor, pieces: int, n: int, bias: bool, scale_dtype: torch.dtype, num_sms: int,
            forced: Optional[tuple[int, ...]] = None) -> Key:
    """The variant for x (padded, [M, 16 * pieces]) over an n-row weight: `forced` (rows a warp, K warps[, splits
    (1)[, warps a CTA]]), else `nvfp4_int_gemv.shape`'s unsplit."""
    rows, warps_k, splits, warps = nvfp4_int_gemv.forced_shape(forced) if forced else (
        *nvfp4_int_gemv.shape(n, x.shape[0], num_sms, pieces), 4)
    if splits != 1:
        raise ValueError("the integer int8 GEMV does not split K")
    bucket = nvfp4_int_gemv.pieces_bucket(pieces, MAX_PIECES, PIECE_VALUES)
    return Key(x.dtype, x.shape[0], bias, scale_dtype, compile_utils.target_arch(x.device), rows, warps_k, bucket,
               switches.current().w4a16_pdl, warps)


def run(x2d: Tensor, w_int8: Tensor, scale: Tensor, bias: Optional[Tensor], forced: Optional[tuple[int, ...]] = None
        ) -> Tensor:
    """x2d @ (w_int8 * scale)^T + bias in x's dtype, `scale` [N] and `bias` [N] (or None) as `w4a16_decode`'s int8
    checks hand them over (contiguous; the bias in x's dtype)."""
    from . import w4a16_decode as w4

    n = w_int8.shape[0]
    words = w4.prepare_bytes(w_int8)
    pieces = words.shape[1] // 4
    x = w4.prepare_x(x2d, PIECE_VALUES * pieces)
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    key = key_for(x, pieces, n, bias is not None, scale.dtype, w4._num_sms(device), forced)
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    with torch.cuda.device(x.device):
        compiled(key)(x.view(torch.int32), words, scale, bias, out)
    return out


# ---- the kernel's arithmetic on the CPU ----


def emulate(x2d: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """float64 [M, N]: the kernel's result before the fp32 rounding of its block sums, of their sum and of the output:
    per row of x and block the exact integer sum(w * y) times 2^-s, summed, times the scale, plus the bias. NaN for a
    non-finite block of x."""
    n, k = w_int8.shape
    kp = -(-k // PIECE_VALUES) * PIECE_VALUES
    w = torch.nn.functional.pad(w_int8.cpu().long(), (0, kp - k))
    rows = []
    for x in x2d.reshape(-1, x2d.shape[-1]).cpu():
        y, s = nvfp4_int_gemv.x_integers(torch.nn.functional.pad(x[:k], (0, kp - k)))
        sums = (w * y[None, :]).reshape(n, -1, PIECE_VALUES).sum(-1)  # [N, Kp / 16], exact
        rows.append((sums.double() * nvfp4_int_gemv.block_multipliers(s)[None, :]).sum(-1))
    out = torch.stack(rows) * w_scale.cpu().double().reshape(1, n)
    return out if bias is None else out + bias.cpu().double().reshape(1, n)


def block_sums(words: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """`cute/int8_int_gemv.Int8IntGemv.piece`'s integer part for weight words int64 [N, Kp / 4] (four int8 weights a
    word) against `nvfp4_int_gemv.quantize_blocks`' planes: per row and block, s0 (s8 x u8) + 256 s1 (s8 x s8), int64
    [N, Kp / 16]."""
    n, nwords = words.shape
    per_block = lambda t: t.reshape(n, nwords // 4, 4).sum(-1)  # noqa: E731 (four words a block)
    dot = nvfp4_int_gemv.dp4a_dot
    return per_block(dot(words, low[None, :], True, False)) + 256 * per_block(dot(words, high[None, :], True, True))
