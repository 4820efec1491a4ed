"""Attention subgraphs -> `fa4::attention`, on the Dynamo (torch-IR) graph.

Rewriting before AOTAutograd keeps training correct: the op's registered autograd puts
`fa4::attention_backward` into the backward graph. Two families:

sdpa: `F.scaled_dot_product_attention(q, k, v, attn_mask=None|band, dropout_p=0.0, is_causal=?,
    scale=?, enable_gqa=?)`

handwritten (every spelling of each step is accepted, see `spellings.py`):

    s = q @ k^T                    matmul / @ / bmm; k^T by .transpose(-2, -1), .mT or permute
    s = s * c   or   s / c         on the scores, on q, or on k (any number of constant factors)
    s = c * tanh(s / c)            softcap (Gemma-2), after the scale
    s = mask(s)                    masked_fill / torch.where / + additive band (masks.py)
    p = softmax(s, dim=-1)         F / torch / Tensor softmax, optionally float32 and cast back
    p = dropout(p)                 p == 0 or not training
    out = p @ v

K/V feeding either family may be repeated for GQA (`gqa.py`); the repetition is folded. A mask that
depends on run-time data becomes an op input built once per graph and shared by every layer: a KV
cache position becomes seqused_k (`kv_cache.py`), a padding mask the op's key_mask (`padding.py`,
which also has the checked seqused_k forms).

A candidate is kept as written, with the reason recorded, when: dropout is active, a mask is not a
provable band (masks.py), the scores or weights are used elsewhere (e.g. `output_attentions`), a
scale is not a constant, dtypes differ, or the device's kernel cannot take the dtype or head dim
(`kernels.attention.unsupported_reason`).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ..kernels import attention as attention_op
from . import gqa, kv_cache, padding
from .mutations import Mutations, layout_free, storage
from .masks import INF, MaskNotUnderstood, Band, KeyMask, Shift, band_args, broadcasts_last_two_dims, keep_band
from .records import Decline, Record
from .spellings import (ADD, CAST, DIV, DROPOUT, MASKED_FILL, MATMUL, MUL, SDPA, SOFTMAX, TANH, WHERE, arg,
                        location, module_path, normalize_dim, same_size, scalar, shape, single_user,
                        transposed_last_two, value)

ATTENTION = torch.ops.fa4.attention.default


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
    blind_rows: str = "zeros"  # what eager gives a query row that sees no key: "zeros", "mean" (of V) or "nan"
    # How `padding` reaches the op (`_encode_padding`): its key_mask, or checked fast paths (padding.py).
    key_mask: KeyMask | None = None
    covering_mask: KeyMask | None = None  # must hide none of the band's keys (checked at run time)


def _check_kernel_support(q: Node, k: Node, v: Node) -> None:
    qv, kv, vv = value(q), value(k), value(v)
    if not (qv.dtype == kv.dtype == vv.dtype):
        raise Decline(f"q, k, v dtypes differ ({qv.dtype}, {kv.dtype}, {vv.dtype})")
    if qv.device != kv.device or qv.device != vv.device:
        raise Decline("q, k, v are on different devices")
    if qv.dim() not in (3, 4) or kv.dim() != qv.dim() or vv.dim() != qv.dim():
        raise Decline(f"q, k, v have {qv.dim()}, {kv.dim()}, {vv.dim()} dims (want 4, or 3 for bmm)")
    # Kernels are compiled per head dim: a symbolic one is specialized (guarded), as no model varies it.
    reason = attention_op.unsupported_reason(qv.device.type, qv.dtype, int(qv.shape[-1]), int(vv.shape[-1]))
    if reason:
        raise Decline(reason)
    _check_no_broadcast(shape(q), shape(k), shape(v))


def _equal(a, b) -> bool:
    """Two sizes are equal: provably, or under a guard (a later call where they differ recompiles)."""
    return same_size(a, b) or guard_or_false(a == b)


def _check_no_broadcast(q, k, v) -> None:
    """Eager broadcasts q @ k^T and SDPA over batch and head dims; the op takes q [B, Hq, Sq, D] with k, v
    [B, Hkv, Sk, D] and Hq a multiple of Hkv (one K/V head for a group of query heads) only."""
    if not (_equal(q[0], k[0]) and _equal(q[0], v[0])):
        raise Decline(f"q, k, v leading sizes {q[0]}, {k[0]}, {v[0]} differ (eager broadcasts them)")
    if not _equal(k[-2], v[-2]):
        raise Decline(f"k and v have {k[-2]} and {v[-2]} keys")
    if len(q) == 4:
        hq, hk, hv = q[1], k[1], v[1]
        if not _equal(hk, hv) or not (_equal(hq, hk) or guard_or_false(hq % hk == 0)):
            raise Decline(f"{hq} query heads against {hk} key and {hv} value heads (not a multiple: eager broadcasts)")


def _check_output_shape(call: "AttentionCall") -> None:
    """The op's output [B, Hq, Sq, Dv] is what the matched subgraph returned (a mask can broadcast it larger)."""
    expected = shape(call.q)[:-1] + shape(call.v)[-1:]
    actual = shape(call.output)
    if len(actual) != len(expected) or not all(_equal(a, b) for a, b in zip(actual, expected)):
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


