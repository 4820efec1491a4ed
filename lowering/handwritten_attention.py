"""Hand-written attention -> `fa4::attention` (every spelling of each step is accepted, see `spellings.py`):

    s = q @ k^T                    matmul / @ / bmm / a matmul-shaped einsum (einsum.py); k^T by .transpose(-2, -1),
                                   .mT or permute
    s = s * c   or   s / c         on the scores (in place too), on q, or on k (any number of constant factors)
    s = c * tanh(s / c)            softcap (Gemma-2), after the scale
    s = mask(s)                    masked_fill / torch.where / + additive band (masks.py)
    s = cat([s, sink], -1)         attention sinks (GPT-OSS: a logit a head; Inkling 2: a logit a query, projected
                                     from the hidden states), optionally cast to float, optionally
    s = s - s.max(-1, True)[0]       shifted by the row max (also without a sink), its column dropped after the softmax:
    p = softmax(s, dim=-1)[..., :-1] the op's out * sigmoid(lse - sink)
    p = softmax(s, dim=-1)         F / torch / Tensor softmax, optionally float32 and cast back
    p = dropout(p)                 p == 0 or not training
    out = p @ v
    out = out * sigmoid(logsumexp(s, -1) - c)[..., None]
                                   attention sinks as a scale (Granite SWA): the same as GPT-OSS's, c broadcast over
                                   the rows (one logit a head), casts around the sigmoid

found from the softmax. Not rewritten when an intermediate (the scores, the weights: `output_attentions`)
is used elsewhere, or a step between q @ k^T and the softmax is not one of the above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.fx import Node

from . import attention, einsum
from .family import TORCH_IR, Context, Family
from .masks import Band, MaskNotUnderstood
from .records import Decline
from .spellings import (ADD, AMAX, CAST, CAT, DIV, DROPOUT, GETITEM, HIDING_FILL, IN_PLACE_ADD, IN_PLACE_DIV,
                        IN_PLACE_MUL, LOGSUMEXP, MASKED_FILL, MATMUL, MAX, MUL, RESHAPE, SIGMOID, SOFTMAX, SUB, TANH,
                        UNSQUEEZE, WHERE, arg,
                        describe_node, is_zero, normalize_dim, same_size, shape, single_user, transposed_last_two,
                        value)


def _constant_factor(node: Node) -> tuple[Node, float] | None:
    """(x, c) when node is x * c or x / c (c = 1/divisor) for a constant c, in place too; None otherwise."""
    if MUL(node) or IN_PLACE_MUL(node):
        a, b = node.args[0], node.args[1]
        if isinstance(a, Node) and attention.constant(b) is not None:
            return a, attention.constant(b)
        if isinstance(b, Node) and attention.constant(a) is not None:
            return b, attention.constant(a)
    if (DIV(node) or IN_PLACE_DIV(node)) and isinstance(node.args[0], Node) and attention.constant(node.args[1]):
        return node.args[0], 1.0 / attention.constant(node.args[1])
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


def _only_feeds(node, consumer: Node, also: Node | None = None) -> None:
    if isinstance(node, Node) and set(node.users) - {also} != {consumer}:
        raise Decline(f"an intermediate ({node.name}) is also used outside the attention")


def _peel_scales(node: Node, consumer: Node, matched: list) -> tuple[Node, float]:
    """(x, c) for node = x * c1 / c2 ...: constant positive factors on an operand of q @ k^T."""
    factor = 1.0
    while (found := _constant_factor(node)) is not None:
        _only_feeds(node, consumer)
        matched.append(node)
        consumer = node
        node, c = found
        factor *= attention.positive_scale(c)
    return node, factor


def _dropout_is_noop(node: Node) -> bool:
    p = arg(node, 1, "p", 0.5)
    training = arg(node, 2, "training", True)
    return training is False or is_zero(p)


def _reshape_round_trip(node: Node, steps: int = 3) -> list[Node]:
    """The views after `node`, one user at a time, that bring back its shape (XGLM's `w.view(B, H, S, S).view(B * H,
    S, S)` between the softmax and @ v, for `output_attentions`): nothing at all in effect. [] where there are none."""
    chain, start = [], shape(node)
    for _ in range(steps):
        nxt = single_user(node)
        if nxt is None or not RESHAPE(nxt) or nxt.args[0] is not node:
            return []
        chain.append(nxt)
        node = nxt
        end = shape(nxt)
        if len(end) == len(start) and all(same_size(a, b) for a, b in zip(end, start)):
            return chain
    return []


def _reaches_pv(node: Node, steps: int = 4) -> bool:
    """Whether `node` flows, one user at a time (at most `steps`), into the first operand of a matmul: weights that
    reach an `@ v` through steps this matcher does not take."""
    for _ in range(steps):
        nxt = single_user(node)
        if nxt is None:
            return False
        if MATMUL(nxt):
            return nxt.args[0] is node
        node = nxt
    return False


def _without_row_max(node: Node) -> tuple[Node, list] | None:
    """(x, the shift's nodes) when node is x - max(x, -1, keepdim=True) (`.max(...).values`, `[0]` or `amax`): the
    shift a softmax makes itself, which changes none of its values."""
    if not SUB(node) or not isinstance(node.args[0], Node) or not isinstance(node.args[1], Node):
        return None
    x, row_max = node.args
    shift = [row_max]
    if GETITEM(row_max) and row_max.args[1] == 0 and MAX(row_max.args[0]):
        shift.append(row_max.args[0])
    elif not AMAX(row_max):
        return None
    reduce = shift[-1]
    dim = arg(reduce, 1, "dim", None)
    if reduce.args[0] is not x or not arg(reduce, 2, "keepdim", False) or not isinstance(dim, int) \
            or normalize_dim(dim, len(shape(x))) != len(shape(x)) - 1:
        return None
    if set(x.users) != {node, reduce} or any(len(n.users) != 1 for n in shift):
        raise Decline(f"an intermediate ({x.name}) is also used outside the attention")
    return x, shift


def _drops_last_key(node: Node, ndim: int, keys) -> bool:
    """Whether node is x[..., :-1] (or :Sk, with the leading dims written out) of an ndim-dim x with keys + 1 columns."""
    if not GETITEM(node) or not isinstance(node.args[1], tuple) or not node.args[1]:
        return False
    *lead, last = node.args[1]
    whole = slice(None, None, None)
    if lead != [Ellipsis] and lead != [whole] * (ndim - 1):
        return False
    return isinstance(last, slice) and last.start in (None, 0) and last.step in (None, 1) and (
        last.stop == -1 or (isinstance(last.stop, int) and same_size(last.stop, keys)))


@dataclass
class Sink:
    """cat([scores, column], -1) before the softmax (optionally minus its row max), the column dropped after it."""

    scores: Node
    column: Node  # [..., Sq, 1]: a logit a query row (GPT-OSS: a learned one a head, expanded)
    cat: Node
    nodes: list  # the cat, the shift, the drop


def _sink(softmax: Node, shifted: tuple[Node, list] | None) -> Sink | None:
    """The attention sink around a softmax (`Sink`), None where there is none; `shifted`: the softmax's input without
    its row-max shift (`_without_row_max`)."""
    drop = single_user(softmax)
    node, nodes = softmax.args[0], []
    if shifted is not None:
        nodes += [node, *shifted[1]]
        node = shifted[0]
    if CAST(node) and value(node).dtype.is_floating_point and single_user(node) is not None:  # Inkling 2's .float()
        nodes.append(node)
        node = node.args[0]
    if not CAT(node) or len(arg(node, 0, "tensors")) != 2 or drop is None:
        return None
    scores, column = arg(node, 0, "tensors")
    ndim = len(shape(node))
    dim = arg(node, 1, "dim", 0)
    if not isinstance(dim, int) or normalize_dim(dim, ndim) != ndim - 1 or not isinstance(column, Node) \
            or shape(column)[-1] != 1 or not _drops_last_key(drop, ndim, shape(scores)[-1]):
        return None
    return Sink(scores, column, node, nodes + [node, drop])


@dataclass
class ScaleSink:
    """out * sigmoid(logsumexp(s, -1) - column)[..., None] after p @ v: an attention sink written as the scale it puts
    on each row (Granite SWA), column [..., 1] (a logit a head) or anything `lse` broadcasts with."""

    logsumexp: Node
    column: Node
    output: Node  # the scaled out
    nodes: list


def _scale_sink(scores: Node, pv: Node) -> ScaleSink | None:
    """The sink-as-a-scale around the scores (the softmax's input) and p @ v (`ScaleSink`), None where there is none."""
    lse = [u for u in scores.users if LOGSUMEXP(u)]
    if len(lse) != 1 or arg(lse[0], 2, "keepdim", False) is not False:
        return None
    lse, ndim = lse[0], len(shape(scores))
    dim = arg(lse, 1, "dim", None)
    dim = dim[0] if isinstance(dim, (list, tuple)) and len(dim) == 1 else dim
    sub = single_user(lse)
    if not isinstance(dim, int) or normalize_dim(dim, ndim) != ndim - 1 or not SUB(sub) or sub.args[0] is not lse \
            or not isinstance(sub.args[1], Node) or len(shape(sub.args[1])) > ndim - 1:
        return None
    nodes, node, seen_sigmoid = [lse, sub], sub, False
    while (node := single_user(node)) is not None and (
            CAST(node) and value(node).dtype.is_floating_point or SIGMOID(node) and not seen_sigmoid or
            UNSQUEEZE(node) and seen_sigmoid):
        if UNSQUEEZE(node) and normalize_dim(arg(node, 1, "dim"), ndim) != ndim - 1:
            return None
        seen_sigmoid |= SIGMOID(node)
        nodes.append(node)
    weight = nodes[-1]
    if node is None or not MUL(node) or set(node.args) != {pv, weight} or set(pv.users) != {node} \
            or sum(UNSQUEEZE(n) for n in nodes) != 1 or len(shape(node)) != len(shape(pv)) \
            or not all(same_size(a, b) for a, b in zip(shape(node), shape(pv))):
        return None
    return ScaleSink(lse, sub.args[1], node, nodes + [node])


def match_handwritten(softmax: Node, constants: dict, run_time_masks: bool = False, unproven: bool = False
                      ) -> attention.AttentionCall | None:
    """The attention around a softmax node, None if the softmax is not attention at all. `run_time_masks`: an
    additive mask the graph cannot prove is taken as one whose values are known at run time only (`mask_flags`);
    `unproven`: every mask is, without a proof being tried."""
    matched = [softmax]
    probs = softmax
    dropout_p = 0.0
    shifted = _without_row_max(softmax.args[0])
    sink = _sink(softmax, shifted)
    if sink is not None:
        matched += sink.nodes
        probs = sink.nodes[-1]
    while True:
        users = list(probs.users)
        pv = [u for u in users if MATMUL(u) and u.args[0] is probs]
        if pv:
            if len(users) != 1:
                raise Decline("the attention weights are also used outside the attention (output_attentions?)")
            break
        round_trip = _reshape_round_trip(probs)
        if round_trip:
            matched += round_trip
            probs = round_trip[-1]
            continue
        nxt = single_user(probs)
        if nxt is None or not (CAST(nxt) or DROPOUT(nxt)):
            if nxt is not None and _reaches_pv(nxt):
                raise Decline(f"{describe_node(nxt)} between the softmax and its @ v is not understood")
            return None
        if DROPOUT(nxt) and not _dropout_is_noop(nxt):
            p = arg(nxt, 1, "p", 0.5)
            if not isinstance(p, float) or dropout_p:  # a symbolic p, or a second dropout
                raise Decline(f"dropout p={p} in training")
            dropout_p = p
        matched.append(nxt)
        probs = nxt
    output = pv[0]
    v = output.args[1]
    scale_sink = None if sink else _scale_sink(softmax.args[0], output)
    if scale_sink is not None:
        matched += scale_sink.nodes

    dim = arg(softmax, 1, "dim", None)
    ndim = len(shape(softmax))
    if not isinstance(dim, int) or normalize_dim(dim, ndim) != ndim - 1:
        raise Decline(f"softmax over dim {dim}, not the key dim")

    # Walking up from the softmax meets the steps in reverse: masks, then the softcap, then scales.
    scale, softcap, band, hidden_scores, masks, additive = 1.0, 0.0, Band(), [], [], None
    node, consumer = (sink.scores, sink.cat) if sink else (softmax.args[0], softmax)
    also, also_of = (scale_sink.logsumexp, softmax) if scale_sink else (None, None)  # the one other reader allowed
    if not sink and not scale_sink and shifted is not None:  # MiMo-V2's layers
        _only_feeds(node, consumer)
        matched += [node, *shifted[1]]
        also, also_of, consumer, node = shifted[1][-1], node, node, shifted[0]
    scores_shape = shape(node)
    softmax_rounds = _softmax_dtype(softmax) is not None
    while not MATMUL(node):
        _only_feeds(node, consumer, also=also if consumer is also_of else None)
        matched.append(node)
        consumer = node
        if CAST(node):
            softmax_rounds = softmax_rounds or not masks
            node = node.args[0]
        elif (capped := _softcap(node)) is not None:
            if softcap or scale != 1.0:
                raise Decline("a softcap applied twice or before a scale")
            node, softcap, inner = capped
            matched += inner
            consumer = inner[-1]
        elif (found := _constant_factor(node)) is not None:
            node, c = found
            scale *= attention.positive_scale(c)
        elif MASKED_FILL(node) or WHERE(node) or ADD(node) or IN_PLACE_ADD(node):
            if softcap:
                raise Decline("a mask applied before the softcap")
            step = node
            try:
                node, mask, visible, hidden = _strip_mask(node, constants, scores_shape, run_time_masks, unproven)
            except attention.AdditiveInput as e:
                if scale != 1.0:
                    raise Decline(f"{e}, scaled by {scale:g} after it is added: the op and SDPA add a mask unscaled")
                additive = e
                node, mask, visible, hidden = e.scores, e.mask, Band(), None
            hidden = _scaled_fill(hidden, scale, value(step).dtype)
            if hidden is not None and hidden > HIDING_FILL:
                raise Decline(f"mask not recognized: its fill, scaled by {scale:g} after it, is {hidden:g}, above "
                              f"{HIDING_FILL:g}: it does not hide keys")
            masks.append((mask, step))
            try:
                band &= visible
            except MaskNotUnderstood as e:
                raise Decline(f"mask not recognized: {e}") from None
            hidden_scores.append((hidden, MASKED_FILL(step) or WHERE(step)))
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
    if additive is not None and len(masks) > 1:
        raise Decline(str(additive))  # one mask, added as it is
    if additive is not None and value(q).dtype == torch.float64 and value(softmax).dtype != torch.float64:
        raise Decline(f"{additive}; the softmax of its float64 scores runs in {value(softmax).dtype}, whose cast "
                      "absorbs large negative scores that the op, in float64, would not")
    autocast = attention.check_kernel_support(q, k, v, output)
    flags, seqused_k, keys = attention.flags_for(band, scores_shape)
    if softcap:
        flags["softcap"] = softcap
    if scale_sink is not None:
        sink, output = scale_sink, scale_sink.output
    return attention.AttentionCall(q, k, v, output=output, scale=scale, flags=flags, matched=matched + [output],
                         seqused_k=seqused_k, padding=keys, autocast=autocast,
                         blind_rows="zeros" if sink else _blind_rows(hidden_scores, value(softmax).dtype),
                         sink=sink.column if sink else None,
                         masks=[(m, use) for m, use in masks if isinstance(m, Node)],
                         additive_input=additive.mask if additive else None, additive_reason=str(additive or ""),
                         softmax_rounds=softmax_rounds, dropout_p=dropout_p)


def _softmax_dtype(softmax: Node):
    """The dtype a softmax call casts its input to (`dtype=`, or positional: F.softmax's fourth argument,
    torch.softmax's and Tensor.softmax's third), or None."""
    if softmax.kwargs.get("dtype") is not None:
        return softmax.kwargs["dtype"]
    return next((a for a in softmax.args[2:] if isinstance(a, torch.dtype)), None)


def _scaled_fill(hidden: float | None, scale: float, dtype) -> float | None:
    """A masking step's hidden score times the scale applied after it, as the scores' dtype holds it: -inf past its
    range (finfo.min times 2 is -inf in eager)."""
    if hidden is None:
        return None
    scaled = hidden * scale
    return -math.inf if dtype.is_floating_point and abs(scaled) > torch.finfo(dtype).max else scaled


def _blind_rows(hidden_scores: list, softmax_dtype) -> str:
    """What eager gives a query row that sees no key (`attention.blind_rows_of`), from each masking step's (hidden
    score as the softmax meets it, `_scaled_fill`; whether the step overwrites the scores it hides). Steps that all
    overwrite with one value (masked_fill, where: lucidrains-style padding then causal fills) leave every hidden
    score that value, as one step would; such a row's mean of V is "filled mean": the fill passes no gradient to q
    and k, where an added finfo.min does."""
    if any(not overwrites and attention.keeps_scores(h) for h, overwrites in hidden_scores):
        return "nan"
    values = {h for h, _ in hidden_scores}
    overwritten = bool(hidden_scores) and all(overwrites for _, overwrites in hidden_scores)
    steps = [hidden_scores[0][0]] if overwritten and len(values) == 1 else [h for h, _ in hidden_scores]
    rows = attention.blind_rows_of(steps, sdpa=False, softmax_dtype=softmax_dtype)
    return "filled mean" if rows == "mean" and overwritten else rows


def _strip_mask(node: Node, constants, scores_shape, run_time_masks: bool = False, unproven: bool = False
                ) -> tuple[Node, object, Band, float | None]:
    """(scores, mask, visible band, hidden keys' score) for a masking step: masked_fill, where(cond, scores,
    fill) or scores + mask."""
    if MASKED_FILL(node):
        mask = node.args[1]
        return node.args[0], mask, *attention.mask_flags("masked_fill", mask, constants, scores_shape,
                                                          arg(node, 2, "value"), unproven=unproven)
    if WHERE(node):
        if len(node.args) != 3 or not isinstance(node.args[1], Node):
            raise Decline(f"{node.format_node()} is not where(mask, scores, fill)")
        mask = node.args[0]
        return node.args[1], mask, *attention.mask_flags("where", mask, constants, scores_shape, node.args[2],
                                                          unproven=unproven)
    errors, additive = [], None
    for scores, mask in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
        if not isinstance(scores, Node):
            continue
        try:
            return scores, mask, *attention.mask_flags("additive", mask, constants, scores_shape,
                                                       run_time_masks=run_time_masks, unproven=unproven)
        except attention.AdditiveInput as e:
            e.scores = scores
            additive = additive or e
        except Decline as e:
            errors.append(str(e))
    if additive is not None:
        raise additive
    raise Decline(errors[0] if errors else f"{node.format_node()} adds no tensor")


def _rewrite(node: Node, context: Context) -> str | None:
    einsum.around(node, context.fake_mode)
    return attention.rewrite_or_retry(
        lambda run_time_masks, unproven: match_handwritten(node, context.constants, run_time_masks, unproven), context)


FAMILY = Family("handwritten", TORCH_IR, SOFTMAX, _rewrite)
