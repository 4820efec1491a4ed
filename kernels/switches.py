"""The environment the kernels read, read once: `current()` holds it, `reset()` has the next call read
it again (tests and A/B benchmarks that flip a variable call it after setting it). Nothing else in
`kernels/` reads os.environ, so no call pays an environment lookup. Also the gate every CUDA
kernel of ours starts with.

Switches (on: 1 / true / yes / on): FA4_INDUCTOR_DISABLE_FA4, FA4_INDUCTOR_DISABLE_DECODE,
FA4_INDUCTOR_DECODE_EVERYWHERE (fixed-length decode calls to our kernel, not cuDNN SDPA),
FA4_INDUCTOR_SMALL_ON_FA4 (small unmasked attentions stay on FA4 instead of cuDNN SDPA),
FA4_INDUCTOR_NO_REPLAY (FA4 launch replay off). Decode-kernel tuning: FA4_INDUCTOR_DECODE_PDL
(0 / false / no / off: the combine kernel without programmatic dependent launch),
FA4_INDUCTOR_DECODE_SPLITS (a fixed split count), FA4_INDUCTOR_DECODE_SMEM_KB (a CTA's shared-memory
budget, default 100), FA4_INDUCTOR_DECODE_MIN_CTAS (int8-KV kernel: CTAs a SM its registers must allow, so
ptxas caps them; default 2, the CTAs a SM its shared memory allows, which also lets ptxas use up to 255 registers),
FA4_INDUCTOR_DECODE_HALF_ROWS (0 / false / no / off: the int8-KV
kernel computes the softmax of the tile's rows 8-15 even when a call packs at most 8 query rows; default on,
measured faster or equal), FA4_INDUCTOR_DECODE_FUSED_COMBINE (1 / true / yes / on: the last split CTA of each (batch,
row tile) merges the splits, no combine kernel; default off: slower at b1, equal at b8, session 29; one stream of a device at a time:
the split counters are the device's). W4A16 decode GEMM tuning: FA4_INDUCTOR_W4A16_CTA (a fixed CTA shape,
"RTxWNxWK": row tiles a warp, warps along N, warps along K; default: `w4a16_decode.cta_shape`'s rule),
FA4_INDUCTOR_W4A16_PDL (0 / false / no / off: launched without programmatic dependent launch; default on),
FA4_INDUCTOR_W4A16_LOAD (its load path: auto, the default, `w4a16_decode.auto_load`; registers, rolling,
rolling+2ctas, bulk, with options and a ring depth, bulk+scales:4, or xsmem[+2ctas][:sets] on CTAs of one K
warp; `w4a16_decode.parse_load`),
FA4_INDUCTOR_W4A16_PACK (on: NVFP4 weights prepacked once into the
kernel's packed layout, `w4a16_decode.pack_nvfp4`; tiles: that layout in 16-row tiles; default off),
FA4_INDUCTOR_W4A16_GEMV (which calls of the plain layout take the CUDA-core GEMV, `cute/w4a16_gemv.py`, by
their rows M: unset or auto, the measured rule `w4a16_decode.GEMV_AUTO_ROWS`; on, M = 1..4; off, none),
FA4_INDUCTOR_W4A16_INT_GEMV (which calls take the integer GEMVs: NVFP4 ones of the plain layout,
`cute/nvfp4_int_gemv.py`, and int8 ones, `cute/int8_int_gemv.py`: unset or auto, one-row NVFP4 calls where it measured
faster, `w4a16_decode.int_gemv_auto`, and no int8 call yet, `int8_int_gemv.int8_auto`; on, 1..4 rows; off, none),
FA4_INDUCTOR_INT_GEMV_PREFETCH (0, the default, or D >= 3: the integer GEMV keeps the weight bytes of the steps up to D
ahead prefetched into L2; measured slower, session 19), FA4_INDUCTOR_GEMV_SPLIT (auto, on or off: both GEMVs
split the K of weights of few rows among the CTAs of a cluster, `nvfp4_int_gemv.shape`, `w4a16_decode.gemv_shape`;
auto is off until measured, `nvfp4_int_gemv.SPLIT_BY_DEFAULT`). Others'
variables we read: CUTE_DSL_ARCH (the CuTe DSL compile target), FA4's disk-cache pair and XDG_CACHE_HOME (`fa4.py` turns FA4's disk cache on).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Mapping, NamedTuple, Optional

DISABLE_FA4 = "FA4_INDUCTOR_DISABLE_FA4"
DISABLE_DECODE = "FA4_INDUCTOR_DISABLE_DECODE"
NO_REPLAY = "FA4_INDUCTOR_NO_REPLAY"
DECODE_EVERYWHERE = "FA4_INDUCTOR_DECODE_EVERYWHERE"
SMALL_ON_FA4 = "FA4_INDUCTOR_SMALL_ON_FA4"
DECODE_PDL = "FA4_INDUCTOR_DECODE_PDL"
DECODE_SPLITS = "FA4_INDUCTOR_DECODE_SPLITS"
DECODE_SMEM_KB = "FA4_INDUCTOR_DECODE_SMEM_KB"
DECODE_MIN_CTAS = "FA4_INDUCTOR_DECODE_MIN_CTAS"
DECODE_HALF_ROWS = "FA4_INDUCTOR_DECODE_HALF_ROWS"
DECODE_FUSED_COMBINE = "FA4_INDUCTOR_DECODE_FUSED_COMBINE"
W4A16_CTA = "FA4_INDUCTOR_W4A16_CTA"
W4A16_PDL = "FA4_INDUCTOR_W4A16_PDL"
W4A16_LOAD = "FA4_INDUCTOR_W4A16_LOAD"
W4A16_PACK = "FA4_INDUCTOR_W4A16_PACK"
W4A16_GEMV = "FA4_INDUCTOR_W4A16_GEMV"
W4A16_INT_GEMV = "FA4_INDUCTOR_W4A16_INT_GEMV"
INT_GEMV_PREFETCH = "FA4_INDUCTOR_INT_GEMV_PREFETCH"
GEMV_SPLIT = "FA4_INDUCTOR_GEMV_SPLIT"
CUTE_DSL_ARCH = "CUTE_DSL_ARCH"
FA4_CACHE_ENABLED = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_CACHE_DIR = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
ON_OFF = (DISABLE_FA4, DISABLE_DECODE, NO_REPLAY, DECODE_EVERYWHERE, SMALL_ON_FA4)
# the switches that change which kernel a call gets
ROUTING = (DISABLE_FA4, DISABLE_DECODE, DECODE_EVERYWHERE, SMALL_ON_FA4)


class Switches(NamedTuple):
    on: frozenset
    """The on/off switches (`ON_OFF`) that are on."""
    routing: tuple
    """The raw values of the `ROUTING` switches: part of the per-signature route cache's key."""
    decode_pdl: bool
    decode_splits: Optional[int]
    decode_smem_kb: int
    decode_min_ctas: int
    decode_half_rows: bool
    decode_fused_combine: bool
    w4a16_cta: Optional[tuple[int, int, int]]
    w4a16_pdl: bool
    w4a16_load: Optional[str]
    """The raw value; `w4a16_decode.parse_load` checks it."""
    w4a16_pack: Optional[str]
    """None (off), "pairs" (on) or "tiles"."""
    w4a16_gemv: Optional[int]
    """None (auto: `w4a16_decode.GEMV_AUTO_ROWS`) or the most rows of x a call may have to take the GEMV (0: none)."""
    w4a16_int_gemv: Optional[bool]
    """None (auto: `w4a16_decode.int_gemv_auto`'s measured rule for NVFP4, `int8_int_gemv.int8_auto` for int8), True
    (NVFP4 and int8 calls of 1..4 rows) or False (none)."""
    int_gemv_prefetch: int
    """Steps ahead of its register loads the integer GEMV prefetches its weight rows into L2 (0: none)."""
    gemv_split: Optional[bool]
    cute_dsl_arch: Optional[str]
    fa4_cache_enabled_set: bool
    """FA4's disk-cache switch is set (by the user, or by `fa4.py` before importing FA4)."""
    fa4_cache_dir: Optional[str]
    cache_home: str
    """XDG_CACHE_HOME, else ~/.cache."""


