"""What every attention family shares: the matched call (`AttentionCall`), the checks between a match and
its rewrite, and the emission of `fa4::attention` on the Dynamo (torch-IR) graph.

Rewriting before AOTAutograd keeps training correct: the op's registered autograd puts
`fa4::attention_backward` into the backward graph. The families (`sdpa_calls.py`, `handwritten_attention.py`)
match their subgraph into an `AttentionCall`; `rewrite` takes it from there.

K/V feeding either family may be repeated for GQA (`gqa.py`); the repetition is folded. K/V dequantized from
an int8 cache (`int8_kv.py`) are read as int8 by `fa4::attention_int8kv` instead. A mask that
depends on run-time data becomes an op input built once per graph and shared by every layer: a KV
cache position becomes seqused_k (`kv_cache.py`), a padding mask the op's key_mask (`padding.py`,
which also has the checked seqused_k forms).

A hand-written attention with active dropout becomes SDPA with that dropout (`_dropout_rewrite`): the op has none.
A candidate is kept as written, with the reason recorded, when: dropout is active past what SDPA takes, a mask is not a
provable band (masks.py), an intermediate is used elsewhere (e.g. `output_attentions`), a scale is not a
constant, dtypes differ, the device's kernel cannot take the dtype or head dim (`kernels.attention_support`),
or an input is updated in place where the rewrite would read it after the update (mutations.py).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ..kernels import (ATTENTION, ATTENTION_INT8KV, attention_int8kv_unsupported_reason, attention_unsupported_reason,
                       blind_rows_as_eagers, blind_rows_as_mean, nan_where_no_key)
from ..kernels.decode import MAX_Q_LEN as DECODE_MAX_Q_LEN
from ..kernels.key_mask import REBASED_ROW_MAX
from . import crossover, gqa, int8_kv, kv_cache, padding
from .family import Context
from .graph_edit import NodeMaker, after_definition, erase_dead
from .mutations import Mutations, layout_free, storage
from .masks import (INF, MaskNotUnderstood, Band, KeyMask, Shift, ValuesUnknown, band_args, broadcasts_last_two_dims,
                    keep_band)
from .records import Decline
from .spellings import equal_size, is_large_negative, number, same_size, shape, value



@dataclass
class AttentionCall:
    """A matched attention: the op's inputs and flags, the node it replaces and the nodes it makes dead."""

    q: Node
    k: Node
    v: Node
    output: Node
    scale: float
    flags: dict = field(default_factory=dict)
    matched: list = field(default_factory=list)
    gqa: str = ""
    masks: list = field(default_factory=list)  # (mask, the node applying it): their in-place updates are checked
    seqused_k: Node | Shift | None = None  # a run-time key mask (padding.py) or query start (kv_cache.py)
    padding: KeyMask | None = None  # a run-time key mask (an attention_mask) on top of the band
    blind_rows: str = "zeros"  # what eager gives a query row that sees no key: "zeros", "mean" (of V), "filled mean"
    # (the mean of V from scores a masked_fill / where overwrote: no gradient reaches q and k) or "nan"
    # How `padding` reaches the op (`_encode_padding`): its key_mask, or checked fast paths (padding.py).
    key_mask: KeyMask | None = None
    covering_mask: KeyMask | None = None  # must hide none of the band's keys (checked at run time)
    autocast: torch.dtype | None = None  # q, k, v cast to this dtype first (`check_kernel_support`)
    int8: tuple | None = None  # (K's, V's) int8_kv.Int8Source: the op reads the int8 cache (fa4::attention_int8kv)
    int8_note: str = ""  # why K/V dequantized from int8 were not folded
    # The one mask, added to the scores, is a floating-point graph input (`AdditiveInput`): SDPA takes it as it is.
    additive_input: Node | None = None
    additive_reason: str = ""  # why the op cannot take that mask (values unknown when compiling)
    softmax_rounds: bool = False
    """The masked scores are cast on their way into the softmax (a cast, or softmax's `dtype=`): the program in float64
    rounds the masked sum there too, so an additive mask input is added as written, not rebased (`KeyMask.rebased`)."""
    sink: Node | None = None  # an attention sink's logits: [..., Sq, 1] (GPT-OSS) or as lse broadcasts (Granite SWA)
    dropout_p: float = 0.0  # the attention weights' dropout in training (a hand-written one): `_dropout_rewrite`

    @property
    def rebases_mask_input(self) -> bool:
        """Whether the additive mask input is rebased before the op or SDPA adds it (`kernels.rebased_additive_mask`):
        not under a sink, whose logit the op's lse meets, nor where `softmax_rounds`."""
        return self.additive_input is not None and self.sink is None and not self.softmax_rounds

    @property
    def in_training(self) -> bool:
        """q, k or v requires a gradient: the graph is a training step's."""
        return any(value(t).requires_grad for t in (self.q, self.k, self.v))


class AdditiveInput(Decline):
    """`scores + mask` where the mask's values are known at run time only: a graph input's (`masks.ValuesUnknown`:
    HF's eager-code mask built outside the forward, static-cache generate, Gemma-2's hybrid cache) or, with
    `run_time_masks`, one the graph builds in a way the proofs do not read (`mask_flags`)."""

    def __init__(self, message: str, mask: Node, scores: Node | None = None):
        super().__init__(message)
        self.mask, self.scores = mask, scores  # scores: set by the matcher that knows which operand they are


