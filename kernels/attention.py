"""`fa4::attention` and `fa4::attention_backward`: attention over SDPA-layout tensors.

    out, lse = torch.ops.fa4.attention(q, k, v, seqused_k=None, key_mask=None, *, scale, causal=False,
                                       window_left=-1, window_right=-1, softcap=0.0)

q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], any strides (HF hands in transposed views
of [B, S, H, D]). `Hq % Hkv == 0` is grouped-query attention: query head h reads K/V head
`h // (Hq // Hkv)`; K/V are never repeated. `scale` multiplies q.k; `softcap > 0` applies
`softcap * tanh(s / softcap)` to the scaled scores; the masks follow FlashAttention's bottom-right
alignment (see `reference.py`); `seqused_k` [B] int32 (or int64) gives per-sequence used key lengths,
each in 0..Sk (checked on the CPU; on CUDA a check would cost a host sync, and values outside are undefined);
`key_mask` [B, Sk] bool hides the keys where it is False (a padding mask, any pattern); a [B, Sq, Sk] one hides
key j from query row i where key_mask[b, i, j] is False (a boolean mask per query row, HF's prefill mask
built outside the forward). A key_mask in q's dtype is added to the scaled, soft-capped
scores instead, any values (eager attention code's mask built outside the forward): decode-shaped calls run it on
our decode kernel; a [B, Sq, Sk] one of 0 and finfo.min (bfloat16, float32) is read on the host as the boolean
ones are, and runs FA4 when it is a left-padded causal prefix, the rows that see no key then set as eager's
(`_blind_rows_as_mean`); the others run on the SDPA fallback (without a softcap) or the reference. Their backward
runs the reference.
Inputs the kernels cannot take are errors, never reinterpreted: dtypes other than float16, bfloat16,
float32, float64; head dims outside 8..256 or not a multiple of 8; scale <= 0; softcap < 0; windows < -1.

Outputs: `out` [B, Hq, Sq, Dv] in q's dtype, stored as [B, Sq, Hq, Dv] (so the usual
`out.transpose(1, 2).reshape(B, S, -1)` is free), and `lse` [B, Hq, Sq] float32 (float64 for float64 inputs), the natural-log
log-sum-exp of each row (-inf for a row that sees no key), which the backward consumes.

The ops are defined in the `fa4` library (`library.py`); `unsupported_reason` is the check lowering
asks before emitting them (exported as `kernels.attention_unsupported_reason`).

Kernels: CPU runs the float32/float64 reference. CUDA takes the first route of `routes.FORWARD` that
takes the call: PyTorch's cuDNN SDPA (`sdpa_cudnn.py`) for decode-shaped calls with one cache length,
our split-KV decode kernel (`decode.py`) for decode-shaped calls with per-sequence lengths or a key mask,
cuDNN SDPA again for small unmasked attentions (`crossover.small`: those lowering leaves to the op when their
sizes are symbolic), FA4 (`fa4.py`), PyTorch's memory-efficient SDPA kernel (`sdpa_fallback.py`), else the
reference on the device; `kernel_for` says which and why, and `_route` remembers it per call signature
(`backward_kernel_for` for the backward, `routes.BACKWARD`: FA4, the SDPA fallback's recomputing
backward, or the reference). FA4 takes no key mask: a key-mask call that is not decode-shaped first
has its mask read on the host (`key_mask_form`, outside CUDA-graph capture), and goes to FA4
when the mask hides nothing in use, or, with no band, is right padding (seqused_k), or, on a
self-attention, is left padding, or right padding under a causal mask (FA4's varlen segments over the
padded buffer), or, one per query row, is a left-padded causal prefill over an empty static cache, with or
without a sliding window (the same varlen segments over the first Sq keys; the backward too when those are all the
keys), or sequences packed back to back, causal within each (a varlen segment a sequence); a small one
(`crossover.py`) skips the read and runs on the SDPA fallback with its mask.
"""

from __future__ import annotations

import logging
import math
import weakref
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import crossover, fa4, layout, library, reference, routes, switches
from .flags import SCHEMA as FLAGS_SCHEMA, Flags

log = logging.getLogger("fa4_inductor.kernels")

MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8
CUDA_DTYPES = layout.HALF_DTYPES
CPU_DTYPES = layout.HALF_DTYPES + (torch.float32, torch.float64)


def unsupported_reason(device_type: str, dtype: torch.dtype, head_dim: int, head_dim_v: int) -> str | None:
    """Why `fa4::attention` cannot take inputs of this kind on this device, or None if it can.

    Head-dim limits are FA4's (8..256, a multiple of 8) on every device, so that a graph rewritten
    on the CPU is the graph a GPU would get.
    """
    dtypes = CUDA_DTYPES if device_type == "cuda" else CPU_DTYPES
    if dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"dtype {str(dtype).removeprefix('torch.')} is not supported on {device_type} (takes {names})"
    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d % HEAD_DIM_MULTIPLE or not 0 < d <= MAX_HEAD_DIM:
            return f"{name} {d} is not a multiple of {HEAD_DIM_MULTIPLE} in 8..{MAX_HEAD_DIM}"
    if device_type not in ("cpu", "cuda"):
        return f"device {device_type} has no fa4 kernel"
    return None