def _is_on(value: Optional[str]) -> bool:
    return (value or "0").strip().lower() in ("1", "true", "yes", "on")


def _is_off(value: str) -> bool:
    return value.strip().lower() in ("0", "false", "no", "off")


def read(env: Mapping[str, str]) -> Switches:
    return Switches(
        on=frozenset(name for name in ON_OFF if _is_on(env.get(name))),
        routing=tuple(env.get(name) for name in ROUTING),
        decode_pdl=not _is_off(env.get(DECODE_PDL, "1")),
        decode_splits=int(env[DECODE_SPLITS]) if env.get(DECODE_SPLITS) else None,
        decode_smem_kb=int(env.get(DECODE_SMEM_KB) or 100),
        decode_min_ctas=int(env.get(DECODE_MIN_CTAS) or 0),
        decode_half_rows=not _is_off(env.get(DECODE_HALF_ROWS, "1")),
        decode_fused_combine=_is_on(env.get(DECODE_FUSED_COMBINE)),
        w4a16_cta=parse_cta_shape(env.get(W4A16_CTA)),
        w4a16_pdl=not _is_off(env.get(W4A16_PDL, "1")),
        w4a16_load=(env.get(W4A16_LOAD) or "").strip() or None,
        w4a16_pack=parse_pack(env.get(W4A16_PACK)),
        w4a16_gemv=parse_gemv(env.get(W4A16_GEMV)),
        w4a16_int_gemv=parse_auto_on_off(W4A16_INT_GEMV, env.get(W4A16_INT_GEMV)),
        int_gemv_prefetch=parse_prefetch(env.get(INT_GEMV_PREFETCH)),
        gemv_split=parse_auto_on_off(GEMV_SPLIT, env.get(GEMV_SPLIT)),
        cute_dsl_arch=env.get(CUTE_DSL_ARCH) or None,
        fa4_cache_enabled_set=FA4_CACHE_ENABLED in env,
        fa4_cache_dir=env.get(FA4_CACHE_DIR) or None,
        cache_home=env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"),
    )