def check_kernel_support(q: Node, k: Node, v: Node, output: Node) -> torch.dtype | None:
    """Declines what the kernels cannot take; returns the dtype q, k, v are to be cast to, or None: under autocast
    (`autocast_dtype`) the attention's matmuls run in autocast's dtype whatever q, k, v's own dtypes (HF's RoPE
    hands float32 q, k next to a bfloat16 v), so the op gets them cast to it, as autocast casts them for SDPA."""
    qv, kv, vv = value(q), value(k), value(v)
    dtype, cast, out = qv.dtype, None, value(output).dtype
    if not (qv.dtype == kv.dtype == vv.dtype == out):
        cast = autocast_dtype(output)
        if cast is None or out != cast or not all(t.dtype.is_floating_point for t in (qv, kv, vv)):
            reason = (f"the output dtype {out} is not q's {qv.dtype}" if qv.dtype == kv.dtype == vv.dtype
                      else f"q, k, v dtypes differ ({qv.dtype}, {kv.dtype}, {vv.dtype})")
            raise Decline(reason if cast is None else f"{reason}, under autocast to {cast}")
        dtype = cast
    if qv.device != kv.device or qv.device != vv.device:
        raise Decline("q, k, v are on different devices")
    if qv.dim() not in (3, 4) or kv.dim() != qv.dim() or vv.dim() != qv.dim():
        raise Decline(f"q, k, v have {qv.dim()}, {kv.dim()}, {vv.dim()} dims (want 4, or 3 for bmm)")
    # Kernels are compiled per head dim: a symbolic one is specialized (guarded), as no model varies it.
    reason = attention_unsupported_reason(qv.device.type, dtype, int(qv.shape[-1]), int(vv.shape[-1]))
    if reason:
        raise Decline(reason)
    _check_no_broadcast(shape(q), shape(k), shape(v))
    return cast


def autocast_dtype(node: Node) -> torch.dtype | None:
    """The dtype autocast runs `node` in, or None where autocast is off for its device: the innermost
    `torch.autocast` region of the graph around it (Dynamo writes `_enter_autocast` / `_exit_autocast`), else the
    state the graph was compiled under (Dynamo guards on it, so the graph runs under the same)."""
    device = value(node).device.type
    regions = []
    for n in node.graph.nodes:
        if n is node:
            break
        if n.target is torch.amp.autocast_mode._enter_autocast:
            regions.append(n)
        elif n.target is torch.amp.autocast_mode._exit_autocast and n.args and n.args[0] in regions:
            regions.remove(n.args[0])
    for region in reversed(regions):
        device_type, dtype, enabled = (list(region.args) + [None, None, True])[:3]
        if device_type == device:
            return (dtype or torch.get_autocast_dtype(device)) if enabled else None
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def _check_no_broadcast(q, k, v) -> None:
    """Eager broadcasts q @ k^T and SDPA over batch and head dims; the op takes q [B, Hq, Sq, D] with k, v
    [B, Hkv, Sk, D] and Hq a multiple of Hkv (one K/V head for a group of query heads) only."""
    if not (equal_size(q[0], k[0]) and equal_size(q[0], v[0])):
        raise Decline(f"q, k, v leading sizes {q[0]}, {k[0]}, {v[0]} differ (eager broadcasts them)")
    if not equal_size(k[-2], v[-2]):
        raise Decline(f"k and v have {k[-2]} and {v[-2]} keys")
    if len(q) == 4:
        hq, hk, hv = q[1], k[1], v[1]
        if not equal_size(hk, hv) or not (equal_size(hq, hk) or guard_or_false(hq % hk == 0)):
            raise Decline(f"{hq} query heads against {hk} key and {hv} value heads (not a multiple: eager broadcasts)")


def _check_output_shape(call: "AttentionCall") -> None:
    """The op's output [B, Hq, Sq, Dv] is what the matched subgraph returned (a mask can broadcast it larger)."""
    expected = shape(call.q)[:-1] + shape(call.v)[-1:]
    actual = shape(call.output)
    if len(actual) != len(expected) or not all(equal_size(a, b) for a, b in zip(actual, expected)):
        raise Decline(f"the attention's output has shape {list(actual)}, not q's {list(expected)} "
                      "(a mask or operand broadcasts it)")


def _fold_gqa(call: AttentionCall, enabled: bool) -> None:
    """Let attention read K/V un-repeated when both are repeated the same way."""
    if not enabled:
        return
    uk, uv = gqa.unrepeat(call.k), gqa.unrepeat(call.v)
    if uk.spelling and uv.spelling and same_size(shape(uk.source)[1], shape(uv.source)[1]):
        call.matched += [call.k, call.v]
        call.k, call.v = uk.source, uv.source
        spelling = uk.spelling if uk.spelling == uv.spelling else f"{uk.spelling}/{uv.spelling}"
        call.gqa = f"{spelling} folded, group {uk.group}"


def _fold_int8(call: AttentionCall, options) -> None:
    """Let attention read K/V dequantized from an int8 cache as int8 with their scales (int8_kv.py); where that
    cannot be, K/V stay dequantized (`fa4::attention`) and the record says why."""
    if not getattr(options, "int8_kv", True):
        return
    try:
        sources = int8_kv.fold(call.k, call.v)
        if sources is None:
            return
        q = value(call.q)
        if len(shape(call.q)) != 4:
            raise int8_kv.NotInt8("3-D (bmm) attention")
        if call.autocast is not None:
            raise int8_kv.NotInt8("under autocast")
        if call.in_training:
            raise int8_kv.NotInt8("q, k or v requires a gradient, and the int8-KV op is forward only")
        if call.key_mask is not None and call.blind_rows in MEAN_ROWS:
            raise int8_kv.NotInt8("a padding mask whose all-hidden rows eager fills with the mean of V")
        reason = attention_int8kv_unsupported_reason(q.device.type, q.dtype, int(q.shape[-1]),
                                                     int(value(call.v).shape[-1]))
        if reason:
            raise int8_kv.NotInt8(reason)
    except int8_kv.NotInt8 as e:
        call.int8_note = f"int8 K/V kept dequantized: {e}"
        return
    call.matched += [*sources[0].nodes, *sources[1].nodes]
    call.k, call.v = sources[0].data, sources[1].data
    call.int8 = sources