def _require_square(scores_shape, what: str) -> None:
    if not _equal(scores_shape[-2], scores_shape[-1]):
        raise Decline(f"{what} needs seqlen_q == seqlen_k ({scores_shape[-2]} vs {scores_shape[-1]}): SDPA and "
                      "hand-written masks align top-left, FA4 bottom-right")


def _mask_flags(kind: str, mask, constants, scores_shape, fill=None) -> tuple[Band, float | None]:
    """The visible keys of one masking step and the score its hidden keys get (see `keep_band`)."""
    try:
        band, hidden = keep_band(kind, mask, constants, fill)
    except MaskNotUnderstood as e:
        raise Decline(f"mask not recognized: {e}") from None
    if not isinstance(mask, Node):
        return band, hidden
    mshape = shape(mask)
    if len(mshape) > len(scores_shape) or not all(
            same_size(m, 1) or _equal(m, s) for m, s in zip(mshape[::-1], scores_shape[::-1])):
        raise Decline(f"the mask's shape {list(mshape)} broadcasts the scores' {list(scores_shape)} larger")
    if band != Band():
        same = len(mshape) >= 2 and all(same_size(a, b) for a, b in zip(mshape[-2:], scores_shape[-2:]))
        # A mask the same for every query (a key-padding mask) may be broadcast over the query rows.
        if not same and (band.bounded or not broadcasts_last_two_dims(mshape, scores_shape)):
            raise Decline(f"mask not recognized: its last dims {mshape[-2:]} are not the scores' {scores_shape[-2:]}")
    return band, hidden


def _blind_rows(hidden_scores: list, sdpa: bool, softmax_dtype: torch.dtype | None = None) -> str:
    """What eager gives a row whose keys are all hidden: SDPA returns zeros for a boolean or -inf mask
    (its safe softmax); a finite finfo.min score on every key of the row, from one masking step, makes
    the softmax uniform (the mean of V over all keys); -inf in a plain softmax, or several steps mixing
    the two, give NaN or weights over part of the keys ("nan": not reproduced)."""
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


def _flags_for(band: Band, scores_shape) -> tuple[dict, Shift | None, KeyMask | None]:
    """The op's flags for the visible keys `band`, the run-time query start its seqused_k comes from
    (a KV cache), and the run-time key mask on top of the band (a padding mask)."""
    if not band.bounded:
        return {}, None, band.keys
    flags, shift = _band_flags(band, scores_shape)
    return flags, shift, band.keys


def _band_flags(band: Band, scores_shape) -> tuple[dict, Shift | None]:
    try:
        flags = band_args(band)
    except MaskNotUnderstood as e:
        raise Decline(f"mask not recognized: {e}") from None
    if band.shift is None and _equal(scores_shape[-2], scores_shape[-1]):
        return flags, None
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
    return band_args(Band(band.lo - band.hi, 0)), shift


def _constant(x) -> float | None:
    """A number argument as a float; a symbolic one (a float module attribute under `dynamic=True`) is
    specialized to its value, which guards on it."""
    if isinstance(x, Node) and isinstance(v := value(x), (torch.SymFloat, torch.SymInt)):
        return float(v)
    return scalar(x)


