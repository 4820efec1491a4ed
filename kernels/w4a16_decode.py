"""Host side of our weight-only decode GEMM (`cute/w4a16_decode_gemm.py` + `cute/w4a16_splitk_reduce.py`):
out[M, N] = x[M, K] @ dequant(W)[N, K]^T for decode-sized M (1..16), x float16 / bfloat16, W NVFP4 or int8.

    unsupported_reason(x2d, fmt, n, k) -> str | None          fmt "nvfp4" or "int8"
    nvfp4_matmul(x2d, w_fp4, w_block_scale, w_global_scale) -> Tensor [M, N] in x's dtype
    int8_matmul(x2d, w_int8, w_scale, bias=None) -> Tensor [M, N] in x's dtype
    warmup(dtype, fmt, ...)                                   compile before CUDA-graph capture

Not wired into `fa4::nvfp4_linear` / `fa4::int8_linear` yet: call these functions directly.

Formats (the ops' own, see nvfp4_linear.py / int8_linear.py):
- nvfp4: w_fp4 uint8 [N, K/2] (code 2i in the low nibble), w_block_scale float8_e4m3fn [N, K/16],
  w_global_scale float32 with one element (read by the kernel on the device: no host sync, and a scale
  computed in the graph is fine). The kernel computes sum_k x * (e2m1 * e4m3) in fp32 (products exact),
  then multiplies by the global scale once: it does not round e4m3 * global to fp32 first as the op's
  reference does (a relative difference of at most one fp32 ulp per weight, far below the bf16 output's).
- int8: w_int8 int8 [N, K], w_scale [N] (any float dtype; made fp32), bias [N] in x's dtype or None:
  out = dtype(sum_k x * w * scale[n] + bias[n]) (the sum in fp32). Per-channel scales only.

Layout: the checkpoint's row-major bytes as they are, read as 32-bit words, when a row is a whole number of
16-byte chunks and the tensors are 16-byte aligned (no copy at all); otherwise a copy with K padded to the
chunk (zero codes, zero scales), made once per weight (`prepared_weights`, kind "w4a16_nvfp4" /
"w4a16_int8"). NVFP4 block scales are padded per call in that case (torchao hands new scale tensors each
call). x is made contiguous, 16-byte aligned and zero-padded to the chunk when needed (a small copy).

Limits (`unsupported_reason`): CUDA sm90, x float16 / bfloat16 with 1..16 rows, K a multiple of 16, N >= 1.

Split-K (`num_splits`): a host function of the shapes and the SM count, never of values, so a captured
CUDA graph stays valid. One split when the row CTAs already fill NO_SPLIT_CTAS_PER_SM per SM; else enough
splits to reach CTAS_PER_SM per SM, each split keeping >= MIN_STEPS steps of 32 chunks per lane. These are
guesses until measured (`tests/bench_w4a16.py --splits 1,2,4,8` sweeps them). Partials go to an fp32 workspace
[splits, M, N] (a fresh torch allocation per call: fine under capture) reduced by a second kernel in a fixed
order (deterministic).

Compilation: one main variant per (x dtype, format, M bucket, split or not, bias or not, arch) and one
reduce variant per (x dtype, format, bias or not, arch), kept for the process in `compiled`
(`cute/compile_utils.py`). M buckets 1, 2, 4, 8, 16 (M is a runtime value up to its bucket). Call `warmup`
(or one eager call per shape) before capturing a CUDA graph.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import layout, prepared_weights, switches
from .cute import compile_utils

FORMATS = ("nvfp4", "int8")
DTYPES = layout.HALF_DTYPES
M_BUCKETS = (1, 2, 4, 8, 16)
MAX_M = M_BUCKETS[-1]
CHUNK_BYTES = 16
CHUNK_VALUES = {"nvfp4": 32, "int8": 16}  # weights per 16-byte chunk
K_MULTIPLE = 16
NUM_WARPS = 4
CTAS_PER_SM = 4  # what a split grid aims at
NO_SPLIT_CTAS_PER_SM = 2  # row CTAs per SM from which the grid is not split (a split costs a second launch)
MIN_STEPS = 2  # steps of 32 chunks per lane in a split
MAX_SPLITS = 64
FP4_DTYPES = tuple(d for d in (torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d is not None)


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


def rows_per_warp(m_max: int) -> int:
    """Weight rows per warp of the main kernel for an M bucket: 4 at M = 1 (114 registers), 2 above (at
    M = 4, 4 rows take 248 registers: two CTAs per SM)."""
    return 4 if m_max == 1 else 2


def num_splits(n: int, k_padded: int, fmt: str, m: int, num_sms: int) -> int:
    """Split-K count for an [n, k_padded] weight (see the module docstring)."""
    row_ctas = -(-n // (rows_per_warp(m_bucket(m)) * NUM_WARPS))
    if row_ctas >= NO_SPLIT_CTAS_PER_SM * num_sms:
        return 1
    chunks = k_padded // CHUNK_VALUES[fmt]
    want = -(-num_sms * CTAS_PER_SM // row_ctas)
    return max(1, min(want, chunks // (32 * MIN_STEPS), MAX_SPLITS))


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# ---------------------------------------------------------------------------------------------
# Layout (plain PyTorch; the CPU tests check it)
# ---------------------------------------------------------------------------------------------


def _aligned(t: Tensor) -> bool:
    """Row-major with rows back to back (checked even for one row, where `is_contiguous` ignores the row
    stride) and a 16-byte aligned start."""
    return t.stride() == (t.shape[1], 1) and t.data_ptr() % CHUNK_BYTES == 0


def _pad_cols(t: Tensor, cols: int) -> Tensor:
    """t [R, C] as a row-major aligned [R, cols] tensor, zeros past C: t itself when it already is one."""
    if t.shape[1] == cols and _aligned(t):
        return t
    if t.shape[1] == cols:
        return t.new_empty(t.shape).copy_(t)
    out = t.new_zeros(t.shape[0], cols)
    out[:, : t.shape[1]] = t
    return out


def nvfp4_words(w_fp4: Tensor) -> Tensor:
    """w_fp4 [N, K/2] bytes as the kernel reads them: int32 [N, Kp/8] (8 codes a word, code j in bits
    4j..4j+3), K padded to a multiple of 32 with zero codes. A view when nothing needs padding."""
    w = w_fp4.view(torch.uint8) if w_fp4.dtype != torch.uint8 else w_fp4
    kp = padded_k("nvfp4", 2 * w.shape[1])
    return _pad_cols(w, kp // 2).view(torch.int32)


def nvfp4_block_pairs(w_block_scale: Tensor, k: int) -> Tensor:
    """The e4m3 block scales [N, K/16] as int16 [N, Kp/32] (block 2c in the low byte of pair c)."""
    kp = padded_k("nvfp4", k)
    return _pad_cols(w_block_scale.view(torch.uint8), kp // 16).view(torch.int16)


def int8_words(w_int8: Tensor) -> Tensor:
    """w_int8 [N, K] as int32 [N, Kp/4] (4 codes a word, code j in byte j), K padded to 16."""
    kp = padded_k("int8", w_int8.shape[1])
    return _pad_cols(w_int8, kp).view(torch.int32)


def decode_nvfp4_words(words: Tensor, pairs: Tensor, k: int) -> Tensor:
    """float64 e2m1 * e4m3 [N, k] from the kernel's operands, decoded the kernel's way (bit patterns as
    float32, exact multiplies by powers of two): the reference the layout tests hold it to."""
    w = words.view(torch.int32)
    n = w.shape[0]
    shifts = torch.arange(8, dtype=torch.int32) * 4
    codes = ((w.unsqueeze(-1) >> shifts) & 0xF).reshape(n, -1)  # [N, Kp]
    mag_bits = ((codes & 7) << 22) | ((codes & 8) << 28)
    e2m1 = mag_bits.view(torch.float32).double() * 2.0 ** 126
    b = pairs.view(torch.int16).int()
    blocks = torch.stack([b & 0xFF, (b >> 8) & 0xFF], dim=-1).reshape(n, -1)  # [N, Kp/16]
    s_bits = ((blocks & 0x7F) << 20) | ((blocks & 0x80) << 24)
    s = s_bits.view(torch.float32).double() * 2.0 ** 120
    return (e2m1 * s.repeat_interleave(16, dim=1))[:, :k]


def decode_int8_words(words: Tensor, k: int) -> Tensor:
    """float64 int8 codes [N, k] from the kernel's words, decoded the kernel's way (the 2^23 + 128 trick)."""
    flipped = words.view(torch.int32) ^ -0x7F7F7F80  # 0x80808080: each byte int8 + 128
    shifts = torch.arange(4, dtype=torch.int32) * 8
    bytes_ = ((flipped.unsqueeze(-1) >> shifts) & 0xFF).reshape(flipped.shape[0], -1)
    f = (bytes_ | 0x4B000000).view(torch.float32).double()  # the kernel's prmt
    return (f - 8388736.0)[:, :k]


def prepare_nvfp4(w_fp4: Tensor, w_block_scale: Tensor) -> tuple[Tensor, Tensor]:
    """(words, block pairs): views when K is a multiple of 32 and the tensors are aligned, else the weight's
    padded copy (once per weight) and the scales' (per call)."""
    k = 2 * w_fp4.shape[1]
    if k % CHUNK_VALUES["nvfp4"] == 0 and _aligned(w_fp4):
        words = nvfp4_words(w_fp4)
    else:
        words = prepared_weights.get(w_fp4, "w4a16_nvfp4", lambda: nvfp4_words(w_fp4))
    return words, nvfp4_block_pairs(w_block_scale, k)