def kernel_for(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor] = None, *,
               seqused_k: Optional[Tensor] = None, **flags) -> tuple[str, str]:
    """(kernel name, why) for a forward call: "sdpa_cudnn", "decode", "sdpa_small", "fa4", "sdpa" or "reference", the
    first route of `routes.FORWARD` that takes it (CPU: the reference).

    Decode-shaped calls (few packed query rows against a long cache, `decode.dispatch_reason`)
    go to our split-KV decode kernel when they carry per-sequence lengths or a key mask, else to
    cuDNN SDPA (`sdpa_cudnn`, faster there); small unmasked ones to cuDNN SDPA too ("sdpa_small"); the rest to FA4
    where it takes them, else to the SDPA fallback.
    FA4 takes no key mask (a padding mask): such calls that are not decode-shaped go to the SDPA fallback."""
    route, why = _choose(routes.FORWARD, q, k, v, seqused_k, key_mask, flags)
    return route.name, why


def backward_kernel_for(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor] = None, *,
                        seqused_k: Optional[Tensor] = None, **flags) -> tuple[str, str]:
    """(kernel name, why) for a backward call: "fa4", "sdpa" (the SDPA fallback's recomputing backward)
    or "reference" (`routes.BACKWARD`)."""
    route, why = _choose(routes.BACKWARD, q, k, v, seqused_k, key_mask, flags)
    return route.name, why