def match_sdpa(node: Node, constants: dict) -> AttentionCall:
    q, k, v = arg(node, 0, "query"), arg(node, 1, "key"), arg(node, 2, "value")
    attn_mask = arg(node, 3, "attn_mask", None)
    dropout_p = arg(node, 4, "dropout_p", 0.0)
    is_causal = arg(node, 5, "is_causal", False)
    scale = arg(node, 6, "scale", None)
    if scalar(dropout_p) != 0.0:
        raise Decline(f"dropout_p={dropout_p} (dropout is not supported)")
    if not isinstance(is_causal, bool):
        raise Decline(f"is_causal is not a constant ({is_causal})")
    _check_kernel_support(q, k, v)
    scores_shape = shape(q)[:-1] + (shape(k)[-2],)
    flags, seqused_k, keys, blind = {}, None, None, "zeros"
    if attn_mask is not None:
        kind = "bool" if value(attn_mask).dtype == torch.bool else "additive"
        band, hidden = _mask_flags(kind, attn_mask, constants, scores_shape)
        flags, seqused_k, keys = _flags_for(band, scores_shape)
        blind = _blind_rows([hidden], sdpa=True)
    if is_causal:
        _require_square(scores_shape, "is_causal")
        flags["causal"] = True
    if scale is None:
        scale = 1.0 / math.sqrt(int(shape(q)[-1]))
    elif _constant(scale) is None:
        raise Decline(f"scale is not a constant ({scale})")
    return AttentionCall(q, k, v, output=node, scale=_positive_scale(_constant(scale)), flags=flags, matched=[node],
                         seqused_k=seqused_k, padding=keys, blind_rows=blind,
                         masks=[(attn_mask, node)] if isinstance(attn_mask, Node) else [])


def _constant_factor(node: Node) -> tuple[Node, float] | None:
    """(x, c) when node is x * c or x / c (c = 1/divisor) for a constant c; None otherwise."""
    if MUL(node):
        a, b = node.args[0], node.args[1]
        if isinstance(a, Node) and _constant(b) is not None:
            return a, _constant(b)
        if isinstance(b, Node) and _constant(a) is not None:
            return b, _constant(a)
    if DIV(node) and isinstance(node.args[0], Node) and _constant(node.args[1]):
        return node.args[0], 1.0 / _constant(node.args[1])
    return None


def _softcap(node: Node) -> tuple[Node, float, list] | None:
    """(x, c, inner nodes) when node is `tanh(x / c) * c`."""
    outer = _constant_factor(node)
    if outer is None or not TANH(outer[0]):
        return None
    tanh = outer[0]
    inner = _constant_factor(tanh.args[0])
    if inner is None or not math.isclose(inner[1] * outer[1], 1.0, rel_tol=1e-12):
        return None
    _only_feeds(tanh, node)
    _only_feeds(tanh.args[0], tanh)
    return inner[0], abs(outer[1]), [tanh, tanh.args[0]]  # tanh is odd: c tanh(x / c) is the same for -c


def _only_feeds(node, consumer: Node) -> None:
    if isinstance(node, Node) and set(node.users) != {consumer}:
        raise Decline(f"an intermediate ({node.name}) is also used outside the attention")


def _peel_scales(node: Node, consumer: Node, matched: list) -> tuple[Node, float]:
    """(x, c) for node = x * c1 / c2 ...: constant positive factors on an operand of q @ k^T."""
    factor = 1.0
    while (found := _constant_factor(node)) is not None:
        _only_feeds(node, consumer)
        matched.append(node)
        consumer = node
        node, c = found
        factor *= _positive_scale(c)
    return node, factor


def _positive_scale(c: float) -> float:
    """The kernels subtract each row's largest score before exponentiating, which needs a positive scale."""
    if not (c > 0 and math.isfinite(c)):
        raise Decline(f"the scale factor {c} is not positive and finite")
    return c


def _dropout_is_noop(node: Node) -> bool:
    p = arg(node, 1, "p", 0.5)
    training = arg(node, 2, "training", True)
    return scalar(p) == 0.0 or training is False