def require_square(scores_shape, what: str) -> None:
    if not equal_size(scores_shape[-2], scores_shape[-1]):
        raise Decline(f"{what} needs seqlen_q == seqlen_k ({scores_shape[-2]} vs {scores_shape[-1]}): SDPA and "
                      "hand-written masks align top-left, FA4 bottom-right")


def mask_flags(kind: str, mask, constants, scores_shape, fill=None, run_time_masks: bool = False,
               unproven: bool = False) -> tuple[Band, float | None]:
    """The visible keys of one masking step and the score its hidden keys get (see `keep_band`). With
    `run_time_masks`, a boolean SDPA mask it cannot prove is the op's key mask per query row (`run_time_mask`), and
    an additive one [B or 1, 1, S, S] or [B or 1, 1, 1, Sk] added to hand-written scores (eager code's mask for
    packed sequences or Llama 4's chunks, and for a decode step over a cache) is taken as one whose values are known
    at run time only (`AdditiveInput`), as a float mask input is. `unproven`: the mask is taken that way without a
    proof being tried (`rewrite_or_retry`)."""
    try:
        if unproven:
            raise MaskNotUnderstood("query positions held in a tensor over keys that are not a KV cache written in "
                                    "this graph, read at run time")
        band, hidden = keep_band(kind, mask, constants, fill)
    except MaskNotUnderstood as e:
        if kind == "additive" and isinstance(mask, Node) and (
                isinstance(e, ValuesUnknown) or run_time_masks and (
                    _self_attention_rows(mask, scores_shape) or mask_rows(shape(mask), scores_shape) == "one row")):
            _check_broadcast(shape(mask), scores_shape)
            raise AdditiveInput(f"mask not recognized: {e}", mask) from None
        if run_time_masks and (keys := run_time_mask(kind, mask, scores_shape)) is not None:
            return Band(keys=keys), None
        if kind == "additive" and (table := _embedding_lookup(mask)) is not None:
            raise Decline(f"a learned position bias ({table.name}, an embedding lookup) is added to the scores: the op "
                          "takes no bias") from None
        raise Decline(f"mask not recognized: {e}") from None
    if not isinstance(mask, Node):
        return band, hidden
    mshape = shape(mask)
    _check_broadcast(mshape, scores_shape)
    if band != Band():
        same = len(mshape) >= 2 and all(same_size(a, b) for a, b in zip(mshape[-2:], scores_shape[-2:]))
        # A mask the same for every query (a key-padding mask) may be broadcast over the query rows.
        if not same and (band.bounded or not broadcasts_last_two_dims(mshape, scores_shape)):
            raise Decline(f"mask not recognized: its last dims {mshape[-2:]} are not the scores' {scores_shape[-2:]}")
    return band, hidden


def _embedding_lookup(mask, depth: int = 8) -> Node | None:
    """The embedding lookup an additive mask is computed from within `depth` steps (T5's and MPNet's relative
    position bias, a learned table indexed by position buckets), None where there is none."""
    frontier, seen = [mask] if isinstance(mask, Node) else [], set()
    for _ in range(depth):
        found = next((n for n in frontier if n.target is torch.nn.functional.embedding), None)
        if found is not None:
            return found
        seen.update(frontier)
        frontier = [a for n in frontier for a in n.all_input_nodes if a not in seen]
    return None


def run_time_mask(kind: str, mask, scores_shape) -> KeyMask | None:
    """A boolean SDPA mask the graph computes but the proofs do not read, as the op's key mask (exact for any
    contents): [B or 1, 1, 1, Sk], one row for every query, over a decode step's few queries (the decode kernel reads
    it) or a self-attention, or [B or 1, 1, S, S] on a self-attention's scores, a key mask per query row (the op reads
    it on the host, FA4 where it has a form FA4 takes, such as HF's packed sequences from position_ids or Llama 4's
    chunks, else the SDPA fallback with it); None for any other mask. Other queries over a KV cache are not taken:
    there the op would run the SDPA fallback, which repeats the cache's K/V for GQA."""
    if kind != "bool" or not isinstance(mask, Node):
        return None
    sq = scores_shape[2] if len(scores_shape) == 4 else None
    few = isinstance(sq, int) and sq <= DECODE_MAX_Q_LEN
    if mask_rows(shape(mask), scores_shape) == "one row" and (few or same_size(sq, scores_shape[3])):
        return KeyMask(mask, plane=True)
    if not _self_attention_rows(mask, scores_shape):
        return None
    return KeyMask(mask, plane=True, per_query=True)


def _self_attention_rows(mask: Node, scores_shape) -> bool:
    """Whether `mask` is [B or 1, 1, S, S] on a self-attention's scores [B, H, S, S] (`run_time_mask`)."""
    return len(scores_shape) == 4 and same_size(scores_shape[2], scores_shape[3]) \
        and mask_rows(shape(mask), scores_shape) == "per query"


