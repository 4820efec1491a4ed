"""Key-padding masks from a run-time `attention_mask` -> `fa4::attention(..., seqused_k)` or `(..., key_mask)`.

masks.py recognizes a [B, Sk] tensor m of visible keys read as a mask over the scores (`keys` of a Band):

    m.to(bool)[arange(B)[:, None, None, None], kv_positions]      HF masking_utils (then where / +)
    (1.0 - m[:, None, None, :]) * finfo.min                       BERT-style extended masks

Its values are data: nothing in the graph says whether m is right padding, left padding or holed.

By default (`attention._encode_padding`) the op takes the mask itself, `key_mask = m[:, start : start
+ Sk] != 0` (one per graph and key length), which hides keys on top of any band (causal, window, a
KV cache's length): exact for every mask. A query row whose keys are all hidden (a left-padded
position under a causal band, an all-padding sequence) gets what eager gives it: zeros for SDPA's
boolean or -inf masks (its safe softmax), the mean of V over all keys for a finfo.min mask applied in
one step (every score the same: `kernels.blind_rows_as_mean` after the op, `blind_rows_as_eagers` in
training); -inf in a hand-written softmax (NaN in eager) or several masking steps keep their mask, with
the reason. On CUDA, decode-shaped calls with a key
mask run on our decode kernel, the others on the SDPA fallback (FA4 takes no key mask).

`backend(checked_padding=True)` sends padding masks down FA4's fast paths, under one small in-graph
check each (an exception on CPU, a device-side assert on CUDA, which ends the process: hence opt-in):

- no band (encoders): seqused_k = m.sum(-1), with m checked to be right padding, first key visible
  (an all-padding row means uniform weights to eager and zeros to the kernel):

    torch._assert_async((m == 0 | m == 1).all() & (m[:, 1:] <= m[:, :-1]).all() & (m[:, 0] == 1).all())

  Queries at padded positions see the same keys as in eager, so every output row matches.
- a causal or window band (decoders: HF builds `causal & padding`): seqused_k would move the
  bottom-right-aligned diagonal, so the mask is dropped, which is exact only when it hides none of
  the keys the band shows (an unpadded batch, HF generate's all-ones mask padded to the cache length):

    torch._assert_async(((m != 0) | (arange(Sk)[None, :] >= seqused_k[:, None])).all())

  (`m != 0` everywhere when there is no cache).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from ..kernels import KEY_MASK
from ..kernels.key_mask import rebased_additive_mask
from .masks import KeyMask
from .spellings import same_size, value

NOT_RIGHT_PADDING = ("fa4_inductor: the attention mask is not right padding (1...1 0...0 per row, first key visible); "
                     "this graph was compiled for right-padded masks. "
                     "Compile without fa4_inductor.backend(checked_padding=True) for other masks.")


def seqused_k(make, m: Node) -> Node:
    """[B] int32 number of visible keys of the key mask m [B, Sk], after checking m is right padding."""
    binary = make("all", make(operator.or_, make(operator.eq, m, 0), make(operator.eq, m, 1)))
    rest = make(operator.getitem, m, (slice(None), slice(1, None)))
    head = make(operator.getitem, m, (slice(None), slice(None, -1)))
    descending = make("all", make(operator.le, rest, head))
    first = make("all", make(operator.eq, make(operator.getitem, m, (slice(None), 0)), 1))
    make(torch._assert_async, make(operator.and_, make(operator.and_, binary, descending), first), NOT_RIGHT_PADDING)
    return make("sum", make(operator.ne, m, 0), -1, dtype=torch.int32, name="seqused_k")


HIDES_VISIBLE_KEYS = ("fa4_inductor: the attention mask hides keys that the causal mask shows (a padded batch); "
                      "this graph was compiled for unpadded input. "
                      "Compile without fa4_inductor.backend(checked_padding=True) for padded batches.")


def check_hides_none(make, keys: KeyMask, seqused_k: Node | None) -> Node:
    """Check that the key mask is nonzero at every key position in use: below seqused_k (+ the key offset), or all."""
    m = keys.node
    visible = make(operator.ne, m, 0)
    if seqused_k is not None:
        bound = seqused_k if keys.start is None else make(operator.add, seqused_k, keys.start)
        positions = make(torch.arange, make("size", m, 1), device=value(m).device)
        unused = make(operator.ge, make(operator.getitem, positions, (None, slice(None))),
                      make(operator.getitem, bound, (slice(None), None)))
        visible = make(operator.or_, visible, unused)
    return make(torch._assert_async, make("all", visible), HIDES_VISIBLE_KEYS)


def key_mask(make, keys: KeyMask, k: Node) -> Node:
    """The op's key_mask [B, Sk] bool: key slot j of sequence b is visible when keys.node[b, start + j] != 0.
    A mask of one row for the batch, or of one column for every key, is broadcast as eager does. A mask per query
    row ([B or 1, 1, Sq, Sk], `_encode_padding` or `_additive_on_op` checked its sizes) gives the [B, Sq, Sk]
    key_mask, in the mask's dtype when it is additive. Always made by `fa4::key_mask` (kernels/key_mask.py says why),
    but for an additive [B, Sk] one (`additive_key_mask`), which the op never reads on the host."""
    start = 0 if keys.start is None else keys.start
    b, sk = (s if isinstance(s, int) else make("size", k, d) for d, s in ((0, value(k).shape[0]), (2, value(k).shape[2])))
    if keys.per_query:
        m = make(operator.getitem, keys.node, (slice(None), 0))
        if keys.rebased:
            m = make(rebased_additive_mask, m, name="mask_rebased")
        if not same_size(value(keys.node).shape[0], value(k).shape[0]):
            sq = value(m).shape[1]
            m = make("expand", m, b, sq if isinstance(sq, int) else make("size", m, 1), sk)
        return make(KEY_MASK, m, name="key_mask", **({"additive": True} if keys.additive else {}))
    if keys.additive:
        return additive_key_mask(make, keys, k)
    m = make(operator.getitem, keys.node, (slice(None), 0, 0)) if keys.plane else keys.node
    rows, columns = value(m).shape
    one_column = same_size(columns, 1) and keys.start is None and not same_size(value(k).shape[2], 1)
    window = m if one_column else make(torch.narrow, m, 1, start, sk)
    if one_column or not same_size(rows, value(k).shape[0]):
        window = make("expand", window, b, sk)
    return make(KEY_MASK, window, name="key_mask")


def additive_key_mask(make, keys: KeyMask, k: Node) -> Node:
    """The op's additive key_mask from a float mask as eager code adds it to [B, H, Sq, Sk] scores
    ([B or 1, 1, 1, Sk]): [B, Sk] in its dtype, rebased with `keys.rebased`."""
    m = make(operator.getitem, keys.node, (slice(None), 0, 0))
    if keys.rebased:
        m = make(rebased_additive_mask, m, name="mask_rebased")
    if not same_size(value(m).shape[0], value(k).shape[0]):
        b = value(k).shape[0]
        m = make("expand", m, b if isinstance(b, int) else make("size", k, 0), -1)
    return m


