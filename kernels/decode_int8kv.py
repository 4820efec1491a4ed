"""Host side of the split-KV decode attention over an int8 KV cache (`cute/decode_attention_int8kv.py`,
merged by `cute/decode_combine.py`): attention of q over k * k_scale[..., None], v * v_scale[..., None].

What it takes (`unsupported_reason` says why not): what `decode.py` takes (sm90, q float16 / bfloat16
with a unit stride on D, head_dim == head_dim_v in (64, 128, 256), GQA groups up to 16, Sq <= 8, causal,
softcap, seqused_k and a [B, Sk] key mask, no local window), with
- k, v int8 [B, Hkv, Sk, D] of one shape, unit stride on D, 16-byte aligned start and outer strides
  (the rules of the bf16 kernel; a transposed view of an int8 [B, S, H, D] cache qualifies);
- k_scale, v_scale float32 [B, Hkv, Sk] on q's device: one scale per key and KV head, unit stride on Sk.
The output is in q's dtype, laid out like `decode.forward`'s, with lse [B, Hq, Sq] (natural log). With fp16
q the PV MMA takes P * v_scale * 64 in fp16, so v_scale must stay below 1023 (any V that fits fp16 has
v_scale <= 65504 / 127); nothing on the host reads the scales to check it.
q itself is read as a 15-bit integer per packed row (two int8 digits, error <= max |q| of the row / 64516, far
below q's own rounding) for the integer tensor cores' S = Q K^T; a NaN in q makes its row NaN.
FA4_INDUCTOR_DISABLE_DECODE=1 turns this kernel off too.

Split count: `decode.num_splits` aiming at `SPLIT_CTAS_PER_SM[head_dim]` CTAs per SM (`ctas_per_sm`; two where one
would leave a split more than `LONG_SPLIT_KEYS` keys). The
registers allow two (CTAS_PER_SM); head dim 64 fills both (its CTAs carry half the bytes of head dim 128's for the
same per-key work), head dim 128 measured faster at one, as the bf16 kernel does. A function of shapes only, never
of seqused_k's contents, so a CUDA graph stays valid when cache lengths change. `splits=` (or
FA4_INDUCTOR_DECODE_SPLITS) overrides it.
Ring depth: `stages_for(head_dim)` from the same shared-memory budget as the bf16 kernel
(FA4_INDUCTOR_DECODE_SMEM_KB, default 100 KB: two CTAs per SM).

Compilation: one main-kernel variant per (dtype, head_dim, group, causal, softcap on/off, seqused_k given,
key mask given, split or not, ring depth, arch), about a second each, kept in `compiled`; the combine
kernel is `decode.py`'s (its cache). Call `warmup` before capturing CUDA graphs. Launches go to the
current torch stream: no host sync, no host read of seqused_k or the scales.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import decode, layout, switches
from .cute import compile_utils
from .flags import Flags

KV_DTYPE = torch.int8
SCALE_DTYPE = torch.float32
CTAS_PER_SM = 2
"""CTAs a SM each variant's registers must allow (its PTX's `.minnctapersm`; FA4_INDUCTOR_DECODE_MIN_CTAS raises it)."""

SPLIT_CTAS_PER_SM = {64: 2, 128: 1, 256: 2}
"""CTAs a SM the split rule aims at, by head dim. Head dim 128 at one: the same call with one CTA a SM's split count
against two's, in alternating rounds (docs/benchmarks.md session 43, H100, CUDA-graph medians, us): b1 x 4k 8.3 /
9.9, b1 x 32k 29.8 / 31.2, b1 x 128k 95.2 / 96.4, b2 x 32k 51.8 / 52.6, b4 x 32k 95.3 / 96.4, b8 x 32k 184.1 / 184.5,
b8 x 4k 29.8 / 30.3 (the H200 the same session, b1 x 32k: 25.1 / 27.2). Head dim 64 at two: b1 x 32k 13.5 against
15.8 at one (b8 x 32k 99.4 against 97.4). Head dim 256 (not measured) keeps two."""
HEAD_DIMS = (64, 128, 256)  # the int8-KV kernel's (`cute/decode_attention_int8kv.HEAD_DIMS`), within decode.HEAD_DIMS
SCALE_BYTES = 4
HALF_TILE_ROWS = 8  # packed query rows (q_len x group) that fill only the first half of the kernel's 16-row tile


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, *, k_scale: Optional[Tensor], v_scale: Optional[Tensor],
                       seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None, **flags) -> str | None:
    """Why the int8-KV decode kernel cannot take this call, or None if it can (see the module docstring)."""
    if k.dtype != KV_DTYPE or v.dtype != KV_DTYPE:
        return f"the int8-KV decode kernel takes int8 k and v; got {k.dtype} and {v.dtype}"
    if k.shape != v.shape:
        return f"the int8-KV decode kernel takes k and v of one shape; got {tuple(k.shape)} and {tuple(v.shape)}"
    reason = decode.unsupported_reason(q, k, v, seqused_k=seqused_k, key_mask=key_mask, **flags)
    if reason is not None:
        return reason
    if q.shape[-1] not in HEAD_DIMS:
        return f"the int8-KV decode kernel takes head dims {HEAD_DIMS}; got {q.shape[-1]}"
    if key_mask is not None and key_mask.dtype != torch.bool:
        return "the int8-KV decode kernel takes a boolean key mask, not an additive one"
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            return f"the int8-KV decode kernel needs {name}"
        if s.dtype != SCALE_DTYPE or s.device != q.device:
            return f"{name} must be float32 on q's device; got {s.dtype} on {s.device}"
        if s.shape != k.shape[:3]:
            return f"{name} must have shape {tuple(k.shape[:3])} (one scale per key and KV head); got {tuple(s.shape)}"
        if s.stride(-1) != 1 and s.shape[-1] > 1:
            return f"{name} has stride {s.stride(-1)} along the keys (needs 1)"
    return None


def stages_for(head_dim: int) -> int:
    """Depth of each warp's ring (int8 K and V tiles plus their scales): as deep as a CTA's shared-memory
    budget allows (FA4_INDUCTOR_DECODE_SMEM_KB), at least 2 (the warps' merge reuses the ring), at most 8."""
    budget = switches.current().decode_smem_kb * 1024
    per_stage = decode.NUM_WARPS * 2 * decode.TILE_N * (head_dim + SCALE_BYTES)
    q_bytes = decode.TILE_M * head_dim * (2 + 2)  # q in its dtype, then as two int8 digits
    return max(2, min(8, (budget - q_bytes) // per_stage))


def ctas_per_sm(head_dim: int) -> int:
    """The CTAs a SM the split rule aims at: SPLIT_CTAS_PER_SM's, or more when FA4_INDUCTOR_DECODE_MIN_CTAS asks for
    registers that allow more."""
    return max(SPLIT_CTAS_PER_SM.get(head_dim, CTAS_PER_SM), switches.current().decode_min_ctas)


LONG_SPLIT_KEYS = 8192
"""A split of more keys than this at one CTA a SM makes the rule aim at `CTAS_PER_SM` instead (twice the splits).
H200, docs/benchmarks.md session 47 run 4, head dim 128, us at one / two CTAs a SM: b8 x 32k (16k keys a split at one)
142.7 / 135.0; b1 x 128k (8k keys) 72.5 / 72.4 and b1 x 32k (2k) 23.5 / 25.0 keep one. The H100 (session 43 run 4)
tied b8 x 32k: 184.1 / 184.5."""


def num_splits(batch: int, kv_heads: int, q_len: int, group: int, seqlen_k: int, head_dim: int, num_sms: int) -> int:
    """`decode.num_splits` for `ctas_per_sm(head_dim)` CTAs per SM, or `CTAS_PER_SM` where a split would otherwise
    take more than LONG_SPLIT_KEYS keys."""
    per_sm = ctas_per_sm(head_dim)
    splits = decode.num_splits(batch, kv_heads, q_len, group, seqlen_k, head_dim, num_sms * per_sm)
    if per_sm < CTAS_PER_SM and seqlen_k > LONG_SPLIT_KEYS * splits:
        splits = decode.num_splits(batch, kv_heads, q_len, group, seqlen_k, head_dim, num_sms * CTAS_PER_SM)
    return splits


def _key(dtype: torch.dtype, head_dim: int, group: int, q_len: int, causal: bool, softcap: bool, seqused: bool,
         split: bool, key_mask: bool, arch: str, fused_combine: bool = False) -> decode._Key:
    current = switches.current()
    return decode._Key("int8kv", dtype, head_dim, group, causal, softcap, seqused, split, arch,
                       stages=stages_for(head_dim), key_mask=key_mask, min_ctas=current.decode_min_ctas or CTAS_PER_SM,
                       half_rows=current.decode_half_rows and q_len * group <= HALF_TILE_ROWS,
                       fused_combine=fused_combine)


def _compile(key: decode._Key):
    """Compile one variant with fake tensors (no GPU needed: CUTE_DSL_ARCH=sm_90a on a CPU)."""
    cute = compile_utils.cute_for(key.arch)
    from cutlass import Float32, Int8

    from .cute.decode_attention_int8kv import DecodeAttentionInt8KVSm90

    dt = compile_utils.cutlass_dtype(key.dtype)
    d = key.head_dim
    kernel = DecodeAttentionInt8KVSm90(dt, d, key.group, key.causal, key.softcap, key.seqused, key.split, key.stages,
                                       key.key_mask, key.min_ctas, key.half_rows, key.fused_combine)

    def kv():
        return decode.fake_bhsd(cute, Int8, d, decode.ALIGN_BYTES, decode.ALIGN_BYTES)

    def scales():
        return cute.runtime.make_fake_tensor(
            Float32, (cute.sym_int(), cute.sym_int(), cute.sym_int()), (cute.sym_int64(), cute.sym_int64(), 1),
            assumed_align=SCALE_BYTES)

    return compile_utils.compile_for_tvm_ffi(
        cute, kernel, decode.fake_bhsd(cute, dt, d), kv(), kv(), scales(), scales(), *decode.fake_main_tail(cute, key))


compiled = compile_utils.CompiledVariants(_compile)
"""`compiled(key)`: the int8-KV main-kernel variant `key` names, compiled on first use."""


def compile_cache_info() -> int:
    """How many int8-KV main-kernel variants this process has compiled."""
    return len(compiled)


def forward(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor, seqused_k: Optional[Tensor] = None,
            key_mask: Optional[Tensor] = None, *, splits: Optional[int] = None, **flags) -> tuple[Tensor, Tensor]:
    """(out [B, Hq, Sq, D] stored as [B, Sq, Hq, D] in q's dtype, lse [B, Hq, Sq] float32, natural log) of q
    over k * k_scale[..., None] and v * v_scale[..., None].

    `key_mask` [B, Sk] bool hides keys where False. `splits` overrides `num_splits` (tests and
    benchmarks); it must not depend on seqused_k."""
    call = decode.prepare(q, k, seqused_k, key_mask, splits, Flags(**flags), ctas_per_sm=ctas_per_sm(q.shape[-1]))
    k_scale, v_scale = layout.unit_last_stride(k_scale), layout.unit_last_stride(v_scale)
    group = q.shape[1] // k.shape[1]
    arch = compile_utils.target_arch(q.device)
    counters = decode.split_counters(call, k.shape[1])
    main = _key(q.dtype, q.shape[-1], group, q.shape[2], call.causal, call.softcap > 0, call.seqused_k is not None,
                call.splits > 1, call.key_mask is not None, arch, counters is not None)
    return decode.launch(call, compiled(main), (k, v, k_scale, v_scale),
                         decode.combine_key(q.dtype, q.shape[-1], group, arch), counters)


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
    """Compile every kernel variant a decode step with these shapes can hit, outside CUDA-graph capture
    (as `decode.warmup`: None compiles both settings; split and one-split main kernels and the combine
    kernel). Returns how many variants were compiled now (0 when all were cached)."""
    arch = decode.check_warmup(dtype, head_dim, group, q_len, device)
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"the int8-KV decode kernel takes head dims {HEAD_DIMS}; got {head_dim}")
    before = len(compiled) + len(decode.compiled)
    for c, used, masked, split in decode.warmup_variants(causal, seqused_k, key_mask):
        for fused in decode.fused_combine_choices(split, head_dim):
            compiled(_key(dtype, head_dim, group, q_len, c, bool(softcap), used, split, masked, arch, fused))
    decode.compiled(decode.combine_key(dtype, head_dim, group, arch))
    return len(compiled) + len(decode.compiled) - before