def _choose(table: tuple, q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor], key_mask: Optional[Tensor],
            flags: dict) -> tuple[routes.Route, str]:
    if q.device.type != "cuda":
        return routes.REFERENCE, f"{q.device.type} runs the reference"
    route, declined = routes.choose(table, q, k, v, seqused_k, key_mask, device_flags(flags, k.shape[2]))
    return route, routes.why(route, declined)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor], key_mask: Optional[Tensor] = None,
                  flags: Optional[dict] = None, kv_dtype: Optional[torch.dtype] = None) -> None:
    """The op's contract on its inputs (ValueError, or torch._check for sizes). `kv_dtype`: the dtype k and v
    must have when it is not q's (`fa4::attention_int8kv`'s int8 cache)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"fa4::attention wants 4-D q, k, v; got {q.dim()}, {k.dim()}, {v.dim()} dims")
    if not (k.dtype == v.dtype == (kv_dtype or q.dtype)):
        want = f"{kv_dtype} k, v" if kv_dtype else "one dtype for q, k, v"
        raise ValueError(f"fa4::attention wants {want}; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in CPU_DTYPES:
        raise ValueError(f"fa4::attention takes float16, bfloat16, float32 or float64 q, k, v; got {q.dtype}")
    for name, d in (("head_dim", q.shape[-1]), ("head_dim_v", v.shape[-1])):
        if d % HEAD_DIM_MULTIPLE or not 0 < d <= MAX_HEAD_DIM:
            raise ValueError(f"fa4::attention: {name} {d} is not a multiple of {HEAD_DIM_MULTIPLE} in 8..{MAX_HEAD_DIM}")
    if flags is not None:
        _check_flags(Flags(**flags))
    torch._check(q.shape[0] == k.shape[0] == v.shape[0], lambda: "q, k, v batch sizes differ")
    torch._check(k.shape[1] == v.shape[1], lambda: "k and v head counts differ")
    torch._check(q.shape[1] % k.shape[1] == 0, lambda: f"{q.shape[1]} query heads is not a multiple of {k.shape[1]} kv heads")
    torch._check(k.shape[2] == v.shape[2], lambda: "k and v sequence lengths differ")
    torch._check(q.shape[3] == k.shape[3], lambda: "q and k head dims differ")
    if seqused_k is not None:
        torch._check(seqused_k.shape == (q.shape[0],), lambda: "seqused_k must have shape [B]")
        if seqused_k.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"fa4::attention wants an int32 or int64 seqused_k, got {seqused_k.dtype}")
        if seqused_k.device.type == "cpu" and not isinstance(seqused_k, torch._subclasses.FakeTensor) \
                and bool(((seqused_k < 0) | (seqused_k > k.shape[2])).any()):
            raise ValueError(f"fa4::attention: seqused_k {seqused_k.tolist()} is not within 0..{k.shape[2]} keys")
    if key_mask is not None:
        if key_mask.dtype not in (torch.bool, q.dtype):
            raise ValueError(f"fa4::attention wants a bool key_mask, or an additive one in q's dtype ({q.dtype}), "
                             f"got {key_mask.dtype}")
        if key_mask.dim() == 3:
            torch._check(key_mask.shape == (q.shape[0], q.shape[2], k.shape[2]),
                         lambda: "a 3-D key_mask must have shape [B, Sq, Sk]")
        else:
            torch._check(key_mask.shape == (q.shape[0], k.shape[2]), lambda: "key_mask must have shape [B, Sk]")


def _check_flags(flags: Flags) -> None:
    if not (flags.scale > 0 and math.isfinite(flags.scale)):
        raise ValueError(f"fa4::attention wants a positive finite scale, got {flags.scale}")
    if not (flags.softcap >= 0 and math.isfinite(flags.softcap)):
        raise ValueError(f"fa4::attention wants softcap >= 0 (0: off), got {flags.softcap}")
    for name in ("window_left", "window_right"):
        if getattr(flags, name) < -1:
            raise ValueError(f"fa4::attention wants {name} >= 0, or -1 for unbounded; got {getattr(flags, name)}")


def _empty_bshd(b, h, s, d, like: Tensor) -> Tensor:
    return layout.empty_bhsd(b, h, s, d, dtype=like.dtype, device=like.device)


def _forward_outputs(q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    b, hq, sq, _ = q.shape
    return _empty_bshd(b, hq, sq, v.shape[-1], q), q.new_empty((b, hq, sq), dtype=reference.compute_dtype(q.dtype))


_COMPLETED: dict = {}


def _complete(flags: dict) -> dict:
    """Device kernels get only the flags a caller passed; the schema's defaults fill in the rest (remembered per
    set of passed flags: a model calls with a few, on the host path of every call). The dict returned may be shared:
    read it, never change it."""
    if len(flags) == len(Flags._fields):
        return flags
    key = tuple(flags.items())
    done = _COMPLETED.get(key)
    if done is None:
        if len(_COMPLETED) > 256:
            _COMPLETED.clear()
        done = _COMPLETED[key] = Flags(**flags)._asdict()
    return done


def device_flags(flags: dict, keys: int) -> dict:
    """`_complete`'s flags for a call over `keys` key slots, without a left window that hides no slot: a row's
    diagonal is at most keys - 1 (a used length is at most the slots), so with window_left >= keys - 1 every window
    starts at or before slot 0. HF's sliding-window caches hold exactly the window: each decode step over one carries
    such a window, which the decode kernel and cuDNN do not take."""
    done = _complete(flags)
    if 0 <= done["window_left"] and keys - 1 <= done["window_left"]:
        return {**done, "window_left": -1}
    return done


library.define("attention(Tensor q, Tensor k, Tensor v, Tensor? seqused_k=None, Tensor? key_mask=None, "
            f"*, {FLAGS_SCHEMA}) -> (Tensor, Tensor)")
# `attention_forward`: the same computation without an autograd formula, for graphs whose backward is
# already written out (Inductor's compiled forward and backward: lowering/post_grad.py swaps it in). It
# skips torch.library's Python autograd layer and one dispatcher hop, ~20 us of host time per call.
library.define("attention_forward(Tensor q, Tensor k, Tensor v, Tensor? seqused_k=None, Tensor? key_mask=None, "
            f"*, {FLAGS_SCHEMA}) -> (Tensor, Tensor)")
library.define("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            f"Tensor? grad_lse=None, Tensor? seqused_k=None, Tensor? key_mask=None, *, {FLAGS_SCHEMA}) "
            "-> (Tensor, Tensor, Tensor)")


def attention(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
              **flags) -> tuple[Tensor, Tensor]:
    """The flags are `flags.Flags` (scale, causal, window_left, window_right, softcap)."""
    _check_inputs(q, k, v, seqused_k, key_mask, flags)
    return reference.forward(q, k, v, seqused_k, key_mask, **_complete(flags))


_ROUTES = layout.SignatureCache(4096)


def _route(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor], key_mask: Optional[Tensor],
           flags: dict) -> routes.Route:
    """`kernel_for`'s choice, remembered per call signature: everything it reads (shapes, strides,
    16-byte alignment, dtype, device, flags, the routing switches) is in the key. Decode steps call
    with one signature thousands of times; this keeps the checks off their host path."""
    key = (layout.describe(q, k, v, seqused_k, key_mask), tuple(flags.values()), switches.current().routing)
    route = _ROUTES.get(key)
    if route is None:
        _check_inputs(q, k, v, seqused_k, key_mask, flags)
        route, why = _choose(routes.FORWARD, q, k, v, seqused_k, key_mask, flags)
        log.debug("fa4::attention q%s k%s %s: kernel %s (%s)", tuple(q.shape), tuple(k.shape), q.dtype, route.name,
                  why)
        _ROUTES[key] = route
    return route


class KeyMaskForm(NamedTuple):
    """What a call's key mask is, read off its contents: `key_mask` None when FA4's arguments say it all
    (`seqused_k`, or `padded` for a padded self-attention: ("left", the first visible key of each sequence)
    or ("right", the lengths), which `fa4.forward_padded` runs as varlen segments)."""

    seqused_k: Optional[Tensor]
    key_mask: Optional[Tensor]
    padded: Optional[tuple[str, Tensor]] = None
    causal_keys: Optional[int] = None
    """With `padded`: a [B, Sq, Sk] mask that is a causal self-attention over the first Sq keys (Sq == this),
    left-padded, hiding the rest (HF's prefill over an empty static cache, or with Sq == Sk the mask HF builds
    outside a compiled layer): run on k, v[:, :, :Sq], causal, with `window_left`."""
    window_left: int = -1
    """With `causal_keys`: each query row sees at most this many keys before its own (a sliding-window layer's mask;
    -1: no window)."""


RIGHT_PADDING_ON_FA4 = True
"""Right padding under a causal mask as FA4 varlen segments (`fa4.forward_padded`, two calls): tested on the CPU
against FA4's varlen semantics and on the H200 (tests/test_gpu_fa4.py, `test_padding_runs_fa4_varlen`,
docs/benchmarks.md session 10). False sends such masks to the SDPA fallback with the mask."""

PACKED_BLIND_ROWS_ON_FA4 = True
"""Packed-sequence masks with rows that see no key (Llama 4's chunks left-padded) as FA4 varlen segments with used
lengths (`_packed_segments`): tested on the CPU against FA4's varlen semantics and on the H200 (tests/test_gpu_fa4.py,
`test_per_query_mask_over_a_static_cache[packed-left-padded]`, docs/benchmarks.md session 27). False keeps such masks
on the SDPA fallback with the mask."""


class MaskKind(NamedTuple):
    """What `_mask_kind` read off a mask (host values only: it is remembered past the call)."""

    name: str  # "hides nothing", "right padding", "left padding", "right padding, causal", "causal prefix, left
    # padding", "packed" or "kept"
    window_left: int = -1  # "causal prefix, left padding", "packed": the most keys a row sees before its own (-1: any)
    segments: Optional[tuple] = None  # "packed": the sequences' offsets in the [B * S] flattened tokens (and B * S),
    # the longest one's length, their used lengths (None: up to the next offset; `_packed_segments`)


_LAST_FORM: list = []  # [(weak key mask, its version, weak seqused_k, flags), its MaskKind]


def key_mask_form(q: Tensor, k: Tensor, seqused_k: Optional[Tensor], key_mask: Optional[Tensor], flags: dict
                  ) -> KeyMaskForm:
    """The key mask replaced by what FA4 takes when its contents allow: dropped when it hides no key in use
    (HF generate's all-ones mask); on a call with no band and no seqused_k, seqused_k = its sum when it is
    right padding with the first key visible (encoders); on a self-attention (Sq == Sk) without
    seqused_k, `padded` when every row is one run of visible keys that ends at the last key (left
    padding: generate's prompts) or, under a causal mask with no window, starts at the first key (right
    padding: fine-tuning batches), which FA4 runs as varlen segments over the padded buffer
    (`fa4.forward_padded`); a [B, Sq, Sk] mask, per query row, as `_per_query_mask_kind` reads it. It reads four
    booleans on the host (one sync), once per mask tensor
    (the layers of a forward and their backward share it), and only outside CUDA-graph capture;
    otherwise, or when none holds, the mask is kept. What it remembers of a mask holds no tensor alive:
    under CUDA-graph trees a tensor of the graph's memory pool kept past the graph is an error. Identity names
    contents only for a tensor nobody writes without a version bump: lowering hands every layer of a graph the one
    tensor `fa4::key_mask` allocated (kernels/key_mask.py)."""
    if key_mask is None or (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return KeyMaskForm(seqused_k, key_mask)
    read = None
    if _LAST_FORM:
        (mask, version, used, same_flags), remembered = _LAST_FORM
        if mask() is key_mask and version == _version(key_mask) and (used() if used else None) is seqused_k \
                and same_flags == flags:
            read = remembered
    if read is None:
        read = _mask_kind(q, k, seqused_k, key_mask, flags)
        _LAST_FORM[:] = [(weakref.ref(key_mask), _version(key_mask),
                          weakref.ref(seqused_k) if seqused_k is not None else None, dict(flags)), read]
    kind = read.name
    if kind == "hides nothing":
        return KeyMaskForm(seqused_k, None)
    if kind == "right padding":
        return KeyMaskForm(_lengths(key_mask), None)
    if kind == "left padding":
        return KeyMaskForm(None, None, ("left", key_mask.shape[1] - _lengths(key_mask)))
    if kind == "right padding, causal":
        return KeyMaskForm(None, None, ("right", _lengths(key_mask)))
    if kind == "causal prefix, left padding":
        sq = key_mask.shape[1]
        return KeyMaskForm(None, None, ("left", sq - _lengths(_diagonal(key_mask))), causal_keys=sq,
                           window_left=read.window_left)
    if kind == "packed":
        offsets, longest, used = read.segments
        offsets, used = (None if t is None else
                         torch.tensor(t, dtype=torch.int32).to(key_mask.device, non_blocking=True)
                         for t in (offsets, used))
        return KeyMaskForm(None, None, ("packed", (offsets, longest, used)), causal_keys=key_mask.shape[1],
                           window_left=read.window_left)
    return KeyMaskForm(seqused_k, key_mask)


def _lengths(key_mask: Tensor) -> Tensor:
    """[B] int32 visible keys per sequence."""
    return key_mask.sum(-1, dtype=torch.int32)


def _diagonal(key_mask: Tensor) -> Tensor:
    """[B, Sq] whether query row i of a [B, Sq, Sk] mask sees key i: in a left-padded causal prefix, the rows from
    the sequence's first token on."""
    return _visible(torch.diagonal(key_mask, dim1=1, dim2=2))


def _visible(key_mask: Tensor) -> Tensor:
    """The keys a boolean mask shows, or those an additive one adds 0 to (`_reads_mask_form` reads an additive mask
    only where its other values are finfo.min, which hides a key as False does)."""
    return key_mask == 0 if reference.is_additive(key_mask) else key_mask


def _mask_kind(q, k, seqused_k, key_mask, flags) -> MaskKind:
    """Which `key_mask_form` a mask has, read on the host."""
    return _per_query_mask_kind(seqused_k, key_mask, flags) if key_mask.dim() == 3 else \
        MaskKind(_padding_mask_kind(q, k, seqused_k, key_mask, flags))


def _padding_mask_kind(q, k, seqused_k, key_mask, flags) -> str:
    """`_mask_kind` of a [B, Sk] mask."""
    lengths = _lengths(key_mask)
    positions = torch.arange(key_mask.shape[1], device=key_mask.device)
    unused = positions >= seqused_k[:, None] if seqused_k is not None else torch.zeros_like(key_mask)
    right_padding = (key_mask == (positions < lengths[:, None])).all()
    left_padding = _is_left_padding(key_mask, lengths)
    hides_nothing, right_padding, left_padding, no_empty_row = torch.stack(
        [(key_mask | unused).all(), right_padding, left_padding, (lengths > 0).all()]).tolist()
    banded = Flags(**flags).banded
    # Without a band every query of a sequence sees its keys: none for an all-padding row, which FA4 is not given.
    left_padding = left_padding and (banded or no_empty_row)
    if hides_nothing:
        return "hides nothing"
    if right_padding and no_empty_row and seqused_k is None and not banded:
        return "right padding"
    if left_padding and seqused_k is None and q.shape[2] == k.shape[2]:
        return "left padding"
    causal_only = flags["causal"] and flags["window_left"] < 0 and flags["window_right"] < 0
    if RIGHT_PADDING_ON_FA4 and right_padding and no_empty_row and seqused_k is None and q.shape[2] == k.shape[2] \
            and causal_only:
        return "right padding, causal"
    return "kept"


def _is_left_padding(key_mask: Tensor, lengths: Tensor) -> Tensor:
    """0-d bool tensor: every row of the [B, S] mask shows exactly its last lengths[b] keys."""
    positions = torch.arange(key_mask.shape[1], device=key_mask.device)
    return (key_mask == (positions >= key_mask.shape[1] - lengths[:, None])).all()


def _per_query_mask_kind(seqused_k, key_mask, flags) -> MaskKind:
    """A [B, Sq, Sk] mask on a call with no band or seqused_k, read on the host (one sync; two for "packed"):

    - "causal prefix, left padding" when it hides every key from Sq on and its first Sq columns are a causal band,
      left-padded: query row i of a sequence whose tokens start at s sees keys max(s, i - window_left)..i
      (window_left + 1 is the most keys a row sees: a sliding-window layer's window where that is shorter than Sq;
      else -1), which FA4 runs as varlen segments;
    - "packed" when Sq == Sk and each row holds sequences back to back, each causal within itself (a sliding-window
      layer's: within its window, `window_left` as above), every query seeing a key but runs of rows that see none
      right before a sequence or a row's end (HF's mask for packed sequences from position_ids; Llama 4's chunked
      layers, left-padded or not): FA4 varlen, one segment a sequence (`MaskKind.segments`), a sequence starting at
      each row that sees only its own key; the rows that see no key lie in the gaps after the segments' used
      lengths, never computed (zeros, lse -inf, as the op's contract says);
    - else "kept". An additive mask is read so only when its every value is 0 (shows the key) or finfo.min (hides
      it)."""
    sq, sk = key_mask.shape[1:]
    if seqused_k is not None or Flags(**flags).banded or sq > sk:
        return MaskKind("kept")
    visible = _visible(key_mask)
    head = visible[:, :, :sq]
    rows = torch.arange(sq, device=key_mask.device)
    starts = sq - _lengths(torch.diagonal(head, dim1=1, dim2=2))
    window = head.sum(-1, dtype=torch.int32).amax()
    # [Sq, Sq] bool: no integer matrix of that size (2 GiB at 16k)
    windowed = (rows[None, :] <= rows[:, None]) & (rows[None, :] > rows[:, None] - window)
    shared = [~visible[:, :, sq:].any()]
    if reference.is_additive(key_mask):
        shared.append((visible | (key_mask == torch.finfo(key_mask.dtype).min)).all())
    checks = [(head == (windowed & (rows[None, None, :] >= starts[:, None, None]))).all()]
    if sq == sk:
        blind = ~head.any(-1)
        # rows whose first visible key is their own
        sequence_starts = (head.to(torch.uint8).argmax(-1) == rows) & ~blind
        first = torch.where(sequence_starts, rows, 0).cummax(-1).values  # each row's sequence's first token
        # a run of blind rows ends where a sequence starts, or at the row's end: it is a gap between segments
        runs_end = (~blind[:, :-1] | blind[:, 1:] | sequence_starts[:, 1:]).all()
        rows_ok = (head == (windowed & (rows[None, None, :] >= first[..., None]) & ~blind[..., None])).all()
        checks += [runs_end & rows_ok & sequence_starts.any(), blind.any()]
    shared_ok, prefix, *packed, window = torch.stack([torch.stack(shared).all(), *checks, window]).tolist()
    if shared_ok and prefix:
        return MaskKind("causal prefix, left padding", window - 1 if window < sq else -1)
    if shared_ok and packed and packed[0] and (PACKED_BLIND_ROWS_ON_FA4 or not packed[1]):
        segments = _packed_segments(sequence_starts, blind)
        return MaskKind("packed", window - 1 if window < segments[1] else -1, segments)
    return MaskKind("kept")


def _packed_segments(sequence_starts: Tensor, blind: Tensor) -> tuple:
    """`MaskKind.segments` of a packed mask ([B, S] its rows' sequence starts, and its rows that see no key): the
    offsets of the segments in the [B * S] flattened tokens, then B * S; the longest segment's length; the used
    lengths (None when no row is blind: each segment uses all up to the next offset). Each segment runs from its
    start to the next start or blind row."""
    total = sequence_starts.numel()
    starts = sequence_starts.flatten().nonzero().flatten()
    following = torch.cat([starts[1:], starts.new_tensor([total])])
    blind_rows = blind.flatten().nonzero().flatten()
    if blind_rows.numel():
        after = torch.searchsorted(blind_rows, starts)
        next_blind = torch.where(after < blind_rows.numel(), blind_rows[after.clamp(max=blind_rows.numel() - 1)],
                                 total)
        following = torch.minimum(following, next_blind)
    used = (following - starts).tolist()
    offsets = starts.tolist()
    if offsets[0] > 0:  # blind rows first: a segment of none of them
        offsets, used = [0, *offsets], [0, *used]
    return tuple(offsets + [total]), max(used), tuple(used) if blind_rows.numel() else None


def _version(t: Tensor) -> Optional[int]:
    """t's in-place update counter; None for an inference tensor, which has none (the op's key masks are
    fresh graph intermediates, so identity alone already tells them apart)."""
    return None if t.is_inference() else t._version


ABSORBING_DTYPES = (torch.bfloat16, torch.float32)
"""Dtypes whose finfo.min absorbs any score in float32 (its ulp there is ~1e31): a row of an additive mask that is
finfo.min on every key gets the same score for every key, a uniform softmax, as eager code's does. Not float16's
-65504, next to which eager's scores still count."""


def _reads_mask_form(q: Tensor, k: Tensor, key_mask: Tensor, flags: dict) -> bool:
    """Whether a key-mask call is worth `key_mask_form`'s host read: not for a small attention, which the
    SDPA fallback runs with the mask about as fast as FA4 would without it (`crossover.py`), while the read's
    sync would stall a host-bound graph (a small model's padded batch ran 0.55-0.63x default compile). A mask per
    query row is sized as the causal attention over Sq keys it may become. An additive mask is read only per query
    row (eager code's prefill mask) in `ABSORBING_DTYPES`, where FA4's answer can be made eager's
    (`_blind_rows_as_mean`)."""
    b, h, sq, d = q.shape
    if reference.is_additive(key_mask) and (key_mask.dim() != 3 or key_mask.dtype not in ABSORBING_DTYPES):
        return False
    if key_mask.dim() == 3:
        return not crossover.small(b, h, sq, sq, d, True)
    return not crossover.small(b, h, sq, k.shape[2], d, flags["causal"])


def _attention_cuda(q, k, v, seqused_k=None, key_mask=None, **flags):
    flags = device_flags(flags, k.shape[2])
    route = _route(q, k, v, seqused_k, key_mask, flags)
    # A mask FA4 may take after all:
    if key_mask is not None and route.name in ("sdpa", "reference") and _reads_mask_form(q, k, key_mask, flags):
        form = key_mask_form(q, k, seqused_k, key_mask, flags)
        if form.causal_keys is not None:
            prefix = [t[:, :, :form.causal_keys] for t in (k, v)]
            causal = {**flags, "causal": True, "window_left": form.window_left}
            if _route(q, *prefix, None, None, causal) is routes.FA4:
                log.debug("fa4::attention q%s: a mask per query row read as a causal prefix of %d keys, left-padded, "
                          "window %d: FA4 varlen", tuple(q.shape), form.causal_keys, form.window_left)
                out, lse = fa4.forward_padded(q, *prefix, *form.padded, **causal)
                if reference.is_additive(key_mask):
                    _blind_rows_as_mean(out, lse, v, key_mask.dtype)
                return out, lse
        elif form.key_mask is None:
            without_mask = _route(q, k, v, form.seqused_k, None, flags)
            if form.padded is None:
                seqused_k, key_mask, route = form.seqused_k, None, without_mask
            elif without_mask is routes.FA4:
                return fa4.forward_padded(q, k, v, *form.padded, **flags)
    return route.adapter.forward(q, k, v, seqused_k, key_mask, **flags)


def _blind_rows_as_mean(out: Tensor, lse: Tensor, v: Tensor, mask_dtype: torch.dtype) -> None:
    """In place: the rows FA4 found to see no key (zeros, lse -inf) as an additive mask of 0 and finfo.min has them.
    Every score of such a row is finfo.min (`ABSORBING_DTYPES`), so its softmax is uniform over all Sk keys: out the
    mean of V (`blind_rows_as_mean`), lse finfo.min (log Sk is below its float32 ulp)."""
    blind_rows_as_mean(out, lse, v, in_place=True)
    lse.masked_fill_(lse == float("-inf"), torch.finfo(mask_dtype).min)


def blind_rows_as_mean(out: Tensor, lse: Tensor, v: Tensor, in_place: bool = False) -> Tensor:
    """out [B, Hq, Sq, Dv] with every query row that saw no key (lse -inf) the mean of V [B, Hkv, Sk, Dv] over all
    keys: what eager's softmax gives a row whose every score is the same finfo.min. Written into out with
    `in_place` (the op's own output, whose layout it keeps); lowering puts the out-of-place call in the graph, after
    the op, for masks the graph itself builds."""
    blind = (lse == float("-inf"))[..., None]
    return torch.where(blind, _per_query_head(_mean_over_keys(v), out.shape[1]).to(out.dtype), out,
                       **({"out": out} if in_place else {}))


def nan_where_no_key(mask: Tensor) -> Tensor:
    """A [..., Sq or 1, 1] factor in an additive mask's dtype ([..., Sq or 1, Sk]): NaN for each query row the mask
    hides every key of (-inf throughout), 1 elsewhere. An attention output times it is what eager's softmax gives,
    0 / 0 on such a row, where the op and SDPA give zeros; a product, so such a row's gradient is NaN as in eager."""
    hidden = (mask == float("-inf")).all(-1, keepdim=True)
    return torch.where(hidden, float("nan"), 1.0).to(mask.dtype)


def blind_rows_as_eagers(out: Tensor, lse: Tensor, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """`blind_rows_as_mean` with eager's gradient, for training. Such a row's scores are all finfo.min, absorbing
    q . k, so its softmax is uniform, yet autograd still passes its derivative to q and k: d out_i / d s_ij =
    (v_j - mean V) / Sk. That is the derivative of scale (V - mean V)^T K q_i / Sk with V held constant, which is
    added as term - term.detach() (0 in value): out_i stays the mean of V, d/dV comes through the mean only, as
    eager's P^T dO, and d/dq, d/dk are eager's. The [Dv, D] product per KV head costs O(Sk D^2), far below the
    attention's O(Sq Sk D)."""
    blind = (lse == float("-inf"))[..., None]
    mean = _mean_over_keys(v)
    centered = (v.detach() - mean.detach().to(v.dtype)).to(k.dtype)
    # einsum, not @: torch 2.11's fake matmul of 4-D tensors specializes their symbolic sizes
    slope = _per_query_head(torch.einsum("bhkv,bhkd->bhvd", centered, k) / k.shape[2], q.shape[1])  # [B, Hq, Dv, D]
    term = scale * torch.einsum("bhqd,bhvd->bhqv", q, slope.to(q.dtype))
    mean = _per_query_head(mean, q.shape[1])
    return torch.where(blind, mean.to(out.dtype) + (term - term.detach()).to(out.dtype), out)


def blind_rows_gradients(grad_out: Tensor, grad_lse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, blind: Tensor,
                         scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) that eager's softmax passes through the query rows `blind` [B, Sq] of an additive finfo.min mask
    (rows that see no key: every score absorbed, a uniform softmax, out the mean of V, lse finfo.min + log Sk), which
    FA4's backward leaves out: d out_i / d v_j = 1 / Sk, d out_i / d s_ij = (v_j - mean V) / Sk
    (`blind_rows_as_eagers`) and d lse_i / d s_ij = 1 / Sk, with s_ij = scale q_i . k_j."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        rows = blind[:, None, :].expand(q.shape[:3])
        marker = torch.zeros(rows.shape, device=q.device).masked_fill(rows, float("-inf"))
        out = blind_rows_as_eagers(torch.zeros_like(grad_out), marker, *leaves, scale)
        total = (out.float() * grad_out.float()).sum()
        if grad_lse is not None:
            mean_k = _per_query_head(_mean_over_keys(leaves[1]), q.shape[1])  # [B, Hq, 1, D]
            lse = scale * (leaves[0].float() * mean_k).sum(-1)
            total = total + (lse * grad_lse.float()).masked_fill(~rows, 0).sum()
        return torch.autograd.grad(total, leaves)


def _mean_over_keys(t: Tensor) -> Tensor:
    """[B, Hkv, 1, D]: K's or V's mean over its keys, in float32 at least."""
    return t.mean(2, keepdim=True, dtype=torch.promote_types(t.dtype, torch.float32))


def _per_query_head(t: Tensor, heads: int) -> Tensor:
    """A [B, Hkv, ...] tensor per KV head repeated for each of the `heads` query heads (GQA)."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], 1)


def _attention_fake(q, k, v, seqused_k=None, key_mask=None, **flags):
    _check_inputs(q, k, v, seqused_k, key_mask, flags)
    return _forward_outputs(q, v)


def _backward_outputs(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(_empty_bshd(*t.shape[:2], t.shape[2], t.shape[3], t) for t in (q, k, v))


def attention_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_lse: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    key_mask: Optional[Tensor] = None,
    **flags,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of `fa4::attention` with respect to q, k, v (same shapes, [B, S, H, D] storage).

    `grad_lse` is the gradient flowing into the forward's lse output (None when lse is unused)."""
    _check_inputs(q, k, v, seqused_k, key_mask)
    return reference.backward(grad_out, q, k, v, out, lse, grad_lse, seqused_k, key_mask, **_complete(flags))


def _attention_backward_cuda(grad_out, q, k, v, out, lse, grad_lse=None, seqused_k=None, key_mask=None, **flags):
    _check_inputs(q, k, v, seqused_k, key_mask)
    flags = _complete(flags)
    reads = key_mask is not None and _reads_mask_form(q, k, key_mask, flags)
    form = key_mask_form(q, k, seqused_k, key_mask, flags) if reads else KeyMaskForm(seqused_k, key_mask)
    padded_flags = flags
    if form.causal_keys is not None:
        # A mask per query row: FA4's backward when its causal prefix is every key (HF's training mask); over a
        # shorter prefix the gradients of the keys past it would be missing, and the mask stays.
        padded_flags = {**flags, "causal": True, "window_left": form.window_left}
        form = form if form.causal_keys == k.shape[2] else KeyMaskForm(seqused_k, key_mask)
    if form.padded is not None and _backward_route(q, k, v, None, None, padded_flags) is routes.FA4:
        grads = fa4.backward_padded(grad_out, q, k, v, out, lse, grad_lse, *form.padded, **padded_flags)
        if reference.is_additive(key_mask) and fa4.padded_blind_rows(*form.padded, **padded_flags):
            # FA4 passes nothing through rows that see no key; eager's softmax does
            blind = ~_visible(key_mask).any(-1)
            grads = [g + b for g, b in zip(grads, blind_rows_gradients(grad_out, grad_lse, q, k, v, blind,
                                                                        flags["scale"]))]
        return tuple(grads)
    if form.padded is None:
        seqused_k, key_mask = form.seqused_k, form.key_mask
    route = _backward_route(q, k, v, seqused_k, key_mask, flags)
    return route.adapter.backward(grad_out, q, k, v, out, lse, grad_lse, seqused_k, key_mask, **flags)


def _backward_route(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor], key_mask: Optional[Tensor],
                    flags: dict) -> routes.Route:
    if q.device.type != "cuda":
        return routes.REFERENCE
    return routes.choose(routes.BACKWARD, q, k, v, seqused_k, key_mask, flags)[0]


def _attention_backward_fake(grad_out, q, k, v, out, lse, grad_lse=None, seqused_k=None, key_mask=None, **flags):
    _check_inputs(q, k, v, seqused_k, key_mask)
    return _backward_outputs(q, k, v)


def _setup_context(ctx, inputs, keyword_only_inputs, output):
    q, k, v, seqused_k, key_mask = inputs
    out, lse = output
    ctx.flags = dict(keyword_only_inputs)
    ctx.save_for_backward(q, k, v, out, lse, seqused_k, key_mask)
    # An output without a gradient comes as None, not as zeros: autograd's zeros for an unused lse would be a
    # plain tensor next to DTensors, and would send the backward down the slower grad_lse paths.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, seqused_k, key_mask = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.fa4.attention_backward(
        grad_out, q, k, v, out, lse, grad_lse, seqused_k, key_mask, **ctx.flags)
    return dq, dk, dv, None, None


library.impl("attention", attention, "CompositeExplicitAutograd")
library.impl("attention", _attention_cuda, "CUDA")
library.impl("attention_forward", attention, "CompositeExplicitAutograd")
library.impl("attention_forward", _attention_cuda, "CUDA")
library.impl("attention_backward", attention_backward, "CompositeExplicitAutograd")
library.impl("attention_backward", _attention_backward_cuda, "CUDA")
library.register_fake("attention", _attention_fake)
library.register_fake("attention_forward", _attention_fake)
library.register_fake("attention_backward", _attention_backward_fake)
library.register_autograd("attention", _backward, setup_context=_setup_context)
