"""Host side of our weight-only decode GEMM (`cute/w4a16_decode_gemm.py` + `cute/w4a16_splitk_reduce.py`):
out[M, N] = x[M, K] @ dequant(W)[N, K]^T for decode-sized M (1..16), x float16 / bfloat16, W NVFP4, int8 or fp8.

    unsupported_reason(x2d, fmt, n, k) -> str | None          fmt "nvfp4", "int8" or "fp8"
    nvfp4_matmul(x2d, w_fp4, w_block_scale, w_global_scale) -> Tensor [M, N] in x's dtype
    int8_matmul(x2d, w_int8, w_scale, bias=None) -> Tensor [M, N] in x's dtype
    (both: gemv=None / True / False, the CUDA-core GEMV for the fewest rows, "CUDA-core GEMV" below)
    fp8_matmul(x2d, w_fp8, w_scale, x_scale=None, bias=None) -> Tensor [M, N] in x's dtype (tensor cores only)
    warmup(dtype, fmt, ...)                                   compile before CUDA-graph capture


Formats (the ops' own, see nvfp4_linear.py / int8_linear.py):
- nvfp4: w_fp4 uint8 [N, K/2] (code 2i in the low nibble), w_block_scale float8_e4m3fn [N, K/16],
  w_global_scale float32 with one element (read by the kernel on the device: no host sync, and a scale
  computed in the graph is fine). The kernel computes sum_k x * (e2m1 * e4m3) in fp32 (products exact),
  then multiplies by the global scale once: it does not round e4m3 * global to fp32 first as the op's
  reference does (a relative difference of at most one fp32 ulp per weight, far below the bf16 output's).
- int8: w_int8 int8 [N, K], w_scale [N] (float32, bfloat16 and float16 read as they are, with a kernel variant
  each; other float dtypes made fp32 per call), bias [N] in x's dtype or None:
  out = dtype(sum_k x * w * scale[n] + bias[n]) (the sum in fp32). Per-channel scales only.
- fp8: w_fp8 float8_e4m3fn [N, K], w_scale float32 [N] or [1], x_scale float32 [M] or [1] or None, bias [N] in x's
  dtype or None: out = dtype(sum_k x * w * w_scale[n] * x_scale[m] + bias[n]) (the sum in fp32), what
  `torch._scaled_mm` computes for x holding fp8 values (the products are exact either way).

Layout: the checkpoint's row-major bytes as they are, read as 32-bit words, when a row is a whole number of
32-byte chunks (K a multiple of 64 for NVFP4, 32 for int8 and fp8) and the tensors are 16-byte aligned (no copy at
all); otherwise a copy with K padded to the chunk (zero codes, zero scales), made once per weight
(`prepared_weights`, kind "w4a16_nvfp4" / "w4a16_int8" / "w4a16_float8_e4m3fn"). NVFP4 block scales are padded per
call in that case (they are whatever the op holds; torchao's blocked ones are un-blocked once, by `nvfp4_linear`). x
is made contiguous, 16-byte aligned and zero-padded to the chunk when needed (a small copy).

Limits (`unsupported_reason`): CUDA sm90, x float16 / bfloat16 with 1..16 rows, K a multiple of 16, N >= 1.

CTA shape (`cta_shape`): warps_n warps along N times warps_k along K, row_tiles tiles of 16 rows a warp. On the
"auto" load path NVFP4 calls of 9..16 rows over weights of at least 4096 x 4096 (or fewer rows with K >= 4096, or from
2048 rows with K >= 2048, or long ones: 14336 along N or K), and of 2..8 rows over the same wide weights but those of
8192 rows, take CTAs of one K warp and the xsmem path instead, as do int8 calls of 9..16 rows over fewer than 4096 rows
with K >= 4096 (`xsmem_cta`: 1.22-1.42x the former rule at 16 rows, H100 and H200, sessions 46-49; 1.74x on 2048 x
8192; 1.27-1.67x on the Llama lm_heads at 5..8 rows, 1.27-1.40x at 2..4). Plain NVFP4 there takes "xsmem+xperm+rot"
on 1 x 16 x 1 and "xsmem+rot" on 1 x 8 x 1 (`xsmem_auto_spec`).
Wide (2 x 4 warps, 2 tiles a warp, 1 for M > 8, whose x takes twice the registers: 64 / 32 rows a CTA) for
NVFP4 weights whose wide CTAs cover a quarter of the SMs; narrow (1 x 8 warps, 1 tile: 16 rows a CTA) for int8
and for NVFP4 weights with fewer rows, which the wide shape leaves on a quarter of the SMs or less with each SM
decoding 64 rows alone. `tests/bench_w4a16.py --cta auto,2x2x4,1x1x8` compares them.

Split-K (`num_splits`): a host function of the shapes and the SM count, never of values, so a captured CUDA
graph stays valid. Partials go to an fp32 workspace [splits, M, N] (a fresh torch allocation per call: fine
under capture) reduced by a second kernel in a fixed order (deterministic). `tests/bench_w4a16.py --splits
1,2,4,8` sweeps the count.

Load path (`load`, see `parse_load`; by default "auto", which picks "rolling", "rolling+2ctas" or "registers" per
call, `auto_load`): "registers": each warp loads its next step straight into
registers (a per-warp cp.async ring in shared memory was measured 1.2-2x slower on the H200 on every shape,
docs/benchmarks.md session 9, and removed; so was one beside x's shared copy on "xsmem", 1.3-1.7x slower on an
H100 at 8..16 rows, session 51). "bulk": a producer warp streams the weight codes through a ring
of shared-memory stages with bulk copies (`cute/w4a16_decode_gemm.py`), as deep as BULK_SMEM_BUDGET allows
(`bulk_stages`) or "bulk:<stages>"; "rolling": the register path's loads, a step ahead as well, into one
register set refilled piece by piece as the step uses it (half the operand registers), and "rolling+2ctas"
with the registers capped for two CTAs a SM (registers, rolling and xsmem take "+rot" last: the plain NVFP4
decode's signs from one rotation of each word, `nvfp4_rotated_pair`); "+ahead" also copies the next stage to
registers before computing the current one, "+prefetch" (NVFP4) prefetches each stage's block scales into L2 from the
producer, "+scales" (NVFP4) moves the block scales through the ring too ("bulk+ahead+prefetch:4"; int8 drops the
NVFP4 options). FA4_INDUCTOR_W4A16_LOAD sets it; the matmuls' and `warmup`'s `load` argument overrides it
(tests, `tests/bench_w4a16.py --load registers,bulk --stages 4,6`). On the H200 the bulk path is equal or slower
on most rows (docs/benchmarks.md, session 10 run 3). "xsmem" (or "xsmem:<sets>", 2 or more weight register sets,
default XSMEM_SETS; "xsmem+2ctas" caps the registers for two CTAs a SM; "xsmem+prefetch[<steps>]" also requests
each weight row's next XSMEM_BURST (or <steps>) steps past the register sets into L2 at once, every that many steps,
so that they reach DRAM as one run a row; "+parts<n>" lands x's copy in n parts of whole K-loop iterations, each on
its own mbarrier, so the first MMAs wait for the first part only, default XSMEM_PARTS; "+xperm" (plain NVFP4, x in
one part) rewrites x's copy once into the MMA's operand pairs, sparing every warp two prmt a MMA; "+rot" (plain NVFP4)
decodes each pair's sign bits from one rotation of the word, two instructions a word fewer):
x's CTA range copied to shared memory once and read from there by the MMAs, on CTAs of one warp along K (`xsmem_cta`
on "auto", which gives plain NVFP4 "+xperm+rot" on 1 x 16 x 1 and "+rot" on 1 x 8 x 1, `xsmem_auto_spec`; else a
forced CTA shape RTxWNx1: FA4_INDUCTOR_W4A16_CTA or `cta`); the split count is raised until a CTA's range of x fits
XSMEM_BUDGET (`xsmem_plan`), and variants are compiled per power of two of x's steps.

Packed NVFP4 (`pack`, off by default; FA4_INDUCTOR_W4A16_PACK=1 or the matmul's `pack=True`): the weight and its
block scales are rewritten once per weight and x dtype (`pack_nvfp4`, `prepared_weights` kind ("w4a16_nvfp4_packed",
dtype), rebuilt when the weight or its scale tensor changes) into a layout the kernel decodes with fewer
instructions (`cute/w4a16_decode_gemm.py`, "Decode"): each word's codes permuted, the block scales re-encoded with
their signs folded into the codes (zero scales zero the codes). Same bytes as the plain layout; the results equal
the plain variant's up to the fp32 summation order (the MMAs take the k values in another order). The scales must
stay the same memory between calls (the tensor or a view of it: the entry holds the one it was built from); scales
in new memory each call would repack each call, and under CUDA-graph capture that is refused. H200 (session 11,
CUDA-graph medians, x bf16, M = 1 / 8): 8192 x 8192 20.6 / 22.8 us packed against 19.3 / 24.1 plain, 2048 x 8192
6.9 / 10.3 against 6.8 / 9.9, 8192 x 2048 6.6 / 8.8 against 7.1 / 8.7, 2048 x 2048 2.9 / 3.7 against 3.0 / 3.9:
13% fewer instructions a MMA (sass_stats) move the time by -7..+7%, so plain stays the default. `pack="tiles"`
(FA4_INDUCTOR_W4A16_PACK=tiles; register load path only) also stores the packed words in 16-row tiles
(`tile_words`), so a warp's step reads 2 KB back to back instead of 128-byte runs of 32 rows: as fast again (8192 x
8192 20.1 / 23.4 us, 2048 x 8192 6.7 / 10.2, 8192 x 2048 6.7 / 8.8, 2048 x 2048 2.9 / 3.7), so the run length of the
weight reads is not what holds the kernel either.

PDL (on; FA4_INDUCTOR_W4A16_PDL=0 turns it off): the main kernel is launched as a programmatic dependent, so in
a run of these GEMMs (q, k, v; gate, up; chains) each one's first weight loads overlap the previous one's tail
(`W4A16DecodeGemm`'s docstring says why that is safe). H200: 2048 x 2048 at M = 1 2.9 against 4.0 us in a
graph of back-to-back calls; Llama-1B NVFP4 decode 1.136 against 1.160 ms/token (docs/benchmarks.md). A split
call's reduce kernel is launched as the main kernel's programmatic dependent too (`cute/w4a16_splitk_reduce.py`): its
launch overlaps the main kernel (H100, session 46: 1.1-1.6 us less a split call).

CUDA-core GEMV (`cute/w4a16_gemv.py`): calls with M <= GEMV_AUTO_ROWS (NVFP4 in the plain layout, int8) go to a
GEMV on CUDA cores instead (FA4_INDUCTOR_W4A16_GEMV: auto, the default; on: M <= 4; off: never; the matmuls' `gemv`
argument overrides it): 4-warp CTAs of up to 4 rows a warp, each lane reading 16-byte pieces of its rows (512
contiguous bytes a warp and row), fp32 FMAs, shuffles and shared memory for the sums, no split-K kernel (`gemv_shape`:
K split inside the CTA and fewer rows a warp for weights with few rows). `splits`, `cta` and `load` do not apply to
it. Its variants are keyed by `_GemvKey` (x dtype, format, M, bias, arch, rows a warp, K warps, PDL, scale dtype,
register cap) in `compiled_gemv`. H200 (docs/benchmarks.md session 13, `tests/bench_w4a16.py --gemv off,on`), us at
M = 1, tensor cores / GEMV: NVFP4 2048 x 8192 6.6 / 5.9, 2048 x 2048 2.9 / 2.5, 512 x 2048 2.3 / 1.8, 8192 x 2048
6.9 / 6.9, 14336 x 4096 20.6 / 17.1, 8192 x 8192 19.1 / 20.1 (the one loss); int8 8192 x 8192 22.5 / 20.6, 8192 x 2048
8.8 / 6.3, 2048 x 8192 8.2 / 7.7, 512 x 2048 2.4 / 1.6. At M = 2 it wins only on the 4096-column shapes the tensor-core
kernel tiles poorly, and at M = 4 on 512 x 2048 int8 alone (8192 x 8192 NVFP4 21.3 / 34.4), hence GEMV_AUTO_ROWS = 1.

Compilation: one main variant per (x dtype, format, x row groups (M <= 8, M <= 16), CTA shape, split or not,
bias or not, PDL or not, arch, load path) and one reduce variant per (x dtype, format, bias or not, arch), kept
for the process in `compiled` (`cute/compile_utils.py`). Call `warmup` (or one eager call per shape) before
capturing a CUDA graph.
"""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import int8_int_gemv, layout, nvfp4_int_gemv, prepared_weights, switches
from .cute import compile_utils