def mask_rows(mshape, scores_shape) -> str | None:
    """How a mask of shape `mshape` covers scores [B, H, Sq, Sk]: "per query" for [B or 1, 1, Sq, Sk] (Sq not 1),
    "one row" for [B or 1, 1, 1, Sk]; None for any other shape. Symbolic sizes are compared under guards."""
    if len(mshape) != 4 or len(scores_shape) != 4 or not same_size(mshape[1], 1):
        return None
    if not (same_size(mshape[0], 1) or equal_size(mshape[0], scores_shape[0])) \
            or not equal_size(mshape[3], scores_shape[3]):
        return None
    if same_size(mshape[2], 1):
        return "one row"
    return "per query" if equal_size(mshape[2], scores_shape[2]) else None


def _check_broadcast(mshape, scores_shape) -> None:
    if len(mshape) > len(scores_shape) or not all(
            same_size(m, 1) or equal_size(m, s) for m, s in zip(mshape[::-1], scores_shape[::-1])):
        raise Decline(f"the mask's shape {list(mshape)} broadcasts the scores' {list(scores_shape)} larger")


MEAN_ROWS = ("mean", "filled mean")  # `AttentionCall.blind_rows` whose rows that see no key are the mean of V


def keeps_scores(added: float | None) -> bool:
    """Whether a finite value added to hidden keys' scores (an additive mask's -1e9 or -1e4) leaves the scores' digits
    in float64: a row that sees no key is then the softmax of its scores over every key, which the op does not give
    (`blind_rows_of`'s "nan"). finfo.min and values below `REBASED_ROW_MAX` absorb them (a uniform row)."""
    return added is not None and math.isfinite(added) and not is_large_negative(added) and \
        added > REBASED_ROW_MAX[0]


def blind_rows_of(hidden_scores: list, sdpa: bool, softmax_dtype: torch.dtype | None = None) -> str:
    """What eager gives a row whose keys are all hidden: SDPA returns zeros for a boolean or -inf mask
    (its safe softmax); a finite finfo.min score on every key of the row, from one masking step, makes
    the softmax uniform (the mean of V over all keys); -inf in a plain softmax, several steps mixing
    the two, or a value added that keeps the scores (`keeps_scores`) give NaN or weights by the scores
    ("nan": not reproduced; the callers, which know which steps add, check `keeps_scores`)."""
    hidden = [h for h in hidden_scores if h is not None]
    if softmax_dtype is not None:  # float64's finfo.min in a float32 softmax is -inf there
        hidden = [h if abs(h) <= torch.finfo(softmax_dtype).max else -math.inf for h in hidden]
    if not hidden:
        return "zeros" if sdpa else "nan"
    if len(hidden) == 1:
        if math.isfinite(hidden[0]):
            return "mean"
        return "zeros" if sdpa else "nan"
    return "nan"


def flags_for(band: Band, scores_shape) -> tuple[dict, Shift | None, KeyMask | None]:
    """The op's flags for the visible keys `band`, the run-time query start its seqused_k comes from
    (a KV cache), and the run-time key mask on top of the band (a padding mask)."""
    if not band.bounded:
        return {}, None, band.keys
    flags, shift = _band_flags(band, scores_shape)
    return flags, shift, band.keys


def _checked_band_args(band: Band) -> dict:
    try:
        return band_args(band)
    except MaskNotUnderstood as e:
        raise Decline(f"mask not recognized: {e}") from None


def _band_flags(band: Band, scores_shape) -> tuple[dict, Shift | None]:
    if band.shift is None and equal_size(scores_shape[-2], scores_shape[-1]):
        return _checked_band_args(band), None
    # Queries over a longer cache, or at run-time positions: the band's upper bound j - i <= top (+ start)
    # is the last key in use, seqused_k = start + Sq + top, and bottom-right alignment puts it on the diagonal.
    if band.hi == INF:
        raise Decline("a band with no upper bound over a KV cache (or at run-time positions): keys past the last "
                      "position are visible, which seqused_k cannot express")
    shift = dataclasses.replace(band.shift or Shift(None), top=int(band.hi))
    # Symbolic sizes and positions: guarded (a longer prompt recompiles, and that graph declines). Positions
    # held in tensors are checked at run time (kv_cache.seqused_k).
    start, key_start = (0 if n is None else value(n) for n in (shift.node, shift.minus))
    if not any(isinstance(p, torch.Tensor) for p in (start, key_start)):
        used = start - key_start + scores_shape[-2] + shift.top
        if not (guard_or_false(used >= scores_shape[-2]) and guard_or_false(used <= scores_shape[-1])):
            raise Decline(f"a band with j - i <= {shift.top} (at the query positions given) over {scores_shape[-1]} "
                          f"keys for {scores_shape[-2]} queries leaves a query without keys or reaches past the last key")
    return _checked_band_args(Band(band.lo - band.hi, 0)), shift


def constant(x) -> float | None:
    """A number argument as a float, or a 0-d tensor made from one (`number`); a symbolic one (a float module
    attribute under `dynamic=True`) is specialized to its value, which guards on it."""
    if isinstance(x, Node) and isinstance(v := value(x), (torch.SymFloat, torch.SymInt)):
        return float(v)
    return number(x)


def positive_scale(c: float) -> float:
    """The kernels subtract each row's largest score before exponentiating, which needs a positive scale."""
    if not (c > 0 and math.isfinite(c)):
        raise Decline(f"the scale factor {c} is not positive and finite")
    return c