def prepare_int8(w_int8: Tensor) -> Tensor:
    k = w_int8.shape[1]
    if k % CHUNK_VALUES["int8"] == 0 and _aligned(w_int8):
        return int8_words(w_int8)
    return prepared_weights.get(w_int8, "w4a16_int8", lambda: int8_words(w_int8))


def prepare_x(x2d: Tensor, k_padded: int) -> Tensor:
    return _pad_cols(x2d, k_padded)


# ---------------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------------


class _Key(NamedTuple):
    kernel: str  # "main" or "reduce"
    dtype: torch.dtype
    fmt: str
    m_max: int  # main only
    split: bool  # main only
    bias: bool
    arch: str


def _compile(key: _Key):
    """Compile one variant with fake tensors (no GPU needed: CUTE_DSL_ARCH=sm_90a on a CPU)."""
    cute = compile_utils.cute_for(key.arch)
    from cutlass import Float32, Int16, Int32

    dt = compile_utils.cutlass_dtype(key.dtype)
    sym, sym64 = cute.sym_int, cute.sym_int64
    nvfp4 = key.fmt == "nvfp4"
    scale = cute.runtime.make_fake_compact_tensor(Float32, (sym(),))
    bias = cute.runtime.make_fake_compact_tensor(dt, (sym(),)) if key.bias else None
    out = cute.runtime.make_fake_tensor(dt, (sym(), sym()), (sym64(), 1))
    part = cute.runtime.make_fake_compact_tensor(Float32, (sym(), sym(), sym()), stride_order=(2, 1, 0))
    if key.kernel == "reduce":
        from .cute.w4a16_splitk_reduce import W4A16SplitKReduce

        kernel = W4A16SplitKReduce(dt, key.fmt, key.bias)
        return compile_utils.compile_for_tvm_ffi(cute, kernel, part, scale, bias, out)

    from .cute.w4a16_decode_gemm import W4A16DecodeGemm

    kernel = W4A16DecodeGemm(dt, key.fmt, key.m_max, key.split, key.bias, rows_per_warp(key.m_max))
    x = cute.runtime.make_fake_tensor(dt, (sym(), sym()), (sym64(divisibility=8), 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(Int32, (sym(), sym()), (sym64(divisibility=4), 1), assumed_align=16)
    block = cute.runtime.make_fake_tensor(Int16, (sym(), sym()), (sym64(), 1)) if nvfp4 else None
    return compile_utils.compile_for_tvm_ffi(
        cute, kernel, x, w, block, scale, bias, None if key.split else out, part if key.split else None)


compiled = compile_utils.CompiledVariants(_compile)
"""`compiled(key)`: the variant `key` names, compiled on first use."""


def keys(dtype: torch.dtype, fmt: str, m: int, split: bool, bias: bool, arch: str) -> list[_Key]:
    """The variants a call runs: the main kernel, and the reduce kernel when split."""
    main = _Key("main", dtype, fmt, m_bucket(m), split, bias and not split, arch)
    return [main, _Key("reduce", dtype, fmt, 0, True, bias, arch)] if split else [main]


def warmup(dtype: torch.dtype, fmt: str, m_values=M_BUCKETS, *, bias: Optional[bool] = None,
           device: torch.device | str = "cuda") -> int:
    """Compile every variant calls with these rows can hit (split and not; `bias` None: both), outside
    CUDA-graph capture. Returns how many were compiled now."""
    if dtype not in DTYPES or fmt not in FORMATS:
        raise ValueError(f"the W4A16 decode GEMM does not take dtype {dtype} / format {fmt!r}")
    arch = compile_utils.target_arch(torch.device(device), off_gpu="sm_90a")
    before = len(compiled)
    for m in m_values:
        for split in (False, True):
            for b in ((False, True) if bias is None else (bool(bias),)):
                if fmt == "nvfp4" and b:
                    continue
                for key in keys(dtype, fmt, m, split, b, arch):
                    compiled(key)
    return len(compiled) - before


# ---------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------


def _run(fmt: str, x2d: Tensor, words: Tensor, block: Optional[Tensor], scale: Tensor, bias: Optional[Tensor],
         n: int, k: int, splits: Optional[int]) -> Tensor:
    m = x2d.shape[0]
    kp = words.shape[1] * (8 if fmt == "nvfp4" else 4)  # codes per int32 word
    x = prepare_x(x2d, kp)
    device = x.device
    out = torch.empty(m, n, dtype=x.dtype, device=device)
    if splits is None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        splits = num_splits(n, kp, fmt, m, _num_sms(index))
    split = splits > 1
    arch = compile_utils.target_arch(device)
    variants = [compiled(key) for key in keys(x.dtype, fmt, m, split, bias is not None, arch)]
    with torch.cuda.device(device):
        if not split:
            variants[0](x, words, block, scale, bias, out, None)
        else:
            part = torch.empty(splits, m, n, dtype=torch.float32, device=device)
            variants[0](x, words, block, scale, None, None, part)
            variants[1](part, scale, bias, out)
    return out


def _check(x2d: Tensor, fmt: str, n: int, k: int, *tensors: Optional[Tensor]) -> None:
    reason = unsupported_reason(x2d, fmt, n, k)
    if reason is not None:
        raise ValueError(reason)
    for t in tensors:
        if t is not None and t.device != x2d.device:
            raise ValueError(f"every operand must be on x's device {x2d.device}; one is on {t.device}")


def nvfp4_matmul(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor, *,
                 splits: Optional[int] = None) -> Tensor:
    """x2d [M, K] @ dequant(w)^T -> [M, N] in x's dtype (module docstring). `splits` overrides `num_splits`
    (tests, tuning)."""
    if w_fp4.dim() != 2 or w_fp4.dtype not in FP4_DTYPES:
        raise ValueError(f"nvfp4 weights are uint8 [N, K/2], got {w_fp4.dim()}-D {w_fp4.dtype}")
    n, k = w_fp4.shape[0], 2 * w_fp4.shape[1]
    if w_block_scale.dtype != torch.float8_e4m3fn or tuple(w_block_scale.shape) != (n, k // 16):
        raise ValueError(f"nvfp4 block scales are float8_e4m3fn [{n}, {k // 16}], got {w_block_scale.dtype} "
                         f"{list(w_block_scale.shape)}")
    if w_global_scale.numel() != 1 or w_global_scale.dtype != torch.float32:
        raise ValueError("the nvfp4 global scale is one float32 element")
    _check(x2d, "nvfp4", n, k, w_fp4, w_block_scale, w_global_scale)
    words, pairs = prepare_nvfp4(w_fp4, w_block_scale)
    return _run("nvfp4", x2d, words, pairs, w_global_scale.reshape(1), None, n, k, splits)


def int8_matmul(x2d: Tensor, w_int8: Tensor, w_scale: Tensor, bias: Optional[Tensor] = None, *,
                splits: Optional[int] = None) -> Tensor:
    """x2d [M, K] @ (w_int8 [N, K] * w_scale [N])^T (+ bias [N]) -> [M, N] in x's dtype."""
    if w_int8.dim() != 2 or w_int8.dtype != torch.int8:
        raise ValueError(f"int8 weights are int8 [N, K], got {w_int8.dim()}-D {w_int8.dtype}")
    n, k = w_int8.shape
    if w_scale.numel() != n:
        raise ValueError(f"the int8 W4A16 decode GEMM takes per-channel scales ({n}), got {list(w_scale.shape)}")
    _check(x2d, "int8", n, k, w_int8, w_scale, bias)
    scale = w_scale.reshape(n).to(torch.float32).contiguous()
    if bias is not None:
        bias = bias.reshape(n).to(x2d.dtype).contiguous()
    return _run("int8", x2d, prepare_int8(w_int8), None, scale, bias, n, k, splits)