def match_handwritten(softmax: Node, constants: dict) -> AttentionCall | None:
    """The attention around a softmax node, None if the softmax is not attention at all."""
    matched = [softmax]
    probs = softmax
    while True:
        users = list(probs.users)
        pv = [u for u in users if MATMUL(u) and u.args[0] is probs]
        if pv:
            if len(users) != 1:
                raise Decline("the attention weights are also used outside the attention (output_attentions?)")
            break
        nxt = single_user(probs)
        if nxt is None or not (CAST(nxt) or DROPOUT(nxt)):
            return None
        if DROPOUT(nxt) and not _dropout_is_noop(nxt):
            raise Decline(f"dropout p={arg(nxt, 1, 'p', 0.5)} in training")
        matched.append(nxt)
        probs = nxt
    output = pv[0]
    v = output.args[1]

    dim = arg(softmax, 1, "dim", None)
    ndim = len(shape(softmax))
    if not isinstance(dim, int) or normalize_dim(dim, ndim) != ndim - 1:
        raise Decline(f"softmax over dim {dim}, not the key dim")

    # Walking up from the softmax meets the steps in reverse: masks, then the softcap, then scales.
    scale, softcap, band, hidden_scores, masks = 1.0, 0.0, Band(), [], []
    scores_shape = shape(softmax)
    node = softmax.args[0]
    consumer = softmax
    while not MATMUL(node):
        _only_feeds(node, consumer)
        matched.append(node)
        consumer = node
        if CAST(node):
            node = node.args[0]
        elif (capped := _softcap(node)) is not None:
            if softcap or scale != 1.0:
                raise Decline("a softcap applied twice or before a scale")
            node, softcap, inner = capped
            matched += inner
            consumer = inner[-1]
        elif (found := _constant_factor(node)) is not None:
            node, c = found
            scale *= _positive_scale(c)
        elif MASKED_FILL(node) or WHERE(node) or ADD(node):
            if softcap:
                raise Decline("a mask applied before the softcap")
            step = node
            node, mask, visible, hidden = _strip_mask(node, constants, scores_shape)
            masks.append((mask, step))
            band &= visible
            hidden_scores.append(hidden)
        else:
            raise Decline(f"{node.format_node()} between q @ k^T and softmax is not understood")
    qk = node
    _only_feeds(qk, consumer)
    matched.append(qk)
    q, q_scale = _peel_scales(qk.args[0], qk, matched)
    kt, k_scale = _peel_scales(qk.args[1], qk, matched)
    k = transposed_last_two(kt)
    if k is None:
        raise Decline("the second operand of q @ k^T is not a transposed k")
    if len(kt.users) != 1:
        raise Decline(f"an intermediate ({kt.name}) is also used outside the attention")
    matched.append(kt)
    k, k_scale2 = _peel_scales(k, kt, matched)
    scale *= q_scale * k_scale * k_scale2
    _check_kernel_support(q, k, v)
    if value(output).dtype != value(q).dtype:
        raise Decline(f"the output dtype {value(output).dtype} is not q's {value(q).dtype}")
    flags, seqused_k, keys = _flags_for(band, scores_shape)
    if softcap:
        flags["softcap"] = softcap
    return AttentionCall(q, k, v, output=output, scale=scale, flags=flags, matched=matched + [output],
                         seqused_k=seqused_k, padding=keys,
                         blind_rows=_blind_rows(hidden_scores, sdpa=False, softmax_dtype=value(softmax).dtype),
                         masks=[(m, use) for m, use in masks if isinstance(m, Node)])


def _strip_mask(node: Node, constants, scores_shape) -> tuple[Node, object, Band, float | None]:
    """(scores, mask, visible band, hidden keys' score) for a masking step: masked_fill, where(cond, scores,
    fill) or scores + mask."""
    if MASKED_FILL(node):
        mask = node.args[1]
        return node.args[0], mask, *_mask_flags("masked_fill", mask, constants, scores_shape, arg(node, 2, "value"))
    if WHERE(node):
        if len(node.args) != 3 or not isinstance(node.args[1], Node):
            raise Decline(f"{node.format_node()} is not where(mask, scores, fill)")
        mask = node.args[0]
        return node.args[1], mask, *_mask_flags("where", mask, constants, scores_shape, node.args[2])
    errors = []
    for scores, mask in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
        if not isinstance(scores, Node):
            continue
        try:
            return scores, mask, *_mask_flags("additive", mask, constants, scores_shape)
        except Decline as e:
            errors.append(str(e))
    raise Decline(errors[0] if errors else f"{node.format_node()} adds no tensor")