def _seqused_k(graph, make: NodeMaker, call: AttentionCall, shared: dict, q: Node, k: Node) -> Node | None:
    """The op's seqused_k input (for the op's 4-D q and k), built once per graph for each mask or cache
    position it comes from and each query / key length.

    What reads run-time data (the key mask, the cache offset) is placed right after that data is
    defined, as the model's own mask is, before any in-place update of it."""
    source = call.seqused_k
    if source is None:
        return None
    key = (source, str(shape(q)[2]), str(shape(k)[2])) if isinstance(source, Shift) else source
    if key not in shared:
        if isinstance(source, Shift):
            starts = []
            for node, vector in ((source.node, source.vector), (source.minus, False)):
                if node is None:
                    starts.append(None)
                    continue
                with graph.inserting_before(after_definition(node)):
                    starts.append(kv_cache.snapshot(make, node, vector))
            shared[key] = kv_cache.seqused_k(make, *starts, source.top, q, k)
        else:
            with graph.inserting_before(after_definition(source)):
                shared[key] = padding.seqused_k(make, source)
    return shared[key]


def emit(gm: GraphModule, call: AttentionCall, fake_mode, shared: dict, mutations: Mutations) -> str:
    """Insert `fa4::attention` for `call`, reroute the output's users, drop what became dead; returns the call text.

    `shared`: nodes computed once per graph (seqused_k, key masks, run-time checks), reused by every
    attention that needs them."""
    graph = gm.graph
    three_d = len(shape(call.q)) == 3
    kwargs = {"scale": call.scale, **call.flags}
    make = NodeMaker(graph, call.output, fake_mode)
    with graph.inserting_before(call.output):
        q, k, v = call.q, call.k, call.v
        scales = [source.scale for source in call.int8] if call.int8 is not None else []
        if call.int8 is not None and call.int8[0].keys is not None:  # the int8 cache sliced as its dequantization was
            k, v = (make(operator.getitem, t, source.index(4), name=name)
                    for t, source, name in zip((k, v), call.int8, ("int8_keys", "int8_values")))
            scales = [make(operator.getitem, t, source.index(3), name=name)
                      for t, source, name in zip(scales, call.int8, ("key_scales", "value_scales"))]
        if call.autocast is not None:
            q, k, v = (t if value(t).dtype == call.autocast else make("to", t, call.autocast, name=f"{name}_autocast")
                       for t, name in ((q, "q"), (k, "k"), (v, "v")))
        if three_d:
            q, k, v = (make("unsqueeze", t, 0) for t in (q, k, v))
        seqused_k = _seqused_k(graph, make, call, shared, q, k)
        if call.covering_mask is not None and (call.covering_mask, seqused_k) not in shared:
            shared[call.covering_mask, seqused_k] = padding.check_hides_none(make, call.covering_mask, seqused_k)
        inputs = [q, k, v]
        inputs += scales
        if call.key_mask is not None:
            where = (call.key_mask, str(shape(k)[-2]))  # one [B, Sk] key mask per padding mask and key length
            if where not in shared:
                shared[where] = padding.key_mask(make, call.key_mask, k)
            inputs += [seqused_k, shared[where]]
        elif seqused_k is not None:
            inputs.append(seqused_k)
        if call.int8 is not None:
            op = make(ATTENTION_INT8KV, *inputs, name="fa4_attention_int8kv", **kwargs)
        else:
            op = make(ATTENTION, *inputs, name="fa4_attention", **kwargs)
        out = make(operator.getitem, op, 0, name="attention_out")
        if call.key_mask is not None and call.blind_rows in MEAN_ROWS:
            lse = make(operator.getitem, op, 1)
            if call.in_training and call.blind_rows == "mean":
                out = make(blind_rows_as_eagers, out, lse, q, k, v, call.scale, name="attention_out_blind_rows")
            else:
                out = make(blind_rows_as_mean, out, lse, v, name="attention_out_blind_rows")
        if call.sink is not None:
            out = _with_sink(make, op, out, call.sink)
        if three_d:
            out = make("squeeze", out, 0)
        out = _rows_eager_makes_nan(make, call, out, shared)
    _replace_output(graph, call, out, make, mutations, copy=three_d)
    return _describe_call(call, kwargs)


def _with_sink(make: NodeMaker, op: Node, out: Node, column: Node) -> Node:
    """The op's out under an attention sink: a softmax over a row's scores and one more logit c, whose column is
    dropped, weighs V by exp(s_j) / (sum_i exp(s_i) + exp(c)) = softmax(s)_j * sigmoid(lse - c). Rows that see no key
    (lse -inf, or finfo.min for an additive mask) get 0, as the sink takes all of eager's weight there; the gradient
    reaches the sink, q and k through lse."""
    lse = make(operator.getitem, op, 1, name="attention_lse")
    sink = make("float", column, name="sink_logits")
    if len(shape(column)) == len(shape(out)):  # [..., Sq, 1] (GPT-OSS's column); else lse's shape broadcasts with it
        sink = make("squeeze", sink, -1)
    weight = make(torch.sigmoid, make(operator.sub, lse, sink), name="sink_weight")
    scaled = make(operator.mul, out, make("unsqueeze", weight, -1))
    return make("to", scaled, value(out).dtype, name="attention_out_sink")