FORMATS = ("nvfp4", "int8", "fp8")
GEMV_FORMATS = ("nvfp4", "int8")  # the CUDA-core and integer GEMVs; fp8 runs on the tensor cores at every M
DTYPES = layout.HALF_DTYPES
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
M_BUCKETS = (8, 16)
MAX_M = M_BUCKETS[-1]
ALIGN_BYTES = layout.ALIGN_BYTES
CHUNK_VALUES = {"nvfp4": 64, "int8": 32, "fp8": 32}  # weights per 32-byte chunk of a row
K_MULTIPLE = 16
MIN_STEPS = 2  # steps (4 chunks a row) per warp in a split
STEP_CHUNKS = 4  # chunks of a row a warp's step covers (the kernel's LANES_K)
MAX_SPLITS = 32
BULK_OPTIONS = ("ahead", "prefetch", "scales")  # "bulk+ahead", "bulk+prefetch+scales", ...
NVFP4_ONLY = ("prefetch", "scales")  # options about block scales: dropped for int8
ROLLING_CTAS = 2  # "rolling+2ctas": registers capped so that two CTAs fit a SM
AUTO_LOAD = "auto"
ROLLING_MAX_NARROW_K = 4096
"""The load path "auto" (the default) picks per call (`auto_load`): at 9..16 rows "rolling" on CTAs of several row tiles a
warp (`WIDE`, `PACKED_WIDE`), "rolling+2ctas" on the others; up to 8 rows "rolling" on CTAs of more than 16 rows and, for int8, on
16-row ones over K <= ROLLING_MAX_NARROW_K, else "registers" (NVFP4 on 16-row CTAs was measured over K = 8192 only,
where rolling is slower). H100, docs/benchmarks.md session 36, two runs, us, registers / rolling / rolling+2ctas:
NVFP4 at 16 rows (1 x 2 x 4 CTAs) 8192 x 8192 49.8 / 49.1-62.2 / 46.7, 8192 x 2048 16.6 / 16.0 / 14.1, 14336 x 4096
53.5 / 52.8 / 47.6, int8 8192 x 8192 34.6 / 42.6 / 33.0, 8192 x 2048 12.9 / 13.3 / 12.0; at 2..8 rows NVFP4 (64-row
CTAs) 8192 x 8192 21.7-25.3 against 21.0-23.4 rolling, 8192 x 2048 8.2-9.6 against 7.1-8.5, int8 (16-row CTAs) 8192 x
2048 10.0-10.7 against 7.9-8.1, 14336 x 4096 26.2 / 28.1 against 23.9 / 24.9, but 4096 x 14336 24.2-25.6 against
25.6-26.8 and 2048 x 8192 9.7 / 10.2 against 10.1 / 10.6 (and NVFP4 there, 7.4 / 10.5 against 7.8 / 11.1): the
register path. Session 37 (H100): NVFP4 at 16 rows on 2 x 2 x 4 CTAs, rolling / rolling+2ctas: 8192 x 8192 32.3 /
42.8, 8192 x 2048 10.6 / 12.3, 14336 x 4096 32.9 / 35.0, 4096 x 14336 33.9 / 39.3."""
XSMEM = "xsmem"
XSMEM_SETS = 2  # "xsmem" without a depth: two register sets of weights (loaded a step ahead, as "registers")
XSMEM_BURST = 4  # "xsmem+prefetch": steps of each weight row requested into L2 at once (`prefetch_burst`)
XSMEM_PARTS = 1  # "xsmem" without "+parts<n>": x's shared copy waited for whole before the first MMA
XSMEM_BUDGET = 226 * 1024  # x's shared copy, the CTA's K range of it (`xsmem_max_steps`):
# split K further past this; the last KB of SMEM_LIMIT holds the (one-word) K-slice buffer and the mbarriers
BULK_SMEM_BUDGET = 200 * 1024  # the bulk ring's default depth fills this (one CTA a SM: its registers)
SMEM_LIMIT = 227 * 1024  # sm90's shared memory a CTA can opt into
MAX_STAGES = 16


_name = layout.dtype_name


def unsupported_reason(x2d: Tensor, fmt: str, n: int, k: int) -> str | None:
    """Why the kernel cannot multiply x2d [M, k] by a weight of `fmt` with n rows, or None if it can."""
    if fmt not in FORMATS:
        return f"the W4A16 decode GEMM takes formats {', '.join(FORMATS)}, not {fmt!r}"
    if x2d.device.type != "cuda":
        return f"the W4A16 decode GEMM runs on CUDA, not {x2d.device.type}"
    if x2d.dtype not in DTYPES:
        return f"the W4A16 decode GEMM takes float16 / bfloat16 x, not {_name(x2d.dtype)}"
    major, minor = switches.capability(x2d.device.index)
    if major != 9:
        return f"the W4A16 decode GEMM is built for sm90; this GPU is sm{major}{minor}"
    return shape_reason(x2d.dim(), x2d.shape[0] if x2d.dim() == 2 else 0, n, k)


def shape_reason(dim: int, m: int, n: int, k: int) -> str | None:
    """The shape half of `unsupported_reason` (a pure function)."""
    if dim != 2:
        return f"x must be 2-D [M, K], got {dim}-D"
    if not 1 <= m <= MAX_M:
        return f"the W4A16 decode GEMM takes 1..{MAX_M} rows of x, got {m}"
    if k % K_MULTIPLE or k <= 0:
        return f"the W4A16 decode GEMM needs K a positive multiple of {K_MULTIPLE}; K is {k}"
    if n <= 0:
        return "the weight has no rows"
    return None


def m_bucket(m: int) -> int:
    return next(b for b in M_BUCKETS if b >= m)


