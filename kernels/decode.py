"""Host side of our split-KV decode attention kernel (`cute/decode_attention.py` + `cute/decode_combine.py`).

What it takes (`unsupported_reason` says why not, otherwise):
- CUDA sm90 (Hopper; the kernel is compiled for sm_90a), float16 / bfloat16;
- head_dim == head_dim_v in (64, 128, 256) (`HEAD_DIMS`; 96 compiles, untested on a GPU);
  Hq a multiple of Hkv with group Hq / Hkv <= 16;
  query length Sq <= 8 (packed rows Sq * group, 16 per CTA row tile);
- no local window (causal, softcap, seqused_k and a key mask are fine);
- K and V with a unit stride on D, a 16-byte aligned start and the other strides multiples of
  16 bytes (HF static caches and transposed views of [B, S, H, D] qualify); Q any strides
  with a unit stride on D.
Disable it with FA4_INDUCTOR_DISABLE_DECODE=1 (environment switches are read by `switches.py`).

When `fa4::attention` uses it (`dispatch_reason`): decode-shaped calls that the above allows,
Sq * group <= DISPATCH_MAX_ROWS (16: one row tile, so each KV tile is read once) and
Sk >= DISPATCH_MIN_SEQLEN_K (512; 1024 when B * Hkv >= 64: the crossover with FA4 measured at
hq32/hkv8 d128, b1 at 256-512 keys and b8 at 512-1024; any Sk with a key mask, which FA4 does not take: there the
alternative is the SDPA fallback, slower than our kernel at every cache length measured, 256 keys included), except
where cuDNN SDPA takes the call (`sdpa_cudnn.py`: one cache length for the batch, no key mask). Measured on the H200
(docs/benchmarks.md, 2026-11-29 sessions 3 and 4): it beats FA4 on every benchmarked shape, b1-b64 x 1k-128k
keys, by up to 10x at batch 1 (FA4 has no split-KV on Hopper), and SDPA with the equivalent mask where per-sequence lengths or a
padding mask are given (HF static caches always pass them); on fixed-length caches cuDNN SDPA
(what SDPA with `enable_gqa` runs there) is 1-25% faster, so the op sends those calls to it.

Split count (`num_splits`): a host function of shapes only (batch, KV heads, row tiles, the
maximum Sk, head dim, SM count), never of seqused_k's contents, so a CUDA graph captured once
stays valid when the cache lengths change. It aims at one wave of one CTA per SM, with at most
MAX_SPLITS splits of at least MIN_TILES_PER_SPLIT 16-key tiles each; 1 means the main kernel
writes the output itself. Measured on the H200 (`tests/bench_decode.py --sweep`, docs/benchmarks.md):
filling every CTA slot (two per SM) or going past one wave was 1-60% slower, because each extra
split adds a partial to write and combine while one CTA per SM already streams at the memory's
rate; ring depth (2-6 stages) and PDL moved times by 1-3%. Splits
that get no key at run time (short sequences) write lse = -inf partials; the combine weighs them 0.
FA4_INDUCTOR_DECODE_SPLITS=N fixes the split count for every call (for tuning the heuristic).

Compilation: one main-kernel variant per (dtype, head_dim, group, causal, softcap on/off,
seqused_k given, split or not, arch) and one combine variant per (dtype, head_dim, group, PDL on/off, arch),
about a second each, kept in `compiled` for the process (`cute/compile_utils.py`: what compiling
any CuTe kernel of ours takes). The combine kernel is launched as a programmatic dependent of the
main kernel (Hopper PDL, overlapping its launch with the main kernel's tail;
FA4_INDUCTOR_DECODE_PDL=0 turns that off). Batch, heads, Sq, Sk, strides and the
split count are runtime values. Call `warmup` before capturing CUDA graphs. Launches go to the
current torch stream (TVM-FFI environment stream): no host sync, no host read of seqused_k.

The host half (`prepare`, `launch`, the fake-tensor builders, `combine_key`, `warmup_variants`) also
serves the int8-KV main kernel (`decode_int8kv.py`), which shares this combine kernel.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import layout, switches
from .cute import compile_utils
from .flags import Flags

DISABLE_ENV = switches.DISABLE_DECODE
PDL_ENV = switches.DECODE_PDL  # 0 launches the combine kernel without programmatic dependent launch
SPLITS_ENV = switches.DECODE_SPLITS  # a fixed split count for every call (tuning experiments)
SMEM_KB_ENV = switches.DECODE_SMEM_KB  # a CTA's shared-memory budget, sets the ring depth (tuning)
DTYPES = layout.HALF_DTYPES
HEAD_DIMS = (64, 128, 256)
"""The head dims the op sends to the kernel. It also compiles at 96 (Phi-3: 8 x 32 swizzle atoms, session 57), which
has not run on a GPU yet: tests/test_gpu_decode.py runs it with 96 added here; once those pass, 96 joins."""
MAX_GROUP = 16
MAX_Q_LEN = 8
ALIGN_BYTES = layout.ALIGN_BYTES
TILE_M = 16  # packed rows per CTA
TILE_N = 16  # keys per warp tile
NUM_WARPS = 4
MAX_SPLITS = 128
MIN_TILES_PER_SPLIT = 2 * NUM_WARPS
DISPATCH_MAX_ROWS = 16
DISPATCH_MIN_SEQLEN_K = 512
DISPATCH_WIDE_BATCH_HEADS = 64  # batch x KV heads from which FA4 keeps caches up to 2 * DISPATCH_MIN_SEQLEN_K
_LOG2_E = math.log2(math.e)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                       key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """Why the decode kernel cannot take this call, or None if it can (see the module docstring)."""
    f = Flags(**flags)
    reason = switches.gate("the decode kernel", DISABLE_ENV, q, DTYPES)
    if reason is not None:
        return reason
    major, minor = switches.capability(q.device.index)
    if major != 9:
        return f"the decode kernel is built for sm90; this GPU is sm{major}{minor}"
    d, dv = q.shape[-1], v.shape[-1]
    if d != dv or d not in HEAD_DIMS:
        return f"the decode kernel takes head dims {HEAD_DIMS} with head_dim == head_dim_v; got ({d}, {dv})"
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv or hq // hkv > MAX_GROUP:
        return f"the decode kernel takes GQA groups up to {MAX_GROUP}; got {hq} query / {hkv} kv heads"
    if q.shape[2] > MAX_Q_LEN:
        return f"the decode kernel takes up to {MAX_Q_LEN} query tokens; got {q.shape[2]}"
    if f.window_left >= 0 or f.window_right >= 0:
        return "the decode kernel has no local window"
    if q.stride(-1) != 1 and q.shape[-1] > 1:
        return f"q has stride {q.stride(-1)} on the head dim (needs 1)"
    for name, t in (("k", k), ("v", v)):
        reason = layout.alignment_reason(name, t)
        if reason is not None:
            return reason
    if seqused_k is not None and (seqused_k.device != q.device or seqused_k.dim() != 1):
        return "seqused_k must be a 1-D tensor on q's device"
    if key_mask is not None and (key_mask.device != q.device or key_mask.dtype not in (torch.bool, q.dtype)):
        return "key_mask must be a bool tensor, or an additive one in q's dtype, on q's device"
    if key_mask is not None and key_mask.dim() != 2:
        return "the decode kernel takes a [B, Sk] key mask, not one per query row"
    return None


def dispatch_reason(q: Tensor, k: Tensor, v: Tensor, *, seqused_k: Optional[Tensor] = None,
                    key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """Why `fa4::attention` should not send this call to the decode kernel, or None if it should."""
    rows = q.shape[2] * (q.shape[1] // k.shape[1])
    if rows > DISPATCH_MAX_ROWS:
        return f"not decode-shaped: Sq * group = {rows} > {DISPATCH_MAX_ROWS}"
    min_seqlen_k = DISPATCH_MIN_SEQLEN_K * (2 if q.shape[0] * k.shape[1] >= DISPATCH_WIDE_BATCH_HEADS else 1)
    if k.shape[2] < min_seqlen_k and key_mask is None:
        return f"not decode-shaped: Sk = {k.shape[2]} < {min_seqlen_k}"
    return unsupported_reason(q, k, v, seqused_k=seqused_k, key_mask=key_mask, **flags)


def stages_for(head_dim: int) -> int:
    """Depth of each warp's K / V ring: as deep as a CTA's shared-memory budget allows (SMEM_KB_ENV,
    default 100 KB: two CTAs per SM on Hopper)."""
    budget = switches.current().decode_smem_kb * 1024
    per_stage = NUM_WARPS * 2 * TILE_N * head_dim * 2
    return max(2, min(8, (budget - TILE_M * head_dim * 2) // per_stage))


def row_tiles(q_len: int, group: int) -> int:
    return -(-q_len * group // TILE_M)


def num_splits(batch: int, kv_heads: int, q_len: int, group: int, seqlen_k: int, head_dim: int, num_sms: int) -> int:
    """KV splits per (batch, KV head, row tile): one wave of one CTA per SM (the nearest split count),
    each split >= MIN_TILES_PER_SPLIT tiles.

    A function of shapes only (`seqlen_k` is the cache's maximum length, k.shape[2])."""
    ctas = batch * kv_heads * row_tiles(q_len, group)
    tiles = -(-seqlen_k // TILE_N)
    return max(1, min(round(num_sms / max(ctas, 1)), tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS))


# ---------------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------------


class _Key(NamedTuple):
    kernel: str  # "main" or "combine"
    dtype: torch.dtype
    head_dim: int
    group: int
    causal: bool
    softcap: bool
    seqused: bool
    split: bool
    arch: str
    pdl: bool = False  # combine kernel: programmatic dependent launch
    stages: int = 0  # main kernel: K / V ring depth per warp
    key_mask: bool = False  # main kernel: a [B, Sk] key mask is given
    additive_mask: bool = False  # main kernel: that key mask is additive (q's dtype), not boolean
    min_ctas: int = 0  # int8-KV main kernel: CTAs a SM its registers must allow (0: ptxas decides)
    half_rows: bool = False  # int8-KV main kernel: every packed query row is one of the tile's first 8
    fused_combine: bool = False  # main kernel, split: its last CTA a row tile merges the splits (no combine kernel)


def fake_bhsd(cute, dtype, d: int, div: int = 1, align: Optional[int] = None):
    """A fake [B, H, S, d] tensor of cutlass `dtype` for compiling: dynamic sizes, unit stride on d, the
    other strides multiples of `div` elements, the start aligned to `align` bytes."""
    def sym():
        return cute.sym_int64(divisibility=div)

    return cute.runtime.make_fake_tensor(
        dtype, (cute.sym_int(), cute.sym_int(), cute.sym_int(), d), (sym(), sym(), sym(), 1), assumed_align=align)


def fake_lse(cute):
    """A fake [B, Hq, Sq] float32 lse tensor (unit stride on Sq)."""
    from cutlass import Float32

    return cute.runtime.make_fake_tensor(Float32, tuple(cute.sym_int() for _ in range(3)),
                                         (cute.sym_int64(), cute.sym_int64(), 1))


def fake_partials(cute, d: int):
    """Fake split partials: O [B, Hkv * row_tiles, splits, TILE_M, d] and lse [..., TILE_M], float32, compact."""
    from cutlass import Float32

    o = cute.runtime.make_fake_compact_tensor(
        Float32, (cute.sym_int(), cute.sym_int(), cute.sym_int(), TILE_M, d), stride_order=(4, 3, 2, 1, 0),
        assumed_align=16)
    lse = cute.runtime.make_fake_compact_tensor(
        Float32, (cute.sym_int(), cute.sym_int(), cute.sym_int(), TILE_M), stride_order=(3, 2, 1, 0),
        assumed_align=16)
    return o, lse


def fake_main_tail(cute, key):
    """The fake arguments the main kernels take after K / V: seqused_k, key mask, out, lse, O / lse partials,
    the split counters and the three scalars, each given or None as `key` (seqused, key_mask, split,
    fused_combine) says."""
    from cutlass import Float32, Int32, Uint8

    used = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),)) if key.seqused else None
    mask_dtype = compile_utils.cutlass_dtype(key.dtype) if key.additive_mask else Uint8
    key_mask = cute.runtime.make_fake_tensor(
        mask_dtype, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1)) if key.key_mask else None
    o_part, lse_part = fake_partials(cute, key.head_dim) if key.split else (None, None)
    writes_out = not key.split or key.fused_combine
    out = fake_bhsd(cute, compile_utils.cutlass_dtype(key.dtype), key.head_dim) if writes_out else None
    lse = fake_lse(cute) if writes_out else None
    counters = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),)) if key.fused_combine else None
    return used, key_mask, out, lse, o_part, lse_part, counters, Float32(1.0), Float32(1.0), Float32(1.0)


