"""Decode and chunked prefill over a KV cache: the cache length as `fa4::attention`'s seqused_k.

With a cache, queries sit at run-time positions start + i (i < Sq) and the keys are the whole cache
(Sk = its capacity). masks.py proves the mask is a band in j - (start + i) (a `Shift`):

    HF (StaticCache, masking_utils):  q_pos = arange(Sq) + cache_offset   (a 0-d tensor)
                                      mask  = kv_pos[None, None, None, :] <= q_pos[None, None, :, None]
    gpt-fast (KVCache):               mask  = causal_mask[None, None, input_pos]   (a tril buffer)

and the cache writes (`k_cache.index_copy_(2, cache_position, k)`, `k_cache[:, :, input_pos] = k`)
stay as written, in place, before the attention reads the cache. The replacement:

    fa4::attention(q, k_cache, v_cache, seqused_k=(start + Sq).expand(B), causal=True, window_left=...)

is exact: bottom-right alignment puts row i's diagonal at key seqused_k - Sq + i = start + i, and
keys from seqused_k on (unwritten slots) are hidden by the mask in eager too. K/V repetition
feeding it is folded (gqa.py), so the cache is read once per KV head.

`start` is read where the mask reads it: HF advances its offset in place (`cumulative_length.add_`)
before the layers run, so it is copied at its definition. gpt-fast's `input_pos` is a tensor of
positions: start = input_pos[0], with a run-time check that it counts up by one (skipped when Sq is 1).
Not rewritten: a band with no upper bound at run-time positions (keys past the cache position visible), and
positions held in tensors over keys that no indexed write in the graph fills (not a cache: nothing bounds
the positions to the keys; their masks reach the op read at run time instead where they have that form,
`attention.rewrite_or_retry`). Over a written cache an in-graph check still refuses a mask whose positions
leave the keys (HF advances each layer's offset separately; they agree in every real call).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from .spellings import shape, value

NOT_CONSECUTIVE = ("fa4_inductor: the query positions indexing the causal mask do not count up by one; "
                   "this graph was compiled for consecutive cache positions.")


def snapshot(make, pos: Node, vector: bool):
    """A run-time position as a value fixed where it is defined (a later in-place update of the offset must
    not reach it): a 0-d tensor is copied, a SymInt is immutable, a position vector gives its first entry."""
    if not vector:
        return make("clone", pos, name="cache_start") if isinstance(value(pos), torch.Tensor) else pos
    if not (isinstance(shape(pos)[0], int) and shape(pos)[0] == 1):
        later, earlier = make(operator.getitem, pos, slice(1, None)), make(operator.getitem, pos, slice(None, -1))
        steps = make(operator.sub, later, earlier)
        make(torch._assert_async, make("all", make(operator.eq, steps, 1)), NOT_CONSECUTIVE)
    return make(operator.getitem, pos, 0, name="cache_start")


OUTSIDE_THE_KEYS = ("fa4_inductor: the query positions put a query before the first key or its band past the last "
                    "one (a cache position below 0 or beyond the cache); this graph was compiled for positions "
                    "inside the keys.")


def seqused_k(make, start, key_start, top: int, q: Node, k: Node) -> Node:
    """[B] int32 keys in use: start - key_start + Sq + top for every sequence (None is 0).

    Exact only for Sq <= that <= Sk (every query sees a key, no band runs past the last key: a KV cache's
    positions); checked at run time when the positions are a tensor (attention.py guards symbolic ones)."""
    b, _, sq, _ = shape(q)
    sq_node = sq if isinstance(sq, int) else make("size", q, 2)
    used = sq + top if isinstance(sq, int) else make(operator.add, sq_node, top)
    b = b if isinstance(b, int) else make("size", q, 0)
    used = used if start is None else make(operator.add, start, used)
    if key_start is not None:
        used = make(operator.sub, used, key_start)
    if isinstance(value(used), torch.Tensor):
        sk = shape(k)[2] if isinstance(shape(k)[2], int) else make("size", k, 2)
        inside = make(operator.and_, make(operator.ge, used, sq_node), make(operator.le, used, sk))
        make(torch._assert_async, make("all", inside), OUTSIDE_THE_KEYS)
        return make("contiguous", make("expand", make("to", used, torch.int32), b), name="seqused_k")
    return make(torch.full, (b,), used, dtype=torch.int32, device=value(q).device, name="seqused_k")