def _replace_output(graph, call: AttentionCall, out: Node, make: NodeMaker, mutations: Mutations, copy: bool) -> None:
    """Reroute the matched output's users to `out`, drop what became dead, and give `out` eager's contiguous
    layout where a user could tell (`copy`, or layout_free says so)."""
    written = bool(mutations.writes.get(storage(call.output)))
    call.output.replace_all_uses_with(out)
    erase_dead(graph, [call.output] + call.matched)
    if copy or written or not layout_free(out, mutations):
        # A copy when the model writes into the output: the op's backward keeps the output it returned.
        with graph.inserting_after(out):
            standard = (make("clone", out, memory_format=torch.contiguous_format, name="attention_out_copy") if written
                        else make("contiguous", out, name="attention_out_contiguous"))
        out.replace_all_uses_with(standard, delete_user_cb=lambda user: user is not standard)


def _rows_eager_makes_nan(make: NodeMaker, call: AttentionCall, out: Node, shared: dict) -> Node:
    """out times `nan_where_no_key` of the additive mask input, whose -inf rows (every key hidden) eager's softmax
    makes NaN (`blind_rows` "nan": no sink), where the op and SDPA give zeros. One factor per mask."""
    if call.additive_input is None or call.blind_rows != "nan":
        return out
    if (key := ("rows without keys", call.additive_input)) not in shared:
        shared[key] = make(nan_where_no_key, call.additive_input, name="rows_without_keys")
    return make(operator.mul, out, shared[key], name="attention_out_nan_rows")


def _emit_sdpa(gm: GraphModule, call: AttentionCall, fake_mode, mutations: Mutations, shared: dict, why: str) -> str:
    """A small attention (hand-written, or an SDPA call with a mask that is at most causal) as the SDPA call that
    computes it (`crossover.sdpa_for`)."""
    make = NodeMaker(gm.graph, call.output, fake_mode)
    with gm.graph.inserting_before(call.output):
        out = _rows_eager_makes_nan(make, call, crossover.sdpa_for(make, call), shared)
    _replace_output(gm.graph, call, out, make, mutations, copy=False)
    mask = ", attn_mask=the additive mask" if out.kwargs.get("attn_mask") is not None else ""
    causal = ", is_causal=True" if out.kwargs.get("is_causal") else ""
    dropout = f", dropout_p={call.dropout_p}" if call.dropout_p else ""
    return f"F.scaled_dot_product_attention(q, k, v{mask}{causal}, scale={round(call.scale, 6)}{dropout}): {why}"


def _describe_call(call: AttentionCall, kwargs: dict) -> str:
    def fmt(n):
        return "x".join(str(s) for s in shape(n))

    flags = ", ".join(f"{k}={round(v, 6) if isinstance(v, float) else v}" for k, v in kwargs.items())
    used = {type(None): "", Shift: ", seqused_k=cache position + Sq"}.get(type(call.seqused_k),
                                                                          ", seqused_k=padding mask sum")
    used += ", padding mask checked to hide none of its keys" if call.covering_mask is not None else ""
    if call.key_mask is not None:
        used += ", key_mask=" + ("additive mask input" if call.key_mask.additive else
                                 "mask per query row" if call.key_mask.per_query else "padding mask")
        used += ", rows that see no key: mean of V" if call.blind_rows in MEAN_ROWS else ""
    if call.int8 is not None:
        keys = call.int8[0].keys
        sliced = "" if keys is None else f"[:, :, {'' if keys.start is None else keys.start}:{keys.stop}]"
        text = (f"fa4.attention_int8kv(q[{fmt(call.q)}], k[{fmt(call.k)}]{sliced} int8, v[{fmt(call.v)}]{sliced} int8, "
                f"k_scale[{fmt(call.int8[0].scale)}]{sliced}, v_scale[{fmt(call.int8[1].scale)}]{sliced}{used}, {flags})")
    else:
        text = f"fa4.attention(q[{fmt(call.q)}], k[{fmt(call.k)}], v[{fmt(call.v)}]{used}, {flags})"
    notes = [call.gqa]
    if call.sink is not None:
        notes.append("attention sink: out * sigmoid(lse - sink)")
    if call.autocast is not None:
        notes.append(f"q, k, v cast to {str(call.autocast).removeprefix('torch.')} as autocast does")
    if call.int8 is not None:
        spellings = {source.spelling for source in call.int8}
        notes.append(f"int8 K/V dequantization folded ({'/'.join(sorted(spellings))})")
    notes.append(call.int8_note)
    return "; ".join([text] + [n for n in notes if n])


def _encode_padding(call: AttentionCall, options) -> None:
    """How a run-time padding mask reaches the op. By default as its key_mask (exact for any mask). With
    `checked_padding`, FA4's fast paths under an in-graph check: alone, as seqused_k = its sum (right
    padding asserted); on a causal band, dropped (asserted to hide none of the band's keys)."""
    if not options.padding:
        raise Decline("a run-time key-padding mask, and the padding option is off")
    if len(shape(call.q)) != 4:
        raise Decline("a run-time key-padding mask on 3-D (bmm) attention, whose batch mixes sequences and heads")
    if call.padding.per_query:
        mask, q, k = shape(call.padding.node), shape(call.q), shape(call.k)
        if mask_rows(mask, (*q[:3], k[-2])) != "per query":
            raise Decline(f"a boolean mask input of shape {list(mask)} for {q[-2]} queries over {k[-2]} keys "
                          "(its rows or columns broadcast)")
    if options.checked_padding and not call.padding.plane:  # a 4-D mask input has no checked form
        banded = call.seqused_k is not None or any(f in call.flags for f in ("causal", "window_left", "window_right"))
        if banded:
            call.covering_mask = call.padding
        elif call.padding.start is not None:
            raise Decline("a key-padding mask read from a run-time key offset, with no causal band")
        else:
            call.seqused_k = call.padding.node
        return
    if call.blind_rows == "nan":
        raise Decline("a run-time padding mask where a query row that sees no key is NaN, or weighted over part "
                      "of the keys or by its scores, in eager (-inf fill in a hand-written softmax, several masking "
                      "steps, or a finite value added that float64 keeps the scores next to)")
    if call.blind_rows == "mean" and "softcap" in call.flags and \
            call.in_training:
        # Eager's value there is the mean of V, and its gradient still reaches q and k through the softmax of the
        # (absorbed) scores: `blind_rows_as_eagers` gives it, but not through a softcap's tanh.
        raise Decline("a run-time finfo.min padding mask in training under a softcap: a query row that sees no key "
                      "passes eager's softmax gradient to q and k through the softcap, which the rewrite does not "
                      "reproduce")
    if call.blind_rows in MEAN_ROWS and getattr(options, "small_calls_to_sdpa", True) and \
            (short := crossover.short_padded_training(call)) is not None:
        raise Decline(short)
    call.key_mask = call.padding