def _removable(node: Node) -> bool:
    if node.op == "call_method":  # in-place methods end in one underscore; dunders (`__eq__`, torch 2.11) do not mutate
        return not node.target.endswith("_") or node.target.endswith("__")
    return node.op == "call_function" and not node.is_impure() and node.target is not operator.setitem


def _erased(node: Node) -> bool:
    return getattr(node, "_erased", False)


def _erase_dead(graph, nodes) -> None:
    work = list(nodes)
    while work:
        node = work.pop()
        if _erased(node) or node.users or not _removable(node):
            continue
        inputs = [n for n in node.all_input_nodes]
        graph.erase_node(node)
        work.extend(inputs)


class NodeMaker:
    """Creates nodes at the graph's current insertion point with Dynamo's metadata (example values under
    the graph's fake mode, the replaced node's stack trace): `make(target, *args, **kwargs)`, a string
    target being a Tensor method."""

    def __init__(self, graph, original: Node, fake_mode):
        self.graph, self.original, self.fake_mode = graph, original, fake_mode

    def __call__(self, target, *args, name=None, **kwargs) -> Node:
        op = "call_method" if isinstance(target, str) else "call_function"
        node = self.graph.create_node(op, target, args, kwargs, name=name)
        node.meta["stack_trace"] = self.original.meta.get("stack_trace")
        if self.fake_mode is not None:
            fake_args = torch.fx.node.map_arg(args, value)
            fake_kwargs = torch.fx.node.map_arg(kwargs, value)
            with self.fake_mode:
                if op == "call_method":
                    result = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    result = target(*fake_args, **fake_kwargs)
            node.meta["example_value"] = result
        return node


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
                with graph.inserting_before(_after_definition(node)):
                    starts.append(kv_cache.snapshot(make, node, vector))
            shared[key] = kv_cache.seqused_k(make, *starts, source.top, q, k)
        else:
            with graph.inserting_before(_after_definition(source)):
                shared[key] = padding.seqused_k(make, source)
    return shared[key]


def _after_definition(node: Node) -> Node:
    """The node before which code reading `node` right after its definition goes (after all placeholders)."""
    after = node.next
    while after.op == "placeholder":
        after = after.next
    return after


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
        if three_d:
            q, k, v = (make("unsqueeze", t, 0) for t in (q, k, v))
        seqused_k = _seqused_k(graph, make, call, shared, q, k)
        if call.covering_mask is not None and (call.covering_mask, seqused_k) not in shared:
            shared[call.covering_mask, seqused_k] = padding.check_hides_none(make, call.covering_mask, seqused_k)
        inputs = [q, k, v]
        if call.key_mask is not None:
            where = (call.key_mask, str(shape(k)[-2]))  # one [B, Sk] key mask per padding mask and key length
            if where not in shared:
                shared[where] = padding.key_mask(make, call.key_mask, k)
            inputs += [seqused_k, shared[where]]
        elif seqused_k is not None:
            inputs.append(seqused_k)
        op = make(ATTENTION, *inputs, name="fa4_attention", **kwargs)
        out = make(operator.getitem, op, 0, name="attention_out")
        if call.key_mask is not None and call.blind_rows == "mean":
            out = padding.blind_rows_as_mean(make, out, make(operator.getitem, op, 1), v)
        if three_d:
            out = make("squeeze", out, 0)
    written = bool(mutations.writes.get(storage(call.output)))
    call.output.replace_all_uses_with(out)
    _erase_dead(graph, [call.output] + call.matched)
    if three_d or written or not layout_free(out, mutations):
        # A copy when the model writes into the output: the op's backward keeps the output it returned.
        with graph.inserting_after(out):
            standard = (make("clone", out, memory_format=torch.contiguous_format, name="attention_out_copy") if written
                        else make("contiguous", out, name="attention_out_contiguous"))
        out.replace_all_uses_with(standard, delete_user_cb=lambda user: user is not standard)
    return _describe_call(call, kwargs)