def parse_pack(value: Optional[str]) -> Optional[str]:
    """FA4_INDUCTOR_W4A16_PACK: off (unset, 0 / false / no / off), on (1 / true / yes / on: "pairs") or "tiles"."""
    v = (value or "").strip().lower()
    if not v or _is_off(v):
        return None
    if _is_on(v):
        return "pairs"
    if v == "tiles":
        return v
    raise ValueError(f"{W4A16_PACK} is off, on or tiles, not {value!r}")


def parse_gemv(value: Optional[str]) -> Optional[int]:
    """FA4_INDUCTOR_W4A16_GEMV: auto (unset or "auto": None), on (M up to 4) or off (0)."""
    setting = parse_auto_on_off(W4A16_GEMV, value)
    return None if setting is None else 4 if setting else 0


def parse_auto_on_off(name: str, value: Optional[str]) -> Optional[bool]:
    """A switch that is auto (unset or "auto": None), on (True) or off (False)."""
    v = (value or "").strip().lower()
    if not v or v == "auto":
        return None
    if _is_on(v) or _is_off(v):
        return _is_on(v)
    raise ValueError(f"{name} is auto, on or off, not {value!r}")


def parse_prefetch(value: Optional[str]) -> int:
    """FA4_INDUCTOR_INT_GEMV_PREFETCH: 0 (unset) or a window of 3 or more steps (the registers already hold two)."""
    v = (value or "").strip()
    if not v:
        return 0
    if not v.isdigit() or int(v) in (1, 2):
        raise ValueError(f"{INT_GEMV_PREFETCH} is 0 or a step count of at least 3, not {value!r}")
    return int(v)


def parse_cta_shape(value: Optional[str]) -> Optional[tuple[int, int, int]]:
    """FA4_INDUCTOR_W4A16_CTA's "RTxWNxWK" as (row tiles, warps_n, warps_k); None for no value."""
    if not value:
        return None
    parts = value.lower().split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{W4A16_CTA} takes RTxWNxWK (three positive integers, e.g. 1x1x8), not {value!r}")
    return tuple(int(p) for p in parts)


@functools.cache
def current() -> Switches:
    """The environment as of the first call since the process started or `reset()` ran."""
    return read(os.environ)


def reset() -> None:
    """Read the environment again on the next `current()` (after a test or benchmark changed it)."""
    current.cache_clear()


def gate(kernel: str, switch: str, q, dtypes: tuple) -> str | None:
    """The checks every CUDA kernel of ours starts with: why `kernel` cannot take q, or None.

    `switch` (one of `ON_OFF`) turns the kernel off; then the device must be CUDA and q's dtype one of `dtypes`."""
    if switch in current().on:
        return f"{kernel} is disabled by {switch}"
    if q.device.type != "cuda":
        return f"{kernel} runs on CUDA, not {q.device.type}"
    if q.dtype not in dtypes:
        names = " / ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"{kernel} takes {names}, not {str(q.dtype).removeprefix('torch.')}"
    return None


@functools.cache
def capability(device_index: int | None) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (None: the current one)."""
    import torch

    return torch.cuda.get_device_capability(device_index)