def _check_in_place_updates(call: AttentionCall, mutations: Mutations, constants: dict) -> set:
    """Decline when the rewrite would read a tensor after an in-place update the original code read before,
    or a mask was updated in place after the operations it was proven from. Returns the module buffers the
    masks were read from by value."""
    buffers = set()
    for mask, use in call.masks:
        buffers.update(n for n in mutations.check_mask(mask, use) if n in constants)
    tensors = {call.q, call.k, call.v} | ({source.scale for source in call.int8} if call.int8 else set())
    tensors |= {call.sink} if call.sink is not None else set()
    reads = mutations.first_reads(tensors, call.output, call.matched)
    if call.key_mask is not None:  # read by the op itself (padding.key_mask)
        reads[call.key_mask.node] = call.key_mask.node
    mutations.check_reads(reads, call.output)
    return buffers


def _check_positions_bounded(call: AttentionCall, mutations: Mutations) -> None:
    """Query positions held in tensors are rewritten only over a KV cache written in this graph at indexed
    positions (`index_copy_`, `cache[..., pos] = x`): eager's own write then bounds them to the cache, the case
    seqused_k = start + Sq expresses. Anywhere else positions outside the keys are possible, and eager's answer
    there (queries without keys, bands past the last key) has no seqused_k."""
    shift = call.seqused_k
    if not isinstance(shift, Shift) or not any(
            isinstance(value(n), torch.Tensor) for n in (shift.node, shift.minus) if n is not None):
        return
    if not any(_indexed_write(w) for w in mutations.writes_before(call.k, call.output)):
        raise PositionsUnbounded("query positions held in a tensor over keys that are not a KV cache written in this "
                                 "graph at indexed positions: positions outside the keys cannot be excluded")


class PositionsUnbounded(Decline):
    """A band at query positions held in a tensor, over keys nothing bounds those positions to
    (`_check_positions_bounded`): transformers 4's `cache_position` input over a DynamicCache's concatenated keys
    (every step of its generate)."""


def rewrite_or_retry(match, context: Context) -> str | None:
    """`rewrite(match(run_time_masks, False))`, `run_time_masks` the context's option; where that declines with
    `PositionsUnbounded` and the option is on, the attention matched again with its masks taken as run-time masks,
    unproven (`match(True, True)`, `mask_flags`): the op's key mask, exact for any positions. Where the masks have no
    run-time form, the first reason stands; where the attention with them is declined (a crossover, a softcap the
    SDPA fallback lacks), that reason."""
    run_time_masks = getattr(context.options, "run_time_masks", False)
    first = None
    try:
        first = match(run_time_masks, False)
        return rewrite(first, context)
    except PositionsUnbounded as unbounded:
        if not run_time_masks:
            raise
        if first is not None and first.blind_rows == "nan":
            raise Decline(f"{unbounded}; taken as a run-time mask instead, a query row that sees no key would be NaN "
                          "in eager (a -inf fill in a hand-written softmax), which the op does not give") from None
        try:
            call = match(True, True)
        except Decline:
            raise unbounded from None
        return rewrite(call, context)


