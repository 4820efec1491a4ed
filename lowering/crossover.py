"""Small attentions in host-bound graphs stay on PyTorch's SDPA, where default torch.compile runs them.

What is small, and why SDPA wins there, is the kernels' fact (`kernels/crossover.py`, measured): a
graph whose GPU work per layer is small is host-bound, and would run slower than under default
torch.compile with the op's host path in every layer.

Where the GPU work per attention is large (a graph's matmul and attention GFLOP per attention candidate
at or over LAYER_GFLOP_HOST_BOUND), host time hides behind it and the op stays (FA4's GPU time is the
lower, or within ~10%, on every measured row). Only on CUDA, self-attention (Sq == Sk, what was measured),
and no KV cache (the op reads it un-repeated, where SDPA code repeats K/V at every step; HF's generate passes
a decode step's cache as keys under a padding mask, Sq < Sk). Symbolic sizes are decided for the call being
compiled, under a guard (`small_attention`).

A decode step (a few queries over a KV cache) is a read of bytes, not FLOP: its SDPA call stays as the model makes it
where the graph moves little per attention (`small_decode`, `DECODE_MIB_HOST_BOUND`), and goes to the op, which
reads K/V un-repeated, elsewhere, but at a head dim the split-KV decode kernel does not take, where any decode step
stays as written (`unsplit_decode`).

An SDPA call is kept as written, whatever its mask (the sweep's padded small-model prefill ran 0.55x on the
op: the padding mask's form is read on the host, a sync), unless the mask is proven to be at most a causal
band (`mask_is_at_most_causal`). A small one with a padding mask is, in any graph: the op would run it on its SDPA
fallback without reading the mask (a bias built, K/V repeated), 0.77x the call as written in the Llama-1B shape's
batch 8 x 512 left-padded prefill. Such a call, and a hand-written one without a mask other than a causal
square band or a softcap, becomes the SDPA call that computes it without the mask (`is_causal`, the matched
scale, K/V as the model gives them), which default compile would not find on its own. A hand-written one with a
padding mask becomes SDPA with its mask as it is where SDPA computes the same (`mask_to_pass`: HF's eager code,
an additive mask with a finite fill added last, not in training), the op's otherwise.

A hand-written attention's padded training (HF's eager code: the op, then `blind_rows_as_eagers` for eager's gradient
through the rows that see no key) stays as written under `PADDED_TRAINING_MIN_KEYS` keys (`short_padded_training`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..kernels import crossover as kernel_crossover
from ..kernels import decode as kernel_decode
from ..kernels import switches as kernel_switches
from ..kernels.key_mask import rebased_additive_mask
from ..kernels.sdpa_fallback import floor_additive
from . import gqa, int8_kv
from .spellings import (ADD, ADDMM, CAST, INT4PACK_MM, LINEAR, MATMUL, MM, SCALED_MM, SDPA, SOFTMAX, arg, guardable,
                        shape, size_hint, value)

DEVICES = ("cuda",)  # where the op's host path is the cost (tests add "cpu")
# Below this much GPU work per attention a graph's host time is not hidden: HF models carry ~1 ms of host
# time per forward at two layers (the size sweep's hidden-256 Llama was host-bound at 84 GFLOP per attention; the
# hidden-2048 Llama's batch 8 x 128 prefill, ~125 GFLOP per attention, ran 0.96x on the op and 1.06x on SDPA at 4
# layers, 1.01x and 1.07x at 16: session 25, H200).
LAYER_GFLOP_HOST_BOUND = 150.0
# A decode step is a read of weights and K/V, not FLOP. Below this many bytes per attention (matmul weights and the
# SDPA call's K/V, each the whole buffer) its layers take microseconds of GPU time, and SDPA as written beat the op
# in the size sweep's hidden-256 Llama (2 layers, ~35 MiB of weights an attention, its 128k-vocab lm_head included;
# 0.84-0.89x without CUDA graphs, 0.94-1.01x with them, session 18), where a Llama-1B shape (~150 MiB an attention)
# decodes faster on the op (our decode kernel reads K/V un-repeated).
DECODE_MIB_HOST_BOUND = 64.0
DECODE_MAX_QUERIES = 16
# Hand-written attention's padded training (HF's eager code) on the op, with `blind_rows_as_eagers` after it, ran a
# Llama-1B-shaped step at 4 x 1024 in 78 ms against default compile's 70 (session 25, H200); eager's attention costs
# little at that length, and the kept graph is what default compile runs. Below this many keys it stays as written.
PADDED_TRAINING_MIN_KEYS = 2048


attention_gflop, gflop_limit = kernel_crossover.attention_gflop, kernel_crossover.gflop_limit


class GraphWork(NamedTuple):
    """What a graph asks of the GPU, counted before any rewrite (sizes as they are: symbolic ones give expressions)."""

    flop: object  # matmul and attention FLOP (hand-written attention counts through its matmuls)
    bytes: object  # the matmuls' weights (`matmul_work`) and each SDPA call's K and V, whole buffers
    attentions: int  # attention candidates: SDPA calls and softmaxes


def graph_work(graph, shared: dict) -> GraphWork | None:
    """The graph's `GraphWork`, computed once per graph (in `shared`, before the first rewrite changes the graph);
    None when it has no attention candidate."""
    if "graph_work" not in shared:
        flop, nbytes, attentions = 0, 0, 0
        for node in graph.nodes:
            try:
                if SDPA(node):
                    attentions += 1
                    q, k = shape(node.args[0]), shape(node.args[1])
                    flop = flop + 4 * math.prod(q) * k[-2]
                    nbytes = nbytes + sum(math.prod(shape(t)) * value(t).element_size() for t in node.args[1:3])
                elif SOFTMAX(node):
                    attentions += 1
                elif (work := matmul_work(node)) is not None:
                    flop, nbytes = flop + work[0], nbytes + work[1]
            except (TypeError, AttributeError, IndexError, KeyError):
                continue  # an operand without an example value, or a call spelled otherwise
        shared["graph_work"] = GraphWork(flop, nbytes, attentions) if attentions else None
    return shared["graph_work"]


def matmul_work(node) -> tuple | None:
    """(FLOP, weight bytes) of a matmul in the spellings models use, or None for another node: `matmul`, `bmm`, `@`,
    `linear`, `mm`, `addmm` (HF GPT-2's `Conv1D`), `torch._scaled_mm` (float8) and `_weight_int4pack_mm` (gpt-fast's
    int4). A 2-D right operand is a weight, its elements counted at the size of the output's: a quantized weight
    counts as the same model's unquantized one would, since the lines were measured on bf16 models and what the op
    saves at decode (SDPA's repeated K/V) does not shrink with the weights."""
    if INT4PACK_MM(node):
        x = arg(node, 0, "self")
        weight = shape(node)[-1] * shape(x)[-1]  # N x K, whatever the packed layout
    else:
        if ADDMM(node):
            x, b = arg(node, 1, "mat1"), arg(node, 2, "mat2")
        elif LINEAR(node):
            x, b = node.args[0], arg(node, 1, "weight")
        elif MATMUL(node) or MM(node) or SCALED_MM(node):
            x, b = node.args[0], arg(node, 1, "other" if MATMUL(node) else "mat2")
        else:
            return None
        weight = math.prod(shape(b)) if len(shape(b)) == 2 else 0
    return 2 * math.prod(shape(node)) * shape(x)[-1], weight * value(node).element_size()


def small_masked_training(call) -> str | None:
    """Why a training call whose mask is known at run time only stays as written, or None: on CUDA the op reads no
    form of a small attention's mask (`kernels/attention.py`, `_reads_mask_form`, sized as the causal attention over
    Sq keys), so it would run the masked SDPA forward and its float32 reference backward, slower than eager code."""
    q = value(call.q)
    if q.device.type not in DEVICES or len(shape(call.q)) != 4:
        return None
    b, h, sq, d = shape(call.q)
    if not guardable(b, h, sq, d) or not kernel_crossover.small(b, h, sq, sq, d, True):  # a guard if symbolic
        return None
    return (f"a small attention ({size_hint(attention_gflop(b, h, sq, sq, d, True)):.2g} GFLOP) in training with a "
            "mask known at run time only: the op would not read its form and would run its reference backward")


def small_attention(call, graph, shared: dict) -> str | None:
    """Why `call` (an attention.AttentionCall) runs faster on SDPA, or None. The graph's GPU work per
    attention (`graph_work`) is computed only when asked.

    Symbolic sizes (a dynamic graph) are decided for the sizes of the call being compiled, and the two
    comparisons guard the graph: a later call whose sizes fall on the other side of either line recompiles
    and gets the other answer (one more graph, not a slower one)."""
    q = value(call.q)
    if q.device.type not in DEVICES or len(shape(call.q)) != 4:
        return None
    if call.seqused_k is not None:
        return None  # a KV cache: `small_decode`'s case
    b, h, sq, d = shape(call.q)
    sk = shape(call.k)[-2]
    if not statically_known_true(sq == sk):
        return None  # measured on self-attention; a decode step over a cache (a key mask, not seqused_k) is not
    causal = bool(call.flags.get("causal"))
    if not is_sdpa_call(call) and hides_more_than_causal(call) and mask_to_pass(call) is None:
        return None  # the SDPA call a hand-written attention becomes computes no other mask
    if not guardable(b, h, sq, sk, d) or not kernel_crossover.small(b, h, sq, sk, d, causal):  # a guard if symbolic
        return None
    gflop = size_hint(attention_gflop(b, h, sq, sk, d, causal))
    head_dim = size_hint(d)
    small = f"a small attention ({gflop:.2g} GFLOP, under {gflop_limit(head_dim):g} at head dim {head_dim})"
    if call.padding is not None:
        return (f"{small} with a padding mask: the op would run it on its SDPA fallback, which builds a bias and "
                f"repeats K/V, where SDPA as the model calls it does less{_guarded(b, h, sq, d)}")
    work = graph_work(graph, shared)
    if work is None or not guardable(work.flop) or \
            not work.flop < int(LAYER_GFLOP_HOST_BOUND * 1e9) * work.attentions:  # a guard if symbolic
        return None
    layer_gflop = size_hint(work.flop) / work.attentions / 1e9
    return (f"{small} in a host-bound graph ({layer_gflop:.2g} GFLOP per attention): SDPA's C++ path has less host "
            f"overhead than the fa4 op{_guarded(b, h, sq, d, work.flop)}")


def _decode_step(call) -> bool:
    """Whether `call` is a decode step in inference: at most `DECODE_MAX_QUERIES` queries over a KV cache, on a device
    of `DEVICES`. Training is left out: a few queries over many keys there is cross-attention to a short target."""
    if value(call.q).device.type not in DEVICES or len(shape(call.q)) != 4 or call.in_training:
        return False
    sq, sk = shape(call.q)[-2], shape(call.k)[-2]
    if not (isinstance(sq, int) and sq <= DECODE_MAX_QUERIES):
        return False
    return call.seqused_k is not None or not statically_known_true(sq == sk)  # else `small_attention`'s case


def small_decode(call, graph, shared: dict) -> str | None:
    """Why a decode-shaped SDPA call (`_decode_step`) stays the SDPA call the model makes, or None: the graph moves
    under `DECODE_MIB_HOST_BOUND` MiB per attention (`graph_work`), so its host time is not hidden. A symbolic cache
    length (a DynamicCache) is decided for the call being compiled, under a guard, as in `small_attention`.
    Hand-written attention goes to the op (the SDPA call it would become reads its mask, which the op turns into
    seqused_k)."""
    if not is_sdpa_call(call) or not _decode_step(call):
        return None
    if any(int8_kv.dequantized(gqa.unrepeat(t).source) is not None for t in (call.k, call.v)):
        return None  # an int8 cache: the op reads it as int8, where SDPA reads it dequantized
    work = graph_work(graph, shared)
    if work is None or not guardable(work.bytes) or \
            not work.bytes < int(DECODE_MIB_HOST_BOUND * 2 ** 20) * work.attentions:  # a guard if symbolic
        return None
    per_attention = size_hint(work.bytes) / work.attentions / 2 ** 20
    return (f"a decode step in a host-bound graph ({per_attention:.2g} MiB of weights and K/V per attention, under "
            f"{DECODE_MIB_HOST_BOUND:g}): SDPA's C++ path has less host overhead than the fa4 op"
            f"{_guarded(work.bytes)}")


def unsplit_decode(call) -> str | None:
    """Why a decode step (`_decode_step`) whose head dim the split-KV decode kernel does not take
    (`kernels.decode.HEAD_DIMS`) stays as the model writes it, or None. The op would run it on FA4, which on sm90
    splits no KV: one CTA a head reads the whole cache. Phi-3's step (head dim 96, b1 over a 4k static cache) ran
    0.87x default compile so (docs/benchmarks.md, session 57, H100). Only where the decode kernel runs (sm90,
    `on_the_decode_kernels_arch`); elsewhere the op's route was not measured against default compile's."""
    d = shape(call.q)[-1]
    if not _decode_step(call) or d in kernel_decode.HEAD_DIMS or not on_the_decode_kernels_arch(value(call.q).device):
        return None
    return (f"a decode step at head dim {d}, which the split-KV decode kernel does not take: FA4 on sm90 splits no "
            "KV (a CTA a head over the whole cache), slower than the attention as written")


def on_the_decode_kernels_arch(device: torch.device) -> bool:
    return device.type == "cuda" and kernel_switches.capability(device.index)[0] == 9


def short_padded_training(call) -> str | None:
    """Why a hand-written attention's padded training step (`blind_rows_as_eagers` after the op) stays as written,
    or None: on CUDA, under `PADDED_TRAINING_MIN_KEYS` keys (a guard if symbolic)."""
    if value(call.q).device.type not in DEVICES or is_sdpa_call(call) or not call.in_training:
        return None
    sk = shape(call.k)[-2]
    if not guardable(sk) or not sk < PADDED_TRAINING_MIN_KEYS:  # a guard if symbolic
        return None
    return (f"a short attention in padded training ({size_hint(sk)} keys, under {PADDED_TRAINING_MIN_KEYS}): eager's "
            f"is cheap there, and the op with eager's gradient for rows that see no key ran slower than default "
            f"compile{_guarded(sk)}")


def _guarded(*sizes) -> str:
    if all(isinstance(n, int) for n in sizes):
        return ""
    return "; decided for this call's sizes, a guard recompiles for sizes past either line"


def sdpa_for(make, call) -> Node:
    """The SDPA call computing `call` (see `small_attention`), on K/V as the model feeds them (an SDPA call's
    `enable_gqa` kept): without a mask (at most `is_causal`), or with the hand-written one's additive mask
    (`mask_to_pass`) where it hides more than a causal band, a mask input's rows rebased as the op's
    (`_additive_on_op`)."""
    gqa = {"enable_gqa": True} if is_sdpa_call(call) and arg(call.output, 7, "enable_gqa", False) is True else {}
    if not is_sdpa_call(call) and hides_more_than_causal(call):
        mask = make(floor_additive, mask_to_pass(call), name="mask_floored")
        if call.rebases_mask_input:
            mask = make(rebased_additive_mask, mask, name="mask_rebased")
        return make(torch.nn.functional.scaled_dot_product_attention, call.q, call.k, call.v,
                    attn_mask=mask, scale=call.scale,
                    name="sdpa_small" if call.additive_input is None else "sdpa_mask_input")
    dropout = {"dropout_p": call.dropout_p} if call.dropout_p else {}
    return make(torch.nn.functional.scaled_dot_product_attention, call.q, call.k, call.v,
                is_causal=bool(call.flags.get("causal")), scale=call.scale, **gqa, **dropout, name="sdpa_small")


def mask_to_pass(call) -> Node | None:
    """A hand-written attention's mask that SDPA can take as it is, or None: the one mask, added to the scores as
    the last step before the softmax (casts aside), in q's dtype and with a finite fill (HF's eager code: a row
    that sees no key averages V, in eager and in SDPA alike once `sdpa_for` floors the mask (`floor_additive`):
    CUDA's kernels read bfloat16's finfo.min as -inf and zero such a row); no softcap; not in training, where such
    a row's gradient in eager still reaches q and k through its softmax and SDPA's backward does not give it (the op
    does, with `kernels.blind_rows_as_eagers` after it)."""
    if call.additive_input is not None:
        return call.additive_input
    if is_sdpa_call(call) or len(call.masks) != 1 or "softcap" in call.flags or call.blind_rows != "mean":
        return None
    if call.in_training:
        return None
    mask, step = call.masks[0]
    if not ADD(step) or value(mask).dtype != value(call.q).dtype:
        return None
    softmax = next((node for node in call.matched if SOFTMAX(node)), None)
    node = softmax.args[0] if softmax is not None else None
    while node is not None and CAST(node):
        node = node.args[0]
    return mask if node is step else None


def is_sdpa_call(call) -> bool:
    return SDPA(call.output)


def hides_more_than_causal(call) -> bool:
    """The call's mask hides more than a causal band: a padding mask, a window (or carries a softcap)."""
    return bool(set(call.flags) - {"causal"}) or call.padding is not None or call.additive_input is not None


def mask_is_at_most_causal(call) -> bool:
    """An SDPA call given a mask that the graph proves is none or a causal band (HF's mask for an unpadded
    batch, which default compile builds and reads at every layer): `sdpa_for` computes it without the mask."""
    return bool(call.masks) and call.seqused_k is None and not hides_more_than_causal(call)