def _compile(key: _Key):
    """Compile one variant with fake tensors (no GPU needed: set CUTE_DSL_ARCH=sm_90a on a CPU)."""
    cute = compile_utils.cute_for(key.arch)
    dt = compile_utils.cutlass_dtype(key.dtype)
    d = key.head_dim
    if key.kernel == "combine":
        from .cute.decode_combine import DecodeCombine

        combine = DecodeCombine(dt, d, key.group, pdl=key.pdl)
        return compile_utils.compile_for_tvm_ffi(cute, combine, *fake_partials(cute, d), fake_bhsd(cute, dt, d),
                                                 fake_lse(cute))

    from .cute.decode_attention import DecodeAttentionSm90

    kernel = DecodeAttentionSm90(dt, d, key.group, key.causal, key.softcap, key.seqused, key.split, key.stages,
                                 key.key_mask, key.additive_mask, key.fused_combine)
    align = ALIGN_BYTES // 2
    return compile_utils.compile_for_tvm_ffi(
        cute, kernel, fake_bhsd(cute, dt, d), fake_bhsd(cute, dt, d, align, ALIGN_BYTES),
        fake_bhsd(cute, dt, d, align, ALIGN_BYTES), *fake_main_tail(cute, key))


compiled = compile_utils.CompiledVariants(_compile)
"""`compiled(key)`: the variant `key` names, compiled on first use."""