def _describe_call(call: AttentionCall, kwargs: dict) -> str:
    def fmt(n):
        return "x".join(str(s) for s in shape(n))

    flags = ", ".join(f"{k}={round(v, 6) if isinstance(v, float) else v}" for k, v in kwargs.items())
    used = {type(None): "", Shift: ", seqused_k=cache position + Sq"}.get(type(call.seqused_k),
                                                                          ", seqused_k=padding mask sum")
    used += ", padding mask checked to hide none of its keys" if call.covering_mask is not None else ""
    if call.key_mask is not None:
        used += ", key_mask=padding mask" + (", rows that see no key: mean of V" if call.blind_rows == "mean" else "")
    text = f"fa4.attention(q[{fmt(call.q)}], k[{fmt(call.k)}], v[{fmt(call.v)}]{used}, {flags})"
    return text + (f"; {call.gqa}" if call.gqa else "")


def _encode_padding(call: AttentionCall, options) -> None:
    """How a run-time padding mask reaches the op. By default as its key_mask (exact for any mask). With
    `checked_padding`, FA4's fast paths under an in-graph check: alone, as seqused_k = its sum (right
    padding asserted); on a causal band, dropped (asserted to hide none of the band's keys)."""
    if not options.padding:
        raise Decline("a run-time key-padding mask, and the padding option is off")
    if len(shape(call.q)) != 4:
        raise Decline("a run-time key-padding mask on 3-D (bmm) attention, whose batch mixes sequences and heads")
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
        raise Decline("a run-time padding mask where a query row that sees no key is NaN or weighted over part "
                      "of the keys in eager (-inf fill in a hand-written softmax, or several masking steps)")
    if call.blind_rows == "mean" and any(value(t).requires_grad for t in (call.q, call.k, call.v)):
        # Eager's value there is the mean of V, but its gradient still reaches q and k through the
        # softmax of the (absorbed) scores, which the mean in the graph cannot give.
        raise Decline("a run-time finfo.min padding mask in training: a query row that sees no key passes "
                      "eager's softmax gradient to q and k, which the rewrite does not reproduce")
    call.key_mask = call.padding


def _check_in_place_updates(call: AttentionCall, mutations: Mutations, constants: dict) -> set:
    """Decline when the rewrite would read a tensor after an in-place update the original code read before,
    or a mask was updated in place after the operations it was proven from. Returns the module buffers the
    masks were read from by value."""
    buffers = set()
    for mask, use in call.masks:
        buffers.update(n for n in mutations.check_mask(mask, use) if n in constants)
    reads = mutations.first_reads({call.q, call.k, call.v}, call.output, call.matched)
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
        raise Decline("query positions held in a tensor over keys that are not a KV cache written in this graph at "
                      "indexed positions: positions outside the keys cannot be excluded")


def _indexed_write(node: Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if name in ("index_copy_", "index_put_"):
        return True
    index = node.args[1] if node.target is operator.setitem and len(node.args) > 1 else None
    parts = index if isinstance(index, (tuple, list)) else [index]
    return any(isinstance(p, Node) and isinstance(value(p), torch.Tensor) for p in parts)


def rewrite_attention(gm: GraphModule, constants: dict, options, fake_mode) -> tuple[list[Record], set]:
    """Rewrite every attention in gm that fa4::attention can take; one record per candidate, and the module
    buffers whose values the rewrites depend on (masks read by value)."""
    records, shared, read_by_value = [], {}, set()
    mutations = Mutations(gm.graph)
    for node in list(gm.graph.nodes):
        if _erased(node):
            continue  # removed by an earlier rewrite
        if SDPA(node) and options.sdpa:
            family, matcher = "sdpa", match_sdpa
        elif SOFTMAX(node) and options.handwritten:
            family, matcher = "handwritten", match_handwritten
        else:
            continue
        where = location(node)
        try:
            call = matcher(node, constants)
            if call is None:
                continue
            _check_output_shape(call)
            if call.padding is not None:
                _encode_padding(call, options)
            _fold_gqa(call, options.gqa)
            buffers = _check_in_place_updates(call, mutations, constants)
            _check_positions_bounded(call, mutations)
            records.append(Record(family, where, True, emit(gm, call, fake_mode, shared, mutations), module_path(node)))
            read_by_value |= buffers
        except Decline as e:
            records.append(Record(family, where, False, str(e), module_path(node)))
    return records, read_by_value