def _indexed_write(node: Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if name in ("index_copy_", "index_put_"):
        return True
    index = node.args[1] if node.target is operator.setitem and len(node.args) > 1 else None
    parts = index if isinstance(index, (tuple, list)) else [index]
    return any(isinstance(p, Node) and isinstance(value(p), torch.Tensor) for p in parts)




def rewrite(call: AttentionCall | None, context: Context) -> str | None:
    """The checks every matched attention goes through, then its `fa4::attention` call; the record text."""
    if call is None:
        return None
    _check_output_shape(call)
    if call.dropout_p:
        return _dropout_rewrite(call, context)
    if call.additive_input is not None:
        return _additive_input_rewrite(call, context)
    small = None
    if getattr(context.options, "small_calls_to_sdpa", True) and call.sink is None:  # SDPA has no sink
        small = crossover.small_attention(call, context.gm.graph, context.shared)
        decode = None if small is not None else (
            crossover.small_decode(call, context.gm.graph, context.shared) or crossover.unsplit_decode(call))
        if decode is not None:
            raise Decline(decode)  # as written: SDPA's is_causal aligns a band to the first key, not the cache's end
    if small is not None and crossover.is_sdpa_call(call) and not crossover.mask_is_at_most_causal(call):
        raise Decline(small)
    if small is None:
        if call.padding is not None:
            _encode_padding(call, context.options)
        _fold_gqa(call, context.options.gqa)
        _fold_int8(call, context.options)
    buffers = _check_in_place_updates(call, context.mutations, context.constants)
    _check_positions_bounded(call, context.mutations)
    if small is not None:
        text = _emit_sdpa(context.gm, call, context.fake_mode, context.mutations, context.shared, small)
    else:
        text = emit(context.gm, call, context.fake_mode, context.shared, context.mutations)
    context.read_by_value |= buffers  # masks read from module buffers, is_causal's included
    return text


def _dropout_rewrite(call: AttentionCall, context: Context) -> str:
    """A hand-written attention with dropout on its weights in training, as SDPA with that dropout_p (PyTorch's
    flash / cuDNN / efficient kernels take it; the op does not): without a mask, or with a causal band over as many
    keys as queries (SDPA's is_causal aligns the band to the first key). Its random mask is SDPA's, as default
    compile's is Inductor's: neither is eager's stream. Anything more stays as written."""
    what = f"dropout p={call.dropout_p} in training"
    if call.sink is not None or call.seqused_k is not None or crossover.hides_more_than_causal(call):
        extra = ", ".join(sorted(set(call.flags) - {"causal"})) or ("a sink" if call.sink is not None else
                                                                   "a mask beyond a causal band")
        raise Decline(f"{what} with {extra}: SDPA takes the dropout, not that")
    q_len, k_len = shape(call.q)[-2], shape(call.k)[-2]
    if call.flags.get("causal") and not same_size(q_len, k_len):
        raise Decline(f"{what} under a causal band over {k_len} keys for {q_len} queries: SDPA's is_causal aligns "
                      "its band to the first key")
    buffers = _check_in_place_updates(call, context.mutations, context.constants)
    text = _emit_sdpa(context.gm, call, context.fake_mode, context.mutations, context.shared,
                      f"{what}, which SDPA's kernels take and the op does not")
    context.read_by_value |= buffers
    return text


ADDITIVE_INPUT_ON_SDPA = ("an additive mask input, its values unknown when compiling (the op takes boolean key masks): "
                          "SDPA with the mask as given, which computes what eager does (rows it hides every key of NaN, "
                          "as eager's)")


def _additive_input_rewrite(call: AttentionCall, context: Context) -> str:
    """A hand-written attention whose one mask is a floating-point graph input, added to the scores: with
    `additive_masks_on_op`, it goes to the op with the mask as its additive key_mask where the op takes it
    (`_additive_on_op`), in training too (the op's backward gives rows that see no key eager's gradient); else, in
    inference, the SDPA call with that mask (`crossover.sdpa_for`), or, with a softcap or a sink (no SDPA spelling),
    it is kept. In training, where the op does not take it, or the attention is small (`small_masked_training`), it
    is kept: eager's softmax passes gradients through rows that see no key (every score finfo.min), which SDPA's
    backward is not known to give."""
    if call.autocast is not None or value(call.additive_input).dtype != value(call.q).dtype:
        raise Decline(f"{call.additive_reason}, in {value(call.additive_input).dtype} for {value(call.q).dtype} "
                      "scores (SDPA and the op take a mask in q's dtype)")
    keys = _additive_on_op(call) if getattr(context.options, "additive_masks_on_op", False) else None
    if keys is None and call.in_training:
        raise Decline(f"{call.additive_reason}; in training it is kept as written")
    if call.in_training and getattr(context.options, "small_calls_to_sdpa", True) and \
            (small := crossover.small_masked_training(call)) is not None:
        raise Decline(f"{call.additive_reason}; {small}")
    if keys is not None:
        call.key_mask = keys
        _fold_gqa(call, context.options.gqa)  # before the in-place check: the op reads the un-repeated K/V
    elif "softcap" in call.flags or call.sink is not None:
        raise Decline(f"{call.additive_reason}; with {'a softcap' if call.sink is None else 'an attention sink'}, "
                      "which SDPA has not")
    buffers = _check_in_place_updates(call, context.mutations, context.constants)
    if keys is not None:
        text = emit(context.gm, call, context.fake_mode, context.shared, context.mutations)
    else:
        text = _emit_sdpa(context.gm, call, context.fake_mode, context.mutations, context.shared,
                          ADDITIVE_INPUT_ON_SDPA)
    context.read_by_value |= buffers
    return text


def _additive_on_op(call: AttentionCall) -> KeyMask | None:
    """The op's additive key mask for this call's 4-D mask input, or None where the op does not take it: a
    [B or 1, 1, 1, Sk] mask over at most `DECODE_MAX_Q_LEN` queries (a decode step: the decode kernel adds it), or a
    [B or 1, 1, Sq, Sk] one, a row per query, without a softcap (a prefill: FA4 where it is generate's left-padded
    causal mask, which the op reads on the host, else the SDPA fallback with it, which has no softcap: the reference
    would run it). Its rows are rebased to their largest values where `AttentionCall.rebases_mask_input`."""
    q = shape(call.q)
    rows = mask_rows(shape(call.additive_input), (*q[:3], shape(call.k)[2])) if len(q) == 4 else None
    if rows == "one row" and isinstance(q[2], int) and q[2] <= DECODE_MAX_Q_LEN:
        return KeyMask(call.additive_input, additive=True, rebased=call.rebases_mask_input)
    if rows == "per query" and "softcap" not in call.flags:
        return KeyMask(call.additive_input, additive=True, per_query=True, rebased=call.rebases_mask_input)
    return None