def padded_k(fmt: str, k: int) -> int:
    step = CHUNK_VALUES[fmt]
    return -(-k // step) * step


class CtaShape(NamedTuple):
    row_tiles: int  # tiles of 16 weight rows a warp
    warps_n: int
    warps_k: int

    @property
    def rows(self) -> int:
        return 16 * self.row_tiles * self.warps_n


NARROW = CtaShape(1, 1, 8)
WIDE = CtaShape(2, 2, 4)  # 2 x 4 warps of 2 row tiles: x read once for 32 rows a warp
HALF_WIDE = CtaShape(1, 2, 4)
PACKED_WIDE = CtaShape(4, 1, 8)  # 8 warps along K of 4 row tiles: the packed layout at 9..16 rows
XSMEM_WIDE = CtaShape(1, 16, 1)  # the xsmem path (one K warp: x from shared memory), N >= XSMEM_MIN_N: 256-row CTAs of
# 16 warps of one row tile (109 registers at 16 rows: 16 warps a SM, where 2 x 8 x 1 at 190 registers has 8)
XSMEM_NARROW = CtaShape(1, 8, 1)  # N < XSMEM_MIN_N: 128-row CTAs, eight warps of one row tile
XSMEM_MIN_N = XSMEM_MIN_K = 4096
XSMEM_NARROW_MIN_N = XSMEM_NARROW_SHORT_K = 2048  # from this many rows, narrow weights take 1 x 8 x 1 from this K
XSMEM_LONG = 14336  # weights this long along N or K (N >= XSMEM_MIN_N) take XSMEM_WIDE at any K


def xsmem_at_few_rows(m: int, pack=False) -> bool:
    """Whether a call of m <= 8 rows may take the xsmem path on "auto" (`xsmem_cta`): 2..8 rows (one row is the
    GEMVs'), plain layout."""
    return m > GEMV_AUTO_ROWS and not pack


def auto_ctas(m: int, pack=False, fmt: str = "nvfp4") -> tuple[CtaShape, ...]:
    """The CTA shapes `cta_shape` picks from at m rows (NVFP4 in layout `pack`), widest first, then those `xsmem_cta`
    may give calls of `fmt` weights."""
    if m_bucket(m) <= 8:
        return (WIDE, NARROW, *((XSMEM_WIDE,) if fmt == "nvfp4" and xsmem_at_few_rows(m, pack) else ()))
    xsmem = {"nvfp4": (XSMEM_WIDE, XSMEM_NARROW) if pack != "tiles" else (), "int8": (XSMEM_NARROW,)}.get(fmt, ())
    return (PACKED_WIDE if pack is True else WIDE), HALF_WIDE, NARROW, *xsmem


def wide_ctas_fill_one_wave(n: int, num_sms: int) -> bool:
    """Whether an n-row weight's WIDE CTAs (64 rows) make one wave of more than three quarters of the SMs, unsplit:
    where 2..8 rows keep them (`xsmem_cta`)."""
    return 3 * num_sms < 4 * -(-n // WIDE.rows) <= 4 * num_sms


def xsmem_cta(n: int, m: int, k: int, num_sms: int, pack=False, fmt: str = "nvfp4") -> Optional[CtaShape]:
    """The CTA of one K warp that calls take on the "auto" load path (x from shared memory, `xsmem_plan`), else None.

    NVFP4, 9..16 rows: 1 x 16 x 1 over weights of at least XSMEM_MIN_N rows with K >= XSMEM_MIN_K, or either side at
    least XSMEM_LONG; 1 x 8 x 1 over fewer rows with K >= XSMEM_MIN_K, or from XSMEM_NARROW_MIN_N rows with K >=
    XSMEM_NARROW_SHORT_K. 2..8 rows (plain layout; one row is the GEMVs'): 1 x 16 x 1 over the same wide weights, but
    for those whose 64-row CTAs fill one wave of the SMs (`wide_ctas_fill_one_wave`: 8192 rows on 132 SMs). int8,
    9..16 rows: 1 x 8 x 1 over fewer than XSMEM_MIN_N rows with K >= XSMEM_MIN_K.

    Measured (CUDA-graph medians, us, plain layout unless said; docs/benchmarks.md). H100, session 46 run 5, 16 rows,
    xsmem 2 x 8 x 1 / 2 x 4 x 1 against the rolling path on 2 x 2 x 4: 8192 x 8192 24.7 / 31.7, 14336 x 4096 24.7 /
    32.6, 4096 x 14336 25.6 / 31.3. H100, session 49 runs 3-4, xsmem on 1 x 16 x 1 / 2 x 8 x 1 / 2 x 4 x 1 at 16 rows:
    8192 x 8192 24.0 / 24.9 / 28.8 (packed 23.4 / 27.4 / 31.9), 4096 x 14336 22.0 / 22.2 / 26.3 (packed 21.0 / 24.4 /
    27.3), 14336 x 4096 24.1 / 24.7 / 24.9, 4096 x 4096 10.1 / 9.9 / 10.8, 128256 x 4096 134.6 / 138.9, 128256 x 2048
    76.4 / 77.8 (int8 3-6% faster on 1 x 16 x 1 throughout); long weights at K = 2048 against the former rule (2 x 2 x
    4 rolling), 16 / 9 rows: 128256 x 2048 77.0 / 74.7 against 155.5 / 125.7, 14336 x 2048 15.6 / 14.2 against 19.6 /
    17.0; 8192 x 2048 keeps the former (xsmem 11.6 against 10.6, session 46). 5 / 8 rows, 1 x 16 x 1 against the
    former rule: 128256 x 2048 63.9 / 64.7 against 94.5 / 108.0, 4096 x 14336 19.4 / 19.6 against 21.4 / 22.6, 14336 x
    4096 20.1 / 20.3 against 21.1 / 21.2 (2 x 8 x 1), 4096 x 4096 8.5 / 9.5 against 10.1 / 10.4, 14336 x 2048 12.8 /
    12.9 against 13.9 / 15.2; 8192 x 8192 22.1 / 23.0 against 21.2 / 22.4 and 8192 x 2048 8.7 / 8.9 against 7.6 / 8.4
    (one wave of 128 CTAs: kept). 2 / 4 rows (session 50 run 4, "xsmem+xperm+rot" against the former rule's 2 x 2 x
    4): 128256 x 2048 63.3 / 63.7 against 80.5 / 89.1, 128256 x 4096 123.2 / 118.3 against 151.2 / 156.6, 4096 x
    14336 19.2 / 19.5 against 20.6 / 21.3, 14336 x 4096 19.6 / 19.7 against 20.4 / 21.3; 8192 x 8192 21.5 / 21.8
    against 20.2 / 21.3 (kept). Narrow weights at 9..16 rows, 1 x 8 x 1 against the former rule (16 / 9 rows):
    NVFP4 2048 x 2048 5.5 / 5.3 against 7.4 / 5.8 (session 48; bf16 6.6), 1024 x 4096 5.4 / 5.4 against 8.0 / 6.5 (bf16
    7.7-9.8), 512 x 4096 5.1 / 4.9 against 7.7 / 6.3 (bf16 7.6: the former rule was slower); 512 x 2048 and 1024 x 2048
    keep the former (4.7 / 3.9 against 5.1 / 4.9). int8 1024 x 4096 5.1 / 5.0 against 6.4 / 5.7, 512 x 4096 4.4 / 4.3
    against 5.7 / 5.2, 1024 x 14336 9.8 / 9.5 against 11.8 / 11.3, 2048 x 14336 17.4 / 16.6 against 18.7 / 17.8; at K =
    2048 even or worse (2048 x 2048 at 9 rows 4.9 against 4.7)."""
    if pack == "tiles" or fmt not in ("nvfp4", "int8"):
        return None
    if fmt == "int8":
        return XSMEM_NARROW if m_bucket(m) > 8 and n < XSMEM_MIN_N and k >= XSMEM_MIN_K else None
    wide = n >= XSMEM_MIN_N and (k >= XSMEM_MIN_K or max(n, k) >= XSMEM_LONG)
    if m_bucket(m) <= 8:
        few_rows = xsmem_at_few_rows(m, pack) and wide and not wide_ctas_fill_one_wave(n, num_sms)
        return XSMEM_WIDE if few_rows else None
    if n < XSMEM_MIN_N:
        narrow = k >= XSMEM_MIN_K or n >= XSMEM_NARROW_MIN_N and k >= XSMEM_NARROW_SHORT_K
        return XSMEM_NARROW if narrow else None
    return XSMEM_WIDE if wide else None


def cta_shape(n: int, m: int, num_sms: int, forced: Optional[tuple[int, int, int]] = None, fmt: str = "nvfp4",
              pack=False, k: Optional[int] = None) -> CtaShape:
    """The CTA shape for an n-row weight: `forced` (FA4_INDUCTOR_W4A16_CTA, tests, tuning) if given; else for NVFP4
    the widest of `auto_ctas` whose CTAs cover a quarter of the SMs (Llama-1B's 2048- and 512-row projections: 128 /
    32 CTAs of 16 rows instead of 32 / 8 of 64); int8 narrow (where `xsmem_cta` gives none). H200, docs/benchmarks.md
    session 10 run 2: narrow is 1.3-1.8x faster on 2048 x 2048, 512 x 2048 and 2048 x 8192, wide 1.3x faster for NVFP4
    on 8192 x 2048 and 8192 x 8192 (the narrow NVFP4 CTA decodes x's columns for half the rows) and on 4096 x 14336 at
    M = 8; int8 narrow is as fast or faster on every row. At 9..16 rows (H100, session 37, the rolling load path) 2 x 2
    x 4 CTAs take 8192 x 8192 in 32.3 us against 46.3 on 1 x 2 x 4 ones (8192 x 2048 10.6 / 14.1, 14336 x 4096 32.9 /
    46.7, 4096 x 14336 33.9 / 40.4): x's loads serve twice the weight rows. 1 x 2 x 4 is kept where 2 x 2 x 4 CTAs
    would be too few (2048 x 8192, as measured before). The packed layout (`pack` True) takes 4 x 1 x 8 there instead
    (session 37 run 5, rolling, packed on 4 x 1 x 8 / on 2 x 2 x 4: 8192 x 8192 28.5 / 34.3, 8192 x 2048 10.6 / 11.3,
    14336 x 4096 29.8 / 34.4, 4096 x 14336 31.1 / 34.7; 212 registers without spills, 11.3 instructions a MMA). `k`
    (the padded K, given on the "auto" load path): `xsmem_cta` first."""
    if forced is not None:
        return CtaShape(*forced)
    xsmem = None if k is None else xsmem_cta(n, m, k, num_sms, pack, fmt)
    if xsmem is not None:
        return xsmem
    if fmt != "nvfp4":
        return NARROW
    return next(shape for shape in auto_ctas(m, pack) if shape == NARROW or 4 * -(-n // shape.rows) > num_sms)


def num_splits(n: int, k_padded: int, fmt: str, shape: CtaShape, num_sms: int) -> int:
    """Split-K count for an [n, k_padded] weight: none once the row CTAs cover half the SMs, else about one CTA
    per SM, each split keeping MIN_STEPS steps (4 chunks a row) per warp. H200 sweep of the wide shape
    (docs/benchmarks.md, session 8): 8192 x 8192 and 8192 x 2048 fastest unsplit, 4096 x 14336 with 2,
    2048 x 8192 with 4."""
    row_ctas = -(-n // shape.rows)
    if 2 * row_ctas >= num_sms:
        return 1
    chunks = k_padded // CHUNK_VALUES[fmt]
    want = round(num_sms / row_ctas)
    return max(1, min(want, chunks // (4 * shape.warps_k * MIN_STEPS), MAX_SPLITS))


@functools.cache
def parse_load(spec: str) -> tuple[str, Optional[int]]:
    """A load path's spec -> (path, ring depth or None): "registers" (option "+rot": the rotated NVFP4 decode,
    `nvfp4_rotated_pair`), "rolling" (options "+2ctas": registers capped for ROLLING_CTAS CTAs a SM, then "+rot"), or
    "bulk" with options "+ahead", "+prefetch" (in this order) and a ring depth ":<stages>" ("bulk+prefetch:4"); the
    path keeps the options."""
    path, colon, depth = spec.strip().partition(":")
    base, *options = path.split("+")
    in_order = set(options) <= set(BULK_OPTIONS) and options == sorted(set(options), key=BULK_OPTIONS.index)
    bulk_only = (not options or in_order) and (not colon or (depth.isdigit() and int(depth) >= 1))
    unrotated = options[:-1] if options[-1:] == ["rot"] else options
    rolling = base == "rolling" and unrotated in ([], [f"{ROLLING_CTAS}ctas"])
    xsmem_opts = xsmem_options(options) if base == XSMEM else None
    xsmem = xsmem_opts is not None and (not colon or depth.isdigit() and int(depth) >= 2) and (
        xsmem_opts.burst % (int(depth) if colon else XSMEM_SETS) == 0)
    if (base == "registers" and not unrotated or rolling) and not colon or base == "bulk" and bulk_only or xsmem:
        return path, int(depth) if depth else None
    raise ValueError(f"the W4A16 decode GEMM's load path ({switches.W4A16_LOAD} or `load`) is registers, rolling, "
                     f"rolling+{ROLLING_CTAS}ctas, bulk, bulk with options "
                     f"{', '.join('+' + o for o in BULK_OPTIONS)} (in this order) and a ring depth (bulk+prefetch:4), "
                     f"or {XSMEM} (options +{ROLLING_CTAS}ctas, +prefetch[<steps>], a multiple of the register sets, "
                     f"+parts<n> or +xperm, +rot, in this order) with its weights' register sets (>= 2: {XSMEM}:3); "
                     f"registers and rolling also take +rot; got {spec!r}")


class XsmemOptions(NamedTuple):
    capped: bool  # registers capped for ROLLING_CTAS CTAs a SM
    burst: int  # steps of each weight row requested into L2 at once, or 0
    parts: int  # parts x's shared copy lands in, each waited for on its own
    permute: bool = False  # x's shared copy rewritten once into the MMA's operand pairs (plain NVFP4)
    rotate: bool = False  # the plain NVFP4 decode's signs from one rotation of the word (`nvfp4_rotated_pair`)


def xsmem_options(options: list[str]) -> Optional[XsmemOptions]:
    """The xsmem path's options, or None when they are not its: "+2ctas", then "+prefetch" (XSMEM_BURST steps) or
    "+prefetch<steps>", then "+parts<n>" (n >= 1; XSMEM_PARTS without it) or "+xperm", then "+rot"."""
    capped = options[:1] == [f"{ROLLING_CTAS}ctas"]
    rest = options[1:] if capped else options
    burst = re.fullmatch(r"prefetch(\d*)", rest[0]) if rest else None
    steps = int(burst.group(1) or XSMEM_BURST) if burst else 0
    rest = rest[1:] if burst else rest
    parts = re.fullmatch(r"parts(\d+)", rest[0]) if rest else None
    n_parts = int(parts.group(1)) if parts else XSMEM_PARTS
    rest = rest[1:] if parts else rest
    permute = rest[:1] == ["xperm"] and n_parts == 1
    rest = rest[1:] if permute else rest
    rotate = rest[:1] == ["rot"]
    rest = rest[1:] if rotate else rest
    if rest or burst and steps < 1 or n_parts < 1:
        return None
    return XsmemOptions(capped, steps, n_parts, permute, rotate)


def configured_load() -> str:
    """The load path calls get without a `load` argument: FA4_INDUCTOR_W4A16_LOAD, else "auto" (`auto_load`)."""
    spec = switches.current().w4a16_load or AUTO_LOAD
    if spec != AUTO_LOAD:
        parse_load(spec)
    return spec


def auto_load(m: int, k: int, cta: CtaShape, fmt: str, pack=False) -> str:
    """The load path "auto" gives a call of m rows over K = k of `fmt` weights (NVFP4 in layout `pack`) on CTAs of
    shape `cta` (ROLLING_MAX_NARROW_K); CTAs of one K warp take x from shared memory (`xsmem_auto_spec`)."""
    if cta.warps_k == 1:
        return xsmem_auto_spec(cta, fmt, pack)
    if m_bucket(m) > 8:
        return "rolling" if cta.row_tiles > 1 else f"rolling+{ROLLING_CTAS}ctas"
    wide_cta = cta.rows > NARROW.rows
    return "rolling" if wide_cta or fmt == "int8" and k <= ROLLING_MAX_NARROW_K else "registers"


def xsmem_auto_spec(cta: CtaShape, fmt: str, pack=False) -> str:
    """The xsmem spec "auto" gives CTAs of one K warp: for plain NVFP4 the rotated decode ("+rot"), on XSMEM_WIDE
    with x's copy permuted for the MMAs too ("+xperm"); plain "xsmem" for the others, which neither option changes.

    H100, docs/benchmarks.md session 50 run 1, us, xsmem / +xperm / +rot / +xperm+rot. 1 x 16 x 1 at 16 / 9 / 8 / 5
    rows: 8192 x 8192 at 16 rows 24.7 / 24.2 / 24.7 / 24.5 (24.7 / 24.1 in run 3), 14336 x 4096 at 9 22.3 / 21.7 /
    22.3 / 21.4, 4096 x 14336 at 16 22.2 / 22.0 / 22.3 / 21.7, 128256 x 2048 at 16 78.6 / 75.2 / 77.9 / 74.1, at 9
    74.2 / 72.8 / 74.4 / 71.5; at 5..8 rows "+rot" and both are 1-3% ahead, "+xperm" alone even. 1 x 8 x 1 at 16 / 9
    rows: 2048 x 8192 10.2 / 9.9 / 9.2 / 9.5 and 8.9 / 9.1 / 8.9 / 9.1, 1024 x 4096 5.5 / 5.6 / 5.5 / 5.7 and 5.4 /
    5.4 / 5.1 / 5.2, 2048 x 2048 5.5 / 5.5 / 5.5 / 5.6: there the permuting pass costs what it saves."""
    if fmt != "nvfp4" or pack:
        return XSMEM
    return f"{XSMEM}+xperm+rot" if cta == XSMEM_WIDE else f"{XSMEM}+rot"


def resolve_load(spec: str, m: int, k: int, cta: CtaShape, fmt: str, pack=False) -> str:
    """A call's load path: `spec`, or `auto_load`'s for "auto"."""
    return auto_load(m, k, cta, fmt, pack) if spec == AUTO_LOAD else spec


def _bulk_layout(m_max: int, cta: CtaShape, scales: bool = False):
    """(stage, reduction words) of the bulk variants at this M bucket and CTA shape (`scales`: block scales in
    the stage)."""
    from .cute.w4a16_decode_gemm import BulkStage, reduction_words

    return BulkStage(cta.rows, cta.warps_k, scales), reduction_words(cta.row_tiles, m_max // 8, cta.warps_n,
                                                                     cta.warps_k)


@functools.cache
def bulk_stages(m_max: int, cta: CtaShape, requested: Optional[int] = None, scales: bool = False) -> int:
    """The bulk ring's depth: `requested`, which must fit SMEM_LIMIT, or the deepest (up to MAX_STAGES) that
    fits BULK_SMEM_BUDGET. Wide CTAs, M <= 8: 33 KB a stage (64 rows x 528 bytes), 5 stages; M <= 16: 16.5 KB,
    11 (+scales: 64 or 32 rows x 80 bytes more a stage: 5 and 10); narrow CTAs: 16 rows x 1040 bytes."""
    from .cute.w4a16_decode_gemm import bulk_smem_bytes

    stage, red_words = _bulk_layout(m_max, cta, scales)
    if requested is not None:
        if bulk_smem_bytes(stage, requested, red_words) > SMEM_LIMIT:
            raise ValueError(f"a {requested}-stage bulk ring at M <= {m_max} needs "
                             f"{bulk_smem_bytes(stage, requested, red_words)} bytes of shared memory, over "
                             f"sm90's {SMEM_LIMIT}")
        return requested
    return max(s for s in range(1, MAX_STAGES + 1) if bulk_smem_bytes(stage, s, red_words) <= BULK_SMEM_BUDGET)


@functools.cache
def load_key(spec: str, m_max: int, fmt: str, cta: CtaShape) -> str:
    """The `_Key.load` of a spec for `fmt`: "registers", "rolling", the bulk path (without the NVFP4-only
    options for int8) with its depth resolved ("bulk:5"), or the xsmem path with its register sets ("xsmem:2")."""
    path, depth = parse_load(spec)
    if is_xsmem(spec):
        return f"{path}:{depth or XSMEM_SETS}"
    if not path.startswith("bulk"):
        return path
    path = "+".join(p for p in path.split("+") if fmt == "nvfp4" or p not in NVFP4_ONLY)
    return f"{path}:{bulk_stages(m_max, cta, depth, 'scales' in path.split('+'))}"


def is_xsmem(spec: str) -> bool:
    return spec != AUTO_LOAD and parse_load(spec)[0].split("+")[0] == XSMEM


def xsmem_max_steps(m_max: int, fmt: str) -> int:
    """The most steps (4 chunks) of x's rows a CTA on the "xsmem" path copies to shared memory (a power of two)."""
    from .cute.w4a16_decode_gemm import XSmemLayout

    x_words = CHUNK_VALUES[fmt] // 2
    steps = 2
    while XSmemLayout.bytes(2 * steps, x_words, m_max // 8) <= XSMEM_BUDGET:
        steps *= 2
    return steps


def xsmem_buckets(spec: str, m: int, fmt: str, cta: CtaShape) -> tuple[int, ...]:
    """The x_steps a call on load path `spec` can take (`xsmem_plan`): (0,) off the "xsmem" path, every power of two
    up to `xsmem_max_steps` on it (CTAs of one K warp only)."""
    if not is_xsmem(spec):
        return (0,)
    if cta.warps_k != 1:
        raise ValueError(f"the {XSMEM} load path takes CTAs of one warp along K: set {switches.W4A16_CTA}=RTxWNx1")
    return tuple(2 ** i for i in range(1, xsmem_max_steps(m_bucket(m), fmt).bit_length()))


def xsmem_plan(m: int, n: int, k_padded: int, fmt: str, shape: CtaShape, num_sms: int,
               splits: Optional[int]) -> tuple[int, int]:
    """(splits, x_steps) of an "xsmem" call: `splits` or `num_splits`', raised until each CTA's K range of x fits
    `xsmem_max_steps`; x_steps the power of two (>= 2) of steps its shared copy holds."""
    if shape.warps_k != 1:
        raise ValueError(f"the {XSMEM} load path takes CTAs of one warp along K (RTxWNx1), not {shape}")
    chunks = k_padded // CHUNK_VALUES[fmt]
    most = xsmem_max_steps(m_bucket(m), fmt)
    steps = lambda s: math.ceil(math.ceil(chunks / s) / STEP_CHUNKS)  # noqa: E731  (the longest CTA range, in steps)
    if splits is None:
        splits = num_splits(n, k_padded, fmt, shape, num_sms)
        while steps(splits) > most:
            splits += 1
    elif steps(splits) > most:
        raise ValueError(f"{splits} splits leave {steps(splits)} steps of x a CTA; the {XSMEM} path holds {most}")
    x_steps = 2
    while x_steps < steps(splits):
        x_steps *= 2
    return splits, x_steps


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# ---------------------------------------------------------------------------------------------
# Layout (plain PyTorch; the CPU tests check it)
# ---------------------------------------------------------------------------------------------


def _aligned(t: Tensor, align: int = ALIGN_BYTES) -> bool:
    """Row-major with rows back to back (checked even for one row, where `is_contiguous` ignores the row
    stride) and an `align`-byte aligned start."""
    return t.stride() == (t.shape[1], 1) and t.data_ptr() % align == 0


def _pad_cols(t: Tensor, cols: int, align: int = ALIGN_BYTES) -> Tensor:
    """t [R, C] as a row-major aligned [R, cols] tensor, zeros past C: t itself (or a view) when it already is one."""
    t = layout.contiguous_strides(t)
    if t.shape[1] == cols and _aligned(t, align):
        return t
    if t.shape[1] == cols:
        return t.new_empty(t.shape).copy_(t)
    out = t.new_zeros(t.shape[0], cols)
    out[:, : t.shape[1]] = t
    return out


def nvfp4_words(w_fp4: Tensor) -> Tensor:
    """w_fp4 [N, K/2] bytes as the kernel reads them: int32 [N, Kp/8] (8 codes a word, code j in bits
    4j..4j+3), K padded to a multiple of 64 with zero codes. A view when nothing needs padding."""
    w = w_fp4.view(torch.uint8) if w_fp4.dtype != torch.uint8 else w_fp4
    kp = padded_k("nvfp4", 2 * w.shape[1])
    return _pad_cols(w, kp // 2).view(torch.int32)


def nvfp4_block_words(w_block_scale: Tensor, k: int) -> Tensor:
    """The e4m3 block scales [N, K/16] as int32 [N, Kp/64] (block 4c + b in byte b of word c)."""
    kp = padded_k("nvfp4", k)
    return _pad_cols(w_block_scale.view(torch.uint8), kp // layout.NVFP4_BLOCK, align=4).view(torch.int32)


def byte_words(codes: Tensor) -> Tensor:
    """One-byte codes [N, K] (int8 or fp8) as int32 [N, Kp/4] (4 codes a word, code j in byte j), K padded to 32."""
    kp = padded_k("int8", codes.shape[1])
    return _pad_cols(codes.view(torch.int8), kp).view(torch.int32)


# ---- the kernel's decode, emulated bit for bit (the CPU tests hold it to the exact weights) ----


def _u32(t: Tensor) -> Tensor:
    return t.long() & 0xFFFFFFFF


def _shift(w: Tensor, s: int) -> Tensor:
    """The kernel's shift of int32 words (held as int64 unsigned): left, or arithmetic right."""
    if s >= 0:
        return (w << s) & 0xFFFFFFFF
    signed = torch.where(w >= 1 << 31, w - (1 << 32), w)
    return (signed >> -s) & 0xFFFFFFFF


def _halves(bits: Tensor, dtype: torch.dtype) -> Tensor:
    """uint32 words (int64) -> their two 16-bit floats as float64 [..., 2] (low half first)."""
    pairs = torch.stack([bits & 0xFFFF, bits >> 16], dim=-1)
    return pairs.to(torch.int32).to(torch.int16).view(dtype).double()


def _rounded(v: Tensor, dtype: torch.dtype) -> Tensor:
    return v.to(dtype).double()


def decode_nvfp4_words(words: Tensor, block_words: Tensor, k: int, dtype: torch.dtype = torch.bfloat16,
                       rotated: bool = False) -> Tensor:
    """float64 e2m1 * e4m3 [N, k] from the kernel's operands, decoded the kernel's way for x of `dtype`: the
    pair bits from shifts and the lop3 merge (`rotated`: the word's rotation, the lop3 and one shift or rotation,
    `nvfp4_rotated_pair`), times the block scale splat, rounded to `dtype` (the packed fma), times 2^E. Equal to the
    exact product iff the kernel's decode is exact."""
    from .cute import w4a16_decode_gemm as gemm

    f16 = dtype == torch.float16
    w = _u32(words.view(torch.int32))  # [N, W]
    n = w.shape[0]
    mag = gemm.nvfp4_magnitude_field(f16)
    vals = torch.empty(n, w.shape[1], 8, dtype=torch.float64)
    turned = gemm.rotl32(w, gemm.nvfp4_sign_rotation(f16)) if rotated else None
    for j in range(4):
        if rotated:
            sign_mask, select, final = gemm.nvfp4_rotated_pair(j, f16)
            merged = (w & select) | (turned & sign_mask & ~select & 0xFFFFFFFF)
            bits = _shift(merged, final) if final > 0 else gemm.rotl32(merged, final)
        else:
            mshift, sshift = gemm.nvfp4_shifts(j, f16)
            bits = (_shift(w, mshift) & mag) | (_shift(w & gemm.nvfp4_sign_mask(j, f16), sshift) & ~mag & 0xFFFFFFFF)
        vals[:, :, j], vals[:, :, j + 4] = _halves(bits, dtype).unbind(-1)
    b = _u32(block_words.view(torch.int32))
    scale_bytes = torch.stack([(b >> 8 * i) & 0xFF for i in range(4)], dim=-1).reshape(n, -1)  # [N, Kp/16]
    e4m3 = scale_bytes.to(torch.uint8).view(torch.float8_e4m3fn).double()
    splat = e4m3 * 2.0 ** (5 if f16 else 119)
    assert torch.equal(_rounded(splat, dtype), splat), "the block scale splat is not exact"
    codes = vals.reshape(n, -1)
    w_dec = _rounded(codes * splat.repeat_interleave(layout.NVFP4_BLOCK, dim=1), dtype)
    return (w_dec * 2.0 ** gemm.decode_exponent(f16))[:, :k]


def decode_int8_words(words: Tensor, k: int, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """float64 int8 codes [N, k] from the kernel's words, decoded the kernel's way for x of `dtype`."""
    w = _u32(words.view(torch.int32))
    n = w.shape[0]
    byte = torch.stack([(w >> 8 * i) & 0xFF for i in range(4)], dim=-1)  # [N, W, 4]
    if dtype == torch.float16:
        biased = ((byte ^ 0x80) | 0x6400).to(torch.int16).view(torch.float16).double()
        out = _rounded(biased - 1152.0, dtype)
    else:
        low = (byte & 0x7F) | 0x4300
        high = (byte & 0x80) | 0x4300
        as_bf16 = lambda v: v.to(torch.int16).view(torch.bfloat16).double()  # noqa: E731
        out = _rounded(as_bf16(low) - as_bf16(high), dtype)
    return out.reshape(n, -1)[:, :k]


def _f32_bits(bits: Tensor) -> Tensor:
    """uint32 words (int64) as fp32 values (float64 [...])."""
    return torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32).double()


def decode_nvfp4_gemv(words: Tensor, block_words: Tensor, k: int) -> Tensor:
    """float64 e2m1 * e4m3 [N, k] from the GEMV's operands (`cute/w4a16_gemv.py`), decoded its way: the bf16 pair
    bits and packed fma of `decode_nvfp4_words`, the lane's two block scales from the scale word shifted by 16 for odd
    pieces and splat by e4m3 -> f16 -> f32 * 2^119 -> bf16, each pair's halves read as fp32 (low << 16, high &
    0xFFFF0000), times 2^7. Equal to the exact product iff the GEMV's decode is exact."""
    from .cute import w4a16_decode_gemm as gemm, w4a16_gemv as gemv

    w = _u32(words.view(torch.int32))  # [N, W]
    n, nwords = w.shape
    mag = gemm.nvfp4_magnitude_field(False)
    pairs = torch.empty(n, nwords, 4, dtype=torch.int64)
    for j in range(4):
        mshift, sshift = gemm.nvfp4_shifts(j, False)
        signs = w & gemm.nvfp4_sign_mask(j % 2, False)
        pairs[:, :, j] = (_shift(w, mshift) & mag) | (_shift(signs, sshift) & ~mag & 0xFFFFFFFF)
    b = _u32(block_words.view(torch.int32))  # [N, Kp/64]
    piece = torch.arange(nwords // gemv.PIECE_WORDS)
    lane_word = _shift(b[:, piece >> 1], 0) >> 16 * (piece & 1) & 0xFFFF  # the splat reads the low 16 bits
    splats = []
    for byte in range(2):
        e4m3 = ((lane_word >> 8 * byte) & 0xFF).to(torch.uint8).view(torch.float8_e4m3fn)
        s = (e4m3.to(torch.float16).to(torch.float32) * 2.0 ** gemv.SPLAT_EXPONENT).to(torch.bfloat16)
        splats.append(s.double())
    block_of_word = torch.stack(splats, dim=-1).repeat_interleave(2, dim=-1).reshape(n, nwords)  # word i: block i // 2
    codes = torch.empty(n, nwords, 8, dtype=torch.float64)
    for j in range(4):
        lo, hi = _halves(pairs[:, :, j], torch.bfloat16).unbind(-1)
        low_bits = _u32(((lo * block_of_word).to(torch.bfloat16).view(torch.int16).long() & 0xFFFF) << 16)
        high_bits = _u32(((hi * block_of_word).to(torch.bfloat16).view(torch.int16).long() & 0xFFFF) << 16)
        codes[:, :, j] = _f32_bits(low_bits)
        codes[:, :, j + 4] = _f32_bits(high_bits & gemv.HIGH_HALF)
    return (codes.reshape(n, -1) * 2.0 ** gemm.decode_exponent(False))[:, :k]


def decode_int8_gemv(words: Tensor, k: int) -> Tensor:
    """float64 int8 codes [N, k] from the GEMV's words, decoded its way: prmt of the flipped byte under 0x4B0000,
    read as fp32, minus 2^23 + 128 in fp32."""
    from .cute import w4a16_gemv as gemv

    w = _u32(words.view(torch.int32)) ^ gemv.INT8_FLIP
    n = w.shape[0]
    bits = torch.stack([_prmt(w, gemv.INT8_HIGH, sel) for sel in gemv.INT8_SELECTORS], dim=-1)
    f = _f32_bits(bits).float()
    out = (f - torch.tensor(gemv.INT8_OFFSET, dtype=torch.float32)).double()
    return out.reshape(n, -1)[:, :k]


def _prmt(a, b, selector) -> Tensor:
    """PTX prmt.b32 (default mode) of uint32 words a and b (int64 tensors or ints) under `selector` (an int or a tensor
    of them: its low 16 bits): byte i of the result is byte (selector >> 4i) & 7 of b:a, or its sign replicated when
    bit 3 of that nibble is set."""
    a, b, selector = (torch.as_tensor(v, dtype=torch.int64) for v in (a, b, selector))
    a, b, selector = torch.broadcast_tensors(a, b, selector)
    out = torch.zeros_like(a)
    for i in range(4):
        nib = selector >> 4 * i & 0xF
        src = torch.where(nib & 7 < 4, a, b) >> 8 * (nib & 3) & 0xFF
        src = torch.where(nib & 8 != 0, torch.where(src & 0x80 != 0, 0xFF, 0), src)
        out |= src << 8 * i
    return out


# ---- the packed NVFP4 layout (`pack`): built once per weight, its decode emulated bit for bit ----


def _pack_scale_table(f16: bool) -> list[int]:
    """e4m3 byte -> the packed scale byte (E' << 3) | m, |e4m3| = (1 + m / 8) 2^(E' - 9); 0 for zero (the codes
    are zeroed), a NaN splat's byte for NaN."""
    table = []
    for byte in range(256):
        mag = byte & 0x7F
        if mag == 0:
            table.append(0)
        elif mag == 0x7F:
            table.append(0xA1 if f16 else 0x91)
        else:
            v = float(torch.tensor([mag], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
            m, e = math.frexp(v)  # v = m 2^e, m in [0.5, 1)
            mant = int((2 * m - 1) * 8)
            assert (1 + mant / 8) * 2.0 ** (e - 1) == v and 0 <= e - 1 + 9 <= 17
            table.append(((e - 1 + 9) << 3) | mant)
    return table


def _pack_bit_sources(f16: bool) -> list[tuple[int, int]]:
    """For each of a packed word's 32 bits, the (code of the word, bit of the code) it holds."""
    from .cute import w4a16_decode_gemm as gemm

    sources = [None] * 32
    for pair in range(4):
        for half in range(2):
            for bit, pos in enumerate(gemm.pack_positions(pair, f16)):
                sources[pos + 16 * half] = (2 * pair + half, bit)
    assert all(s is not None for s in sources)
    return sources


def _codes(w_fp4: Tensor) -> Tensor:
    """uint8 [N, K/2] -> int64 codes [N, K] (code 2i from the low nibble)."""
    w = (w_fp4.view(torch.uint8) if w_fp4.dtype != torch.uint8 else w_fp4).long()
    return torch.stack([w & 0xF, w >> 4], dim=-1).reshape(w.shape[0], -1)


def pack_nvfp4(w_fp4: Tensor, w_block_scale: Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
    """The packed layout of an NVFP4 weight for x of `dtype` (`pack`): (words int32 [N, Kp/8], block-scale words
    int32 [N, Kp/64]), K padded to 64 with zero codes. Word c of a row holds codes 8c..8c+7 in the bit places
    `_pack_bit_sources` gives; scale word c the packed bytes of blocks 4c..4c+3. Plain PyTorch, on the weight's
    device."""
    f16 = dtype == torch.float16
    n, k = w_fp4.shape[0], 2 * w_fp4.shape[1]
    kp = padded_k("nvfp4", k)
    device = w_fp4.device
    codes = torch.zeros(n, kp, dtype=torch.int64, device=device)
    codes[:, :k] = _codes(w_fp4)
    scale = torch.zeros(n, kp // layout.NVFP4_BLOCK, dtype=torch.int64, device=device)
    scale[:, : k // layout.NVFP4_BLOCK] = w_block_scale.view(torch.uint8).long()
    per_code = scale.repeat_interleave(layout.NVFP4_BLOCK, dim=1)
    codes = torch.where((per_code & 0x7F) == 0, 0, codes ^ ((per_code >> 7) << 3))
    table = torch.tensor(_pack_scale_table(f16), dtype=torch.int64, device=device)
    blocks = table[scale].to(torch.uint8).contiguous().view(torch.int32)
    codes = codes.reshape(n, kp // 8, 8)
    words = torch.zeros(n, kp // 8, dtype=torch.int64, device=device)
    for pos, (code, bit) in enumerate(_pack_bit_sources(f16)):
        words |= ((codes[:, :, code] >> bit) & 1) << pos
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return words, blocks


def unpack_nvfp4(words: Tensor, block_words: Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
    """`pack_nvfp4` undone: (w_fp4 uint8 [N, Kp/2], block scales float8_e4m3fn [N, Kp/16]). The same weights; the
    same bytes where every block scale is positive (a negative scale comes back positive with its block's code
    signs flipped, a zero scale as 2^-9 over zero codes, NaN as 0x7F)."""
    f16 = dtype == torch.float16
    w = _u32(words.view(torch.int32))
    n = w.shape[0]
    codes = torch.zeros(n, w.shape[1], 8, dtype=torch.int64, device=w.device)
    for pos, (code, bit) in enumerate(_pack_bit_sources(f16)):
        codes[:, :, code] |= ((w >> pos) & 1) << bit
    codes = codes.reshape(n, -1)
    w_fp4 = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    inverse = {b: byte for byte, b in reversed(list(enumerate(_pack_scale_table(f16)))) if byte < 0x80}
    inverse[0] = 0x01
    lut = torch.tensor([inverse.get(b, 0x7F) for b in range(256)], dtype=torch.uint8, device=w.device)
    scales = lut[block_words.contiguous().view(torch.uint8).long()].view(torch.float8_e4m3fn)
    return w_fp4, scales


def decode_packed_nvfp4_words(words: Tensor, block_words: Tensor, k: int, dtype: torch.dtype = torch.bfloat16
                              ) -> Tensor:
    """float64 e2m1 * e4m3 [N, k] from packed operands, decoded the packed kernel's way for x of `dtype`: each pair's
    shifts, masks and merge, the scale splat from the mad, the packed multiply rounded to `dtype`, times 2^E."""
    from .cute import w4a16_decode_gemm as gemm

    f16 = dtype == torch.float16
    w = _u32(words.view(torch.int32))
    n = w.shape[0]
    mag = gemm.nvfp4_magnitude_field(f16)
    vals = torch.empty(n, w.shape[1], 8, dtype=torch.float64)
    for pair, (mshift, sshift) in enumerate(gemm.PACK_PAIRS[f16]):
        if mshift == sshift:
            bits = _shift(w, mshift) & (mag | gemm.SIGN_FIELD)
        else:
            bits = (_shift(w, mshift) & mag) | (_shift(w, sshift) & gemm.SIGN_FIELD)
        vals[:, :, 2 * pair], vals[:, :, 2 * pair + 1] = _halves(bits, dtype).unbind(-1)
    mul, add = gemm.PACK_SCALE_SPLAT[f16]
    b = block_words.contiguous().view(torch.uint8).long()  # [N, Kp/16]
    splat = _halves((b * (mul | mul << 16) + add) & 0xFFFFFFFF, dtype)
    assert torch.equal(splat[..., 0], splat[..., 1]) or splat.isnan().any()
    per_code = splat[..., 0].repeat_interleave(layout.NVFP4_BLOCK, dim=1)
    w_dec = _rounded(vals.reshape(n, -1) * per_code, dtype)
    return (w_dec * 2.0 ** gemm.decode_exponent(f16))[:, :k]


def tile_words(words: Tensor) -> Tensor:
    """Packed words [N, Kp/8] in 16-row tiles (`pack="tiles"`): int32 [ceil(N/16) * chunks * 16, 8], row n's chunk
    c at row (n // 16 * chunks + c) * 16 + n % 16 (rows past N zero), so a warp's step (16 rows x 4 chunks of a
    tile) is 2 KB back to back."""
    n, chunks = words.shape[0], words.shape[1] // 8
    tiles = -(-n // 16)
    padded = words.new_zeros(tiles * 16, chunks * 8)
    padded[:n] = words
    return padded.reshape(tiles, 16, chunks, 8).permute(0, 2, 1, 3).contiguous().reshape(-1, 8)


def untile_words(tiled: Tensor, n: int, chunks: int) -> Tensor:
    """`tile_words` undone: [n, chunks * 8]."""
    return tiled.reshape(-1, chunks, 16, 8).permute(0, 2, 1, 3).reshape(-1, chunks * 8)[:n]


def prepare_nvfp4_packed(w_fp4: Tensor, w_block_scale: Tensor, dtype: torch.dtype, tiled: bool = False
                         ) -> tuple[Tensor, Tensor]:
    """`pack_nvfp4` of the weight (`tiled`: its words through `tile_words`), once per weight, scale tensor and x
    dtype."""
    def build():
        words, blocks = pack_nvfp4(w_fp4, w_block_scale, dtype)
        return (tile_words(words) if tiled else words), blocks

    kind = ("w4a16_nvfp4_tiled" if tiled else "w4a16_nvfp4_packed", dtype)
    return prepared_weights.get(w_fp4, kind, build, depends=(w_block_scale,))


PACKS = (False, True, "tiles")  # plain, packed, packed in 16-row tiles


def configured_pack():
    """The NVFP4 layout calls without a `pack` argument take: FA4_INDUCTOR_W4A16_PACK (off: False, on: True,
    tiles: "tiles")."""
    value = switches.current().w4a16_pack
    return "tiles" if value == "tiles" else bool(value)


def prepare_nvfp4(w_fp4: Tensor, w_block_scale: Tensor) -> tuple[Tensor, Tensor]:
    """(words, block-scale words): views when K is a multiple of 64 and the tensors are aligned, else the
    weight's padded copy (once per weight) and the scales' (per call)."""
    k = 2 * w_fp4.shape[1]
    if k % CHUNK_VALUES["nvfp4"] == 0 and _aligned(w_fp4):
        words = nvfp4_words(w_fp4)
    else:
        words = prepared_weights.get(w_fp4, "w4a16_nvfp4", lambda: nvfp4_words(w_fp4))
    return words, nvfp4_block_words(w_block_scale, k)


def prepare_bytes(codes: Tensor) -> Tensor:
    """int8 or fp8 codes [N, K] as the kernel's words: a view where K is a multiple of 32 and the rows are aligned,
    else a padded copy made once per weight."""
    k = codes.shape[1]
    if k % CHUNK_VALUES["int8"] == 0 and _aligned(codes):
        return byte_words(codes)
    return prepared_weights.get(codes, f"w4a16_{layout.dtype_name(codes.dtype)}", lambda: byte_words(codes))


def prepare_x(x2d: Tensor, k_padded: int) -> Tensor:
    return _pad_cols(x2d, k_padded)


# ---------------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------------


class _Key(NamedTuple):
    kernel: str  # "main" or "reduce"
    dtype: torch.dtype
    fmt: str
    m_max: int  # main only: 8 or 16
    split: bool  # main only
    bias: bool
    arch: str
    cta: Optional[CtaShape] = None  # main only
    pdl: bool = False  # the main kernel launched as a PDL dependent, the reduce as the main kernel's
    load: str = "registers"  # main only: "registers[+rot]", "rolling[+2ctas][+rot]",
    # "bulk[+ahead][+prefetch]:<stages>" or "xsmem[+2ctas][+prefetch<steps>][+parts<n> | +xperm][+rot]:<sets>"
    scale_dtype: torch.dtype = torch.float32  # int8's per-channel scales as the caller holds them
    pack: bool = False  # main only, NVFP4: the packed layout (`pack_nvfp4`)
    tiled: bool = False  # main only, packed NVFP4 in 16-row tiles (`tile_words`)
    row_scale: bool = False  # fp8: x's scales (per row or per tensor), read where the output is scaled
    x_steps: int = 0  # main only, the "xsmem" path: the steps of x a CTA's shared copy holds (`xsmem_plan`)


def _compile(key: _Key):
    """Compile one variant with fake tensors (no GPU needed: CUTE_DSL_ARCH=sm_90a on a CPU)."""
    cute = compile_utils.cute_for(key.arch)
    from cutlass import Float32, Int32

    dt = compile_utils.cutlass_dtype(key.dtype)
    sym, sym64 = cute.sym_int, cute.sym_int64
    nvfp4 = key.fmt == "nvfp4"
    scale = cute.runtime.make_fake_compact_tensor(compile_utils.cutlass_dtype(key.scale_dtype), (sym(),))
    bias = cute.runtime.make_fake_compact_tensor(dt, (sym(),)) if key.bias else None
    out = cute.runtime.make_fake_tensor(dt, (sym(), sym()), (sym64(), 1))
    part = cute.runtime.make_fake_compact_tensor(Float32, (sym(), sym(), sym()), stride_order=(2, 1, 0))
    row_scale = cute.runtime.make_fake_compact_tensor(Float32, (sym(),)) if key.row_scale else None
    if key.kernel == "reduce":
        from .cute.w4a16_splitk_reduce import W4A16SplitKReduce

        kernel = W4A16SplitKReduce(dt, key.fmt, key.bias, key.pdl)
        return compile_utils.compile_for_tvm_ffi(cute, kernel, part, scale, bias, out, row_scale)

    from .cute.w4a16_decode_gemm import W4A16DecodeGemm

    path, stages = parse_load(key.load)
    if path.startswith("bulk") and key.load != load_key(key.load, key.m_max, key.fmt, key.cta):
        raise ValueError(f"no W4A16 decode GEMM with load path {key.load!r}: give the ring's depth, which "
                         f"must fit in shared memory (`load_key`)")
    options = path.split("+")[1:]
    if is_xsmem(key.load):
        opts = xsmem_options(options)
        load = dict(load=XSMEM, sets=stages, x_steps=key.x_steps, min_ctas=ROLLING_CTAS if opts.capped else 0,
                    l2_burst=opts.burst, x_parts=opts.parts, x_permute=opts.permute, rotate_signs=opts.rotate)
    elif path.startswith("bulk"):
        load = dict(load="bulk", stages=stages, ahead="ahead" in options, prefetch="prefetch" in options,
                    scales="scales" in options)
    else:
        load = dict(load=path.split("+")[0], min_ctas=ROLLING_CTAS if f"{ROLLING_CTAS}ctas" in options else 0,
                    rotate_signs="rot" in options)
    if key.pack:
        load["pack"] = True
        load["tiled"] = key.tiled
    kernel = W4A16DecodeGemm(dt, key.fmt, key.m_max // 8, key.split, key.bias, *key.cta, pdl=key.pdl, **load)
    x = cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(divisibility=4), 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(divisibility=4), 1), assumed_align=16)
    if key.tiled:
        w = cute.runtime.make_fake_tensor(Int32, (sym(), CHUNK_VALUES["nvfp4"] // 8), (CHUNK_VALUES["nvfp4"] // 8, 1),
                                          assumed_align=16)
    block = cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(), 1)) if nvfp4 else None
    return compile_utils.compile_for_tvm_ffi(
        cute, kernel, x, w, block, scale, bias, None if key.split else out, part if key.split else None, row_scale)


compiled = compile_utils.CompiledVariants(_compile)
"""`compiled(key)`: the variant `key` names, compiled on first use."""


# ---- the CUDA-core GEMV (`cute/w4a16_gemv.py`): M <= GEMV_AUTO_ROWS, FA4_INDUCTOR_W4A16_GEMV or the matmuls' `gemv` ----

GEMV_MAX_M = 4
INT_GEMV = "int"  # the matmuls' `gemv` naming the integer NVFP4 GEMV of 1..4 rows (`nvfp4_int_gemv`)
GEMV_AUTO_ROWS = 1  # H200, docs/benchmarks.md session 13: faster than the tensor-core kernel at M = 1, mostly slower above
GEMV_ROWS = 4  # weight rows a warp, halved (down to 1) while the CTAs do not cover the SMs (`gemv_shape`)
GEMV_ROW_CHOICES = (4, 2, 1)
GEMV_WARPS = 4  # a CTA; `cute/w4a16_gemv.py`'s NUM_WARPS
GEMV_WARPS_K = (1, 2, 4)
GEMV_SPLITS = (1, 2, 4, 8)  # `cute/w4a16_gemv.py`'s SPLITS
GEMV_MIN_CTAS = {1: 0, 2: 0, 3: 0, 4: 0}  # by M: > 1 caps the registers so that this many CTAs fit a SM
GEMV_TARGET_ROW_WARPS = 16384  # rows x K warps the split along K aims for: N * 512 B * warps_k in flight


class _GemvKey(NamedTuple):
    dtype: torch.dtype
    fmt: str
    m: int  # x rows, 1..4: a variant each
    bias: bool
    arch: str
    rows: int = GEMV_ROWS
    warps_k: int = 1
    pdl: bool = False
    scale_dtype: torch.dtype = torch.float32
    min_ctas: int = 0
    weights: int = 1  # > 1: `W4A16GemvSiblings` (int8, no bias), that many weights of one x in one launch
    splits: int = 1  # CTAs of a cluster that split a row group's K (`W4A16Gemv`)


def gemv_warps_k(n: int, pieces: int) -> int:
    """Warps along K in a GEMV CTA for an n-row weight of `pieces` 16-byte pieces a row: doubled (up to the CTA's 4)
    while n * warps_k is below GEMV_TARGET_ROW_WARPS and each K warp keeps at least one 32-piece step."""
    wk = 1
    while 2 * wk <= GEMV_WARPS and n * wk < GEMV_TARGET_ROW_WARPS and pieces >= 32 * 2 * wk:
        wk *= 2
    return wk


def gemv_shape(n: int, pieces: int, num_sms: int, split: bool = False) -> tuple[int, int, int]:
    """(rows a warp, K warps, splits) of the GEMV for an n-row weight of `pieces` 16-byte pieces a row:
    `gemv_warps_k`, then GEMV_ROWS halved while the CTAs number fewer than the SMs (512 x 2048: 1 row a warp, 256
    CTAs); `split`: K split as `nvfp4_int_gemv.splits` says for those CTAs."""
    warps_k = gemv_warps_k(n, pieces)

    def ctas(rows):
        return -(-n // (rows * (GEMV_WARPS // warps_k)))

    rows = GEMV_ROWS
    while rows > 1 and ctas(rows) < num_sms:
        rows //= 2
    return rows, warps_k, nvfp4_int_gemv.splits(ctas(rows), pieces, warps_k, num_sms) if split else 1


def gemv_key(dtype: torch.dtype, fmt: str, m: int, bias: bool, arch: str, warps_k: int, pdl: bool = False,
             scale_dtype: torch.dtype = torch.float32, rows: int = GEMV_ROWS, splits: int = 1) -> _GemvKey:
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"the W4A16 GEMV takes 1..{GEMV_MAX_M} rows of x, got {m}")
    if scale_dtype not in SCALE_DTYPES or (fmt == "nvfp4" and scale_dtype != torch.float32):
        raise ValueError(f"the W4A16 GEMV does not take {fmt} scales of dtype {scale_dtype}")
    if warps_k not in GEMV_WARPS_K or fmt not in FORMATS or (bias and fmt == "nvfp4") or not 1 <= rows * m <= 32 \
            or splits not in GEMV_SPLITS:
        raise ValueError(f"no W4A16 GEMV for {fmt} with {rows} rows a warp, {warps_k} K warps, bias {bias}, "
                         f"{splits} splits")
    return _GemvKey(dtype, fmt, m, bool(bias), arch, rows, warps_k, pdl, scale_dtype, GEMV_MIN_CTAS[m], splits=splits)


def _compile_gemv(key: _GemvKey):
    cute = compile_utils.cute_for(key.arch)
    from cutlass import Float32, Int32

    from .cute.w4a16_gemv import W4A16Gemv, W4A16GemvSiblings

    dt = compile_utils.cutlass_dtype(key.dtype)
    sym, sym64 = cute.sym_int, cute.sym_int64

    def operands():  # (w, scale, out) of one weight
        return (cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(divisibility=4), 1), assumed_align=16),
                cute.runtime.make_fake_compact_tensor(
                    Float32 if key.fmt == "nvfp4" else compile_utils.cutlass_dtype(key.scale_dtype), (sym(),)),
                cute.runtime.make_fake_tensor(dt, (key.m, sym()), (sym64(), 1)))

    x = cute.runtime.make_fake_tensor(Int32, (key.m, sym()), (sym64(divisibility=4), 1), assumed_align=16)
    if key.weights > 1:
        kernel = W4A16GemvSiblings(dt, key.weights, key.m, key.rows, key.warps_k, pdl=key.pdl, min_ctas=key.min_ctas)
        return compile_utils.compile_for_tvm_ffi(cute, kernel, x, *operands(), *operands(), *operands())
    kernel = W4A16Gemv(dt, key.fmt, key.m, key.bias, key.rows, key.warps_k, pdl=key.pdl, min_ctas=key.min_ctas,
                       splits=key.splits)
    w, scale, out = operands()
    block = cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(), 1)) if key.fmt == "nvfp4" else None
    bias = cute.runtime.make_fake_compact_tensor(dt, (sym(),)) if key.bias else None
    return compile_utils.compile_for_tvm_ffi(cute, kernel, x, w, block, scale, bias, out)


compiled_gemv = compile_utils.CompiledVariants(_compile_gemv)
"""`compiled_gemv(key)`: the GEMV variant `key` names, compiled on first use."""


def _is_int_gemv(gemv) -> bool:
    """A matmul's `gemv` naming the integer GEMV: INT_GEMV, or (INT_GEMV, rows a warp, K warps[, splits[, warps a
    CTA]]) forcing its shape."""
    return gemv == INT_GEMV or isinstance(gemv, tuple) and 3 <= len(gemv) <= 5 and gemv[0] == INT_GEMV


def _gemv_shape(gemv) -> Optional[tuple[int, int]]:
    """A matmul's `gemv` argument as a forced (rows a warp, K warps) shape, or None (`gemv_warps_k`'s rule)."""
    return tuple(gemv) if isinstance(gemv, tuple) else None


INT_GEMV_AUTO_ROWS = 1
INT_GEMV_WIDE_N = 4096
INT_GEMV_SHORT_K = 2048
"""One-row NVFP4 calls take the integer GEMV over weights of at least INT_GEMV_WIDE_N rows or at most INT_GEMV_SHORT_K
columns (`int_gemv_auto`). H200, docs/benchmarks.md session 15 run 4, us, integer GEMV against the fp32 one: 8192 x 8192
15.0 / 19.3, 8192 x 2048 5.7 / 6.8, 14336 x 4096 15.4 / 17.2, 4096 x 14336 15.8 / 18.2, 4096 x 4096 5.7 / 6.8, 128256 x
4096 96.4 / 113.2, 2048 x 2048 2.4 / 2.5, 512 x 2048 1.7 / 1.8; but 2048 x 8192 6.5 / 6.0 and 1024 x 4096 2.9 / 2.5.
At 2..4 rows the tensor-core kernel is faster (run 1)."""


def int_gemv_auto(m: int, n: int, k: int) -> bool:
    """Whether a call of m rows over an [n, k] NVFP4 weight takes the integer GEMV by default (INT_GEMV_AUTO_ROWS)."""
    return m <= INT_GEMV_AUTO_ROWS and (n >= INT_GEMV_WIDE_N or k <= INT_GEMV_SHORT_K)


def configured_int_gemv(m: int, n: int, k: int, fmt: str = "nvfp4") -> bool:
    """Whether a call without a `gemv` argument takes the integer GEMV of its format (`nvfp4_int_gemv`,
    `int8_int_gemv`): FA4_INDUCTOR_W4A16_INT_GEMV (auto: `int_gemv_auto` or `int8_int_gemv.int8_auto`, within the rows
    the GEMVs are configured for; on: always, where it takes the call; off: never)."""
    setting = switches.current().w4a16_int_gemv
    if setting is None:
        auto = int_gemv_auto if fmt == "nvfp4" else int8_int_gemv.int8_auto
        return m <= configured_gemv_rows() and auto(m, n, k)
    return setting


def int_gemv_takes(x2d: Tensor, n: int, k: int, pack=False) -> bool:
    """Whether the integer GEMV can run this NVFP4 call (the plain layout, its rows and K)."""
    return not pack and nvfp4_int_gemv.unsupported_reason(x2d, n, k) is None


def int_gemv_route(x2d: Tensor, n: int, k: int) -> bool:
    """Whether a call without `gemv` or `pack` arguments over an [n, k] NVFP4 weight runs the integer GEMV."""
    return configured_int_gemv(x2d.shape[0], n, k) and int_gemv_takes(x2d, n, k, configured_pack())


def configured_gemv_rows() -> int:
    """The most rows of x a call without a `gemv` argument may have to take the GEMV: FA4_INDUCTOR_W4A16_GEMV (auto:
    GEMV_AUTO_ROWS; on: GEMV_MAX_M; off: 0)."""
    rows = switches.current().w4a16_gemv
    return GEMV_AUTO_ROWS if rows is None else rows


def gemv_rows(gemv) -> int:
    """The most rows of x that take the GEMV under a matmul's `gemv` argument (None: as configured; True or a forced
    shape: GEMV_MAX_M; False: 0)."""
    if gemv is None:
        return configured_gemv_rows()
    return GEMV_MAX_M if gemv else 0


def _run_gemv(fmt: str, x2d: Tensor, words: Tensor, block: Optional[Tensor], scale: Tensor, bias: Optional[Tensor],
              n: int, shape: Optional[tuple[int, ...]] = None) -> Tensor:
    x, key = _gemv_plan(fmt, x2d, words, n, bias is not None, scale.dtype, shape)
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    with torch.cuda.device(x.device):
        compiled_gemv(key)(x.view(torch.int32), words, block, scale, bias, out)
    return out


def _gemv_plan(fmt: str, x2d: Tensor, words: Tensor, n: int, bias: bool, scale_dtype: torch.dtype,
               shape: Optional[tuple[int, ...]], weights: int = 1) -> tuple[Tensor, _GemvKey]:
    """(x padded to the K of `words`, the GEMV variant) for n weight rows (all the weights' of a sibling launch,
    unsplit): `shape` (rows a warp, K warps[, splits]), else `gemv_shape`'s."""
    x = prepare_x(x2d, words.shape[1] * (8 if fmt == "nvfp4" else 4))
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    split = weights == 1 and nvfp4_int_gemv.configured_split()
    rows, warps_k, splits = (*shape, 1)[:3] if shape else gemv_shape(n, words.shape[1] // 4, _num_sms(device), split)
    if splits > 1 and weights > 1:
        raise ValueError("the sibling GEMV does not split K")
    key = gemv_key(x.dtype, fmt, x.shape[0], bias, compile_utils.target_arch(x.device), warps_k,
                   switches.current().w4a16_pdl, scale_dtype, rows, splits)
    return x, key._replace(weights=weights)


def keys(dtype: torch.dtype, fmt: str, m: int, split: bool, bias: bool, arch: str, cta: CtaShape,
         pdl: bool = False, load: str = "registers", scale_dtype: torch.dtype = torch.float32,
         pack=False, row_scale: bool = False, x_steps: int = 0) -> list[_Key]:
    """The variants a call runs: the main kernel (load path `load`, a `parse_load` spec), and the reduce
    kernel when split. `scale_dtype`: the dtype of int8's per-channel scales (NVFP4's global scale and fp8's
    scales are fp32); `pack`: NVFP4 weights in the packed layout (True) or packed in tiles ("tiles", register path
    only); `row_scale`: fp8 with x's scales, applied by the kernel that writes the output; `x_steps`: the "xsmem" path's
    shared copy of x (`xsmem_plan`)."""
    m_max = m_bucket(m)
    if scale_dtype not in SCALE_DTYPES or (fmt != "int8" and scale_dtype != torch.float32):
        raise ValueError(f"the W4A16 decode GEMM does not take {fmt} scales of dtype {scale_dtype}")
    if row_scale and fmt != "fp8":
        raise ValueError(f"x's scales are fp8's; {fmt} takes none")
    if pack and fmt != "nvfp4":
        raise ValueError(f"the packed layout is NVFP4's; {fmt} weights have none")
    if pack not in PACKS:
        raise ValueError(f"the NVFP4 layout (`pack`) is one of {PACKS}, not {pack!r}")
    if pack == "tiles" and (parse_load(load)[0].startswith("bulk") or is_xsmem(load)):
        raise ValueError("the tiled NVFP4 layout runs on the register load paths only (registers, rolling)")
    if is_xsmem(load) != (x_steps > 0) or is_xsmem(load) and cta.warps_k != 1:
        raise ValueError(f"the {XSMEM} load path takes CTAs of one warp along K and its x steps ({load}, {cta}, "
                         f"x_steps {x_steps})")
    main = _Key("main", dtype, fmt, m_max, split, bias and not split, arch, cta, pdl,
                load_key(load, m_max, fmt, cta), scale_dtype, bool(pack), pack == "tiles", row_scale and not split,
                x_steps)
    if not split:
        return [main]
    return [main, _Key("reduce", dtype, fmt, 0, True, bias, arch, pdl=pdl, scale_dtype=scale_dtype,
                       row_scale=row_scale)]


def warmup(dtype: torch.dtype, fmt: str, m_values=M_BUCKETS, *, bias: Optional[bool] = None,
           device: torch.device | str = "cuda", load: Optional[str] = None,
           scale_dtype: torch.dtype = torch.float32, pack=None, gemv: Optional[bool] = None,
           row_scale: Optional[bool] = None) -> int:
    """Compile every variant calls with these rows can hit (both CTA shapes, split and not; `bias` None: both;
    `load` None: the configured load path; int8 scales of `scale_dtype`; `pack` None: NVFP4 as configured; `gemv`
    None: as configured (`gemv_rows`: the GEMV's variants for the rows up to that many these M values cover, every
    shape `gemv_shape` picks); `row_scale` None: fp8 with and without x's scales),
    outside CUDA-graph capture. Returns how many were compiled now."""
    if dtype not in DTYPES or fmt not in FORMATS:
        raise ValueError(f"the W4A16 decode GEMM does not take dtype {dtype} / format {fmt!r}")
    load = configured_load() if load is None else load
    pack = (configured_pack() if pack is None else pack) if fmt == "nvfp4" else False
    short_and_long_k = (ROLLING_MAX_NARROW_K, ROLLING_MAX_NARROW_K + CHUNK_VALUES[fmt])
    arch = compile_utils.target_arch(torch.device(device), off_gpu="sm_90a")
    before = len(compiled)
    forced, pdl = switches.current().w4a16_cta, switches.current().w4a16_pdl
    for m in m_values:
        ctas = {CtaShape(*forced)} if forced else {
            c for c in auto_ctas(m, pack, fmt) if c.warps_k > 1 or load == AUTO_LOAD}
        for cta in ctas:
            for split in (False, True):
                for b in ((False, True) if bias is None else (bool(bias),)):
                    if fmt == "nvfp4" and b:
                        continue
                    for spec in {resolve_load(load, m, k, cta, fmt, pack) for k in short_and_long_k}:
                        for r in ((False, True) if fmt == "fp8" and row_scale is None else (bool(row_scale),)):
                            for x_steps in xsmem_buckets(spec, m, fmt, cta):
                                for key in keys(dtype, fmt, m, split, b, arch, cta, pdl, spec, scale_dtype, pack, r,
                                                x_steps):
                                    compiled(key)
    gemv_before = len(compiled_gemv)
    most = gemv_rows(gemv)
    if most and not pack and fmt in GEMV_FORMATS:
        rows = {r for m in m_values for r in (range(1, most + 1) if m > GEMV_MAX_M else (m,)) if r <= most}
        for m in sorted(rows):
            for r in GEMV_ROW_CHOICES:
                for wk in GEMV_WARPS_K:
                    for b in ((False, True) if bias is None else (bool(bias),)):
                        if not (fmt == "nvfp4" and b):
                            compiled_gemv(gemv_key(dtype, fmt, m, b, arch, wk, pdl, scale_dtype, r))
    return len(compiled) - before + len(compiled_gemv) - gemv_before


# ---------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------


class CallPlan(NamedTuple):
    cta: CtaShape
    load: str  # a `parse_load` spec, "auto" resolved
    splits: int
    x_steps: int  # the xsmem path's (`xsmem_plan`), else 0


def call_plan(m: int, n: int, k_padded: int, fmt: str, num_sms: int, cta: Optional[tuple[int, int, int]] = None,
              load: Optional[str] = None, splits: Optional[int] = None, pack=False) -> CallPlan:
    """What a call of m rows over an [n, k_padded] weight runs on the tensor-core kernel, from the matmuls' `cta`,
    `load` and `splits` arguments (None: as configured, or by the rules `cta_shape`, `auto_load`, `num_splits` and
    `xsmem_plan`)."""
    spec = configured_load() if load is None else load
    shape = cta_shape(n, m, num_sms, cta or switches.current().w4a16_cta, fmt, pack,
                      k_padded if spec == AUTO_LOAD else None)
    load = resolve_load(spec, m, k_padded, shape, fmt, pack)
    if is_xsmem(load):
        return CallPlan(shape, load, *xsmem_plan(m, n, k_padded, fmt, shape, num_sms, splits))
    return CallPlan(shape, load, num_splits(n, k_padded, fmt, shape, num_sms) if splits is None else splits, 0)


def _run(fmt: str, x2d: Tensor, words: Tensor, block: Optional[Tensor], scale: Tensor, bias: Optional[Tensor],
         n: int, k: int, splits: Optional[int], cta: Optional[tuple[int, int, int]], load: Optional[str],
         pack=False, row_scale: Optional[Tensor] = None) -> Tensor:
    m = x2d.shape[0]
    kp = words.shape[1] * (8 if fmt == "nvfp4" else 4)  # codes per int32 word
    if pack == "tiles":
        kp = block.shape[1] * CHUNK_VALUES["nvfp4"]
    x = prepare_x(x2d, kp)
    device = x.device
    out = torch.empty(m, n, dtype=x.dtype, device=device)
    num_sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    shape, load, splits, x_steps = call_plan(m, n, kp, fmt, num_sms, cta, load, splits, pack)
    split = splits > 1
    arch = compile_utils.target_arch(device)
    variants = [compiled(key) for key in keys(x.dtype, fmt, m, split, bias is not None, arch, shape,
                                              switches.current().w4a16_pdl, load, scale.dtype, pack,
                                              row_scale is not None, x_steps)]
    xw = x.view(torch.int32)
    with torch.cuda.device(device):
        if not split:
            variants[0](xw, words, block, scale, bias, out, None, row_scale)
        else:
            part = torch.empty(splits, m, n, dtype=torch.float32, device=device)
            variants[0](xw, words, block, scale, None, None, part, None)
            variants[1](part, scale, bias, out, row_scale)
    return out


def _check(x2d: Tensor, fmt: str, n: int, k: int, *tensors: Optional[Tensor]) -> None:
    reason = unsupported_reason(x2d, fmt, n, k)
    if reason is not None:
        raise ValueError(reason)
    for t in tensors:
        if t is not None and t.device != x2d.device:
            raise ValueError(f"every operand must be on x's device {x2d.device}; one is on {t.device}")


def nvfp4_matmul(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor, *,
                 splits: Optional[int] = None, cta: Optional[tuple[int, int, int]] = None,
                 load: Optional[str] = None, pack=None, gemv: Optional[bool] = None) -> Tensor:
    """x2d [M, K] @ dequant(w)^T -> [M, N] in x's dtype (module docstring). `splits` overrides `num_splits`,
    `cta` (row tiles, warps_n, warps_k) `cta_shape`, `load` the configured load path and `pack` the configured
    layout (FA4_INDUCTOR_W4A16_PACK) (tests, tuning); `gemv` (None: FA4_INDUCTOR_W4A16_GEMV, `gemv_rows`) True sends
    M <= 4 calls of the plain layout to the CUDA-core GEMV, which takes none of the other three, False none; a tuple
    (rows a warp, K warps) as
    `gemv` forces the GEMV's shape (tuning: `tests/bench_w4a16.py --gemv 4x1,2x2`); INT_GEMV ("int") sends the calls
    of 1..4 rows it takes to the integer GEMV (`nvfp4_int_gemv`; None: `configured_int_gemv`), the others as True;
    (INT_GEMV, rows, K warps[, splits[, warps a CTA]]) forces its shape."""
    n, k = layout.nvfp4_operands(w_fp4, w_block_scale, w_global_scale)
    _check(x2d, "nvfp4", n, k, w_fp4, w_block_scale, w_global_scale)
    pack = configured_pack() if pack is None else pack
    if _is_int_gemv(gemv) or gemv is None and configured_int_gemv(x2d.shape[0], n, k):
        if int_gemv_takes(x2d, n, k, pack):
            forced = tuple(gemv[1:]) if isinstance(gemv, tuple) else None
            return nvfp4_int_gemv.run(x2d, w_fp4, w_block_scale, w_global_scale, n, forced)
        gemv = None if gemv is None else True
    if not pack and x2d.shape[0] <= gemv_rows(gemv):
        words, blocks = prepare_nvfp4(w_fp4, w_block_scale)
        return _run_gemv("nvfp4", x2d, words, blocks, w_global_scale.reshape(1), None, n, _gemv_shape(gemv))
    if pack:
        words, pairs = prepare_nvfp4_packed(w_fp4, w_block_scale, x2d.dtype, pack == "tiles")
    else:
        words, pairs = prepare_nvfp4(w_fp4, w_block_scale)
    return _run("nvfp4", x2d, words, pairs, w_global_scale.reshape(1), None, n, k, splits, cta, load, pack)


def _int8_operands(x2d: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor] = None):
    """(N, K, the scale [N] in a dtype the kernels take, contiguous, the bias [N] in x's dtype or None), checked."""
    if w_int8.dim() != 2 or w_int8.dtype != torch.int8:
        raise ValueError(f"int8 weights are int8 [N, K], got {w_int8.dim()}-D {w_int8.dtype}")
    n, k = w_int8.shape
    if w_scale.numel() != n:
        raise ValueError(f"the int8 W4A16 decode GEMM takes per-channel scales ({n}), got {list(w_scale.shape)}")
    _check(x2d, "int8", n, k, w_int8, w_scale, bias)
    scale = w_scale.reshape(n)
    if scale.dtype not in SCALE_DTYPES:
        scale = scale.to(torch.float32)
    if bias is not None:
        bias = bias.reshape(n).to(x2d.dtype).contiguous()
    return n, k, scale.contiguous(), bias


def int8_gemv_siblings(x2d: Tensor, weights: list[tuple[Tensor, Tensor]],
                       shape: Optional[tuple[int, int]] = None) -> list[Tensor]:
    """x2d @ (w_int8 * w_scale)^T for each of 2 or 3 (w_int8 [N, K], w_scale [N]) of one K and one scale dtype, in one
    launch of the GEMV (`W4A16GemvSiblings`), each output `int8_matmul`'s on the GEMV at the same shape (`shape`, else
    `gemv_shape` of their rows together), bit for bit."""
    if len(weights) not in (2, 3) or len({s.dtype for _, s in weights}) != 1:
        raise ValueError("the int8 sibling GEMV takes 2 or 3 weights whose scales share a dtype")
    operands = []
    for w_int8, w_scale in weights:
        n, _, scale, _ = _int8_operands(x2d, w_int8, w_scale)
        operands += [prepare_bytes(w_int8), scale, torch.empty(x2d.shape[0], n, dtype=x2d.dtype, device=x2d.device)]
    x, key = _gemv_plan("int8", x2d, operands[0], sum(w.shape[0] for w, _ in weights), False, operands[1].dtype,
                        shape, len(weights))
    if len(weights) == 2:
        operands += operands[3:]  # the third weight's slot, not read
    with torch.cuda.device(x.device):
        compiled_gemv(key)(x.view(torch.int32), *operands)
    return operands[2::3][:len(weights)]


def int8_matmul(x2d: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor] = None, *,
                splits: Optional[int] = None, cta: Optional[tuple[int, int, int]] = None,
                load: Optional[str] = None, gemv: Optional[bool] = None) -> Tensor:
    """x2d [M, K] @ (w_int8 [N, K] * w_scale [N])^T (+ bias [N]) -> [M, N] in x's dtype (`gemv` as `nvfp4_matmul`'s;
    the integer GEMV is `int8_int_gemv`'s, its forced shape (INT_GEMV, rows, K warps[, 1[, warps a CTA]]))."""
    n, k, scale, bias = _int8_operands(x2d, w_int8, w_scale, bias)
    if _is_int_gemv(gemv) or gemv is None and configured_int_gemv(x2d.shape[0], n, k, "int8"):
        if int8_int_gemv.unsupported_reason(x2d, n, k) is None:
            return int8_int_gemv.run(x2d, w_int8, scale, bias, tuple(gemv[1:]) if isinstance(gemv, tuple) else None)
        gemv = None if gemv is None else True
    if x2d.shape[0] <= gemv_rows(gemv):
        return _run_gemv("int8", x2d, prepare_bytes(w_int8), None, scale, bias, n, _gemv_shape(gemv))
    return _run("int8", x2d, prepare_bytes(w_int8), None, scale, bias, n, k, splits, cta, load)


def fp8_matmul(x2d: Tensor, w_fp8: Tensor, w_scale: Tensor, x_scale: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, *, splits: Optional[int] = None,
               cta: Optional[tuple[int, int, int]] = None, load: Optional[str] = None) -> Tensor:
    """x2d [M, K] @ (w_fp8 [N, K] * w_scale [N] or [1])^T * x_scale [M] or [1] (+ bias [N]) -> [M, N] in x's dtype,
    on the tensor cores at every M (`splits`, `cta`, `load` as `nvfp4_matmul`'s)."""
    if w_fp8.dim() != 2 or w_fp8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8 weights are float8_e4m3fn [N, K], got {w_fp8.dim()}-D {w_fp8.dtype}")
    n, k = w_fp8.shape
    m = x2d.shape[0] if x2d.dim() == 2 else 0
    for name, scale, size in (("w_scale", w_scale, n), ("x_scale", x_scale, m)):
        if scale is not None and (scale.dtype != torch.float32 or scale.numel() not in (1, size)):
            raise ValueError(f"the fp8 W4A16 decode GEMM takes a float32 {name} of 1 or {size} elements, got "
                             f"{layout.dtype_name(scale.dtype)} {list(scale.shape)}")
    _check(x2d, "fp8", n, k, w_fp8, w_scale, x_scale, bias)
    if bias is not None:
        bias = bias.reshape(n).to(x2d.dtype).contiguous()
    row_scale = None if x_scale is None else x_scale.reshape(-1).contiguous()
    return _run("fp8", x2d, prepare_bytes(w_fp8), None, w_scale.reshape(-1).contiguous(), bias, n, k, splits, cta,
                load, row_scale=row_scale)