def compile_cache_info() -> int:
    """How many kernel variants this process has compiled."""
    return len(compiled)


# ---------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------


def _keys(q: Tensor, k: Tensor, seqused_k: Optional[Tensor], key_mask: Optional[Tensor], causal: bool, softcap: float,
          split: bool, fused_combine: bool = False):
    group = q.shape[1] // k.shape[1]
    arch = compile_utils.target_arch(q.device)
    main = _Key("main", q.dtype, q.shape[-1], group, bool(causal), softcap > 0, seqused_k is not None, split, arch,
                stages=stages_for(q.shape[-1]), key_mask=key_mask is not None,
                additive_mask=key_mask is not None and key_mask.dtype != torch.uint8, fused_combine=fused_combine)
    return main, combine_key(q.dtype, q.shape[-1], group, arch)


_SPLIT_COUNTERS: dict = {}
"""Per device, every int32 counter buffer the fused combine was given (the last the largest). None is ever freed: a
CUDA graph keeps the one it captured."""


def split_counters(call: Prepared, kv_heads: int) -> Optional[Tensor]:
    """The zeroed int32 counters (one a batch row and row tile, `SplitKVMerge.combine_if_last`) for a split call
    under FA4_INDUCTOR_DECODE_FUSED_COMBINE, else None (the combine kernel runs): switch off, one split, or a larger
    buffer needed while a CUDA graph is being captured (made there, it would be the graph's). The counters are the
    device's: two split calls on different streams at once must not both use them."""
    if not fuses_combine(call.splits > 1, call.q.shape[-1]) or call.out.numel() == 0:
        return None
    b, hq, sq, _ = call.q.shape
    need = b * kv_heads * row_tiles(sq, hq // kv_heads)
    device = call.q.device
    index = torch.cuda.current_device() if device.type == "cuda" and device.index is None else device.index
    held = _SPLIT_COUNTERS.setdefault((device.type, index), [])
    if held and held[-1].numel() >= need:
        return held[-1]
    if capturing(device):
        return None
    held.append(torch.zeros(max(need, 4096), dtype=torch.int32, device=device))
    return held[-1]


FUSED_COMBINE_HEAD_DIMS = (64, 128)
"""Head dims whose main kernels take the fused combine: at 256 the int8-KV kernel's registers spill with it (sm_90a
SASS, `docs/scripts/sass_stats.py int8kv 256 --fused`), and its main loop grows."""


def fuses_combine(split: bool, head_dim: int) -> bool:
    """Whether a call that splits or not runs the fused combine (FA4_INDUCTOR_DECODE_FUSED_COMBINE)."""
    return split and head_dim in FUSED_COMBINE_HEAD_DIMS and switches.current().decode_fused_combine


def capturing(device: torch.device) -> bool:
    """Whether the current stream of `device` is capturing a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def fused_combine_choices(split: bool, head_dim: int) -> tuple:
    """The fused_combine settings `warmup` compiles for a main kernel that splits or not."""
    return (False, True) if fuses_combine(split, head_dim) else (False,)


def combine_key(dtype: torch.dtype, head_dim: int, group: int, arch: str) -> _Key:
    """The combine kernel's variant (shared by every main kernel that writes split partials)."""
    return _Key("combine", dtype, head_dim, group, False, False, False, True, arch, _pdl())


def _pdl() -> bool:
    return switches.current().decode_pdl


class Prepared(NamedTuple):
    """A decode call's host side, ready to launch (`prepare`, then `launch`)."""

    q: Tensor  # unit stride on D
    seqused_k: Optional[Tensor]  # int32, unit stride
    key_mask: Optional[Tensor]  # uint8 view (boolean), or additive in q's dtype; unit stride on Sk
    out: Tensor  # [B, Hq, Sq, D] stored as [B, Sq, Hq, D]
    lse: Tensor  # [B, Hq, Sq] float32
    splits: int
    scalars: tuple  # (scale_log2, softcap_in, softcap_out)
    causal: bool
    softcap: float


def prepare(q: Tensor, k: Tensor, seqused_k: Optional[Tensor], key_mask: Optional[Tensor], splits: Optional[int],
            flags: Flags, *, ctas_per_sm: int = 1) -> Prepared:
    """Validate and normalise a decode call (`forward`'s arguments; k only for its shape), allocate its
    outputs and pick its split count: `splits`, else FA4_INDUCTOR_DECODE_SPLITS, else `num_splits` aiming
    at `ctas_per_sm` CTAs per SM."""
    f = flags
    assert f.window_left < 0 and f.window_right < 0, "the decode kernel has no local window"
    scale, softcap = f.scale, f.softcap
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    out = layout.empty_bhsd(b, hq, sq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if seqused_k is not None and seqused_k.shape != (b,):
        raise ValueError(f"seqused_k must have shape ({b},), got {tuple(seqused_k.shape)}")
    seqused_k = layout.lengths_int32(seqused_k, q.device)
    if key_mask is not None:
        if key_mask.shape != (b, sk):
            raise ValueError(f"key_mask must have shape ({b}, {sk}), got {tuple(key_mask.shape)}")
        key_mask = key_mask if key_mask.stride(-1) == 1 else key_mask.contiguous()
        key_mask = key_mask.view(torch.uint8) if key_mask.dtype == torch.bool else key_mask
    if splits is None:
        splits = switches.current().decode_splits
    if splits is None and out.numel():
        device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        splits = num_splits(b, hkv, sq, group, sk, d, _num_sms(device_index) * ctas_per_sm)
    splits = max(1, min(int(splits or 1), MAX_SPLITS))
    if softcap > 0:
        scalars = (0.0, scale / softcap, softcap * _LOG2_E)
    else:
        scalars = (scale * _LOG2_E, 0.0, 0.0)
    return Prepared(q, seqused_k, key_mask, out, lse, splits, scalars, bool(f.causal), softcap)


def launch(call: Prepared, main, kv: tuple, combine_key: _Key, counters: Optional[Tensor] = None
           ) -> tuple[Tensor, Tensor]:
    """Run a prepared call: `main(q, *kv, seqused_k, key_mask, out, lse, o_part, lse_part, counters, *scalars)` writes
    the output itself (one split, or split with `counters`: the fused combine) or fp32 partials that the combine
    kernel `combine_key` merges."""
    q, out, lse = call.q, call.out, call.lse
    if out.numel() == 0:
        return out, lse
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        if call.splits == 1:
            main(q, *kv, call.seqused_k, call.key_mask, out, lse, None, None, None, *call.scalars)
            return out, lse
        b, hq, sq, d = q.shape
        rows = kv[0].shape[1] * row_tiles(sq, hq // kv[0].shape[1])
        o_part = torch.empty((b, rows, call.splits, TILE_M, d), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((b, rows, call.splits, TILE_M), dtype=torch.float32, device=q.device)
        if counters is not None:
            main(q, *kv, call.seqused_k, call.key_mask, out, lse, o_part, lse_part, counters, *call.scalars)
            return out, lse
        main(q, *kv, call.seqused_k, call.key_mask, None, None, o_part, lse_part, None, *call.scalars)
        compiled(combine_key)(o_part, lse_part, out, lse)
    return out, lse


def forward(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None, *,
            splits: Optional[int] = None, **flags) -> tuple[Tensor, Tensor]:
    """(out [B, Hq, Sq, D] stored as [B, Sq, Hq, D], lse [B, Hq, Sq] float32, natural log).

    `key_mask` [B, Sk] bool hides keys where False; in q's dtype it is added to the scores. `splits` overrides
    `num_splits` (tests and benchmarks); it must not depend on seqused_k."""
    call = prepare(q, k, seqused_k, key_mask, splits, Flags(**flags))
    counters = split_counters(call, k.shape[1])
    main_key, combine_key = _keys(call.q, k, call.seqused_k, call.key_mask, call.causal, call.softcap, call.splits > 1,
                                  counters is not None)
    return launch(call, compiled(main_key), (k, v), combine_key, counters)


def warmup(
    dtype: torch.dtype,
    head_dim: int,
    group: int,
    q_len: int = 1,
    device: torch.device | str = "cuda",
    *,
    causal: Optional[bool] = None,
    softcap: bool = False,
    seqused_k: Optional[bool] = None,
    key_mask: Optional[bool] = False,
) -> int:
    """Compile every kernel variant a decode step with these shapes can hit, outside CUDA-graph capture.

    `causal` / `seqused_k` / `key_mask` None compile both settings; both split and one-split main kernels and
    the combine kernel are compiled (which one runs depends on the batch and cache sizes).
    `q_len` only validates the shape (query length is a runtime value). Returns how many
    variants were compiled now (0 when all were cached)."""
    arch = check_warmup(dtype, head_dim, group, q_len, device)
    before = len(compiled)
    for c, used, masked, split in warmup_variants(causal, seqused_k, key_mask):
        for fused in fused_combine_choices(split, head_dim):
            compiled(_Key("main", dtype, head_dim, group, c, bool(softcap), used, split, arch,
                          stages=stages_for(head_dim), key_mask=masked, fused_combine=fused))
    compiled(combine_key(dtype, head_dim, group, arch))
    return len(compiled) - before


def check_warmup(dtype: torch.dtype, head_dim: int, group: int, q_len: int, device) -> str:
    """`warmup`'s argument check (ValueError); the arch to compile for."""
    if dtype not in DTYPES or head_dim not in HEAD_DIMS or not 1 <= group <= MAX_GROUP or not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(
            f"the decode kernel does not take dtype {dtype}, head_dim {head_dim}, group {group}, q_len {q_len}")
    return compile_utils.target_arch(torch.device(device), off_gpu="sm_90a")


def warmup_variants(causal: Optional[bool], seqused_k: Optional[bool], key_mask: Optional[bool]) -> list[tuple]:
    """(causal, seqused_k, key_mask, split) of every main-kernel variant `warmup` compiles (None: both settings)."""
    def both(x):
        return (False, True) if x is None else (bool(x),)

    return [(c, u, m, s) for c in both(causal) for u in both(seqused_k) for m in both(key_mask) for s in (False, True)]
