"""`fa4::key_mask(mask, *, additive=False) -> Tensor`: `mask != 0` as a new contiguous boolean tensor, the key mask
the attention ops take (lowering/padding.py emits one per padding mask of a graph); with `additive`, a new contiguous
copy of the mask in its own dtype (eager attention code's float mask input, which the op adds to the scores).

It is an op of its own for `attention.key_mask_form`, which reads a key mask's contents on the host once and
remembers them by the tensor's identity and version. Inductor writes the buffers it allocates with its own kernels
(no version bump), recomputes a cheap pointwise value once per consumer, and hands a freed buffer to the next value
of its size: a mask it computed could come back under one identity with other contents, or under a new identity
every layer (one host read each). A tensor this op returns is allocated by the op, Inductor never writes into it,
and every attention of the graph gets that same tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import library

library.define("key_mask(Tensor mask, *, bool additive=False) -> Tensor")


def key_mask(mask: Tensor, *, additive: bool = False) -> Tensor:
    return mask.clone(memory_format=torch.contiguous_format) if additive else (mask != 0).contiguous()


def _key_mask_fake(mask: Tensor, *, additive: bool = False) -> Tensor:
    return mask.new_empty(mask.shape, dtype=mask.dtype if additive else torch.bool)


REBASED_ROW_MAX = (-2.0 ** 40, -128.0)
"""The range (open below, closed above) of a row's largest value in which `rebased_additive_mask` rebases the row.
Above it float32 keeps a score's digits down to 2^-16 next to the mask, and rebasing could round a value of a row
that mixes small ones. Below it float64 itself absorbs a score's digits (at finfo.min eager's hidden keys absorb them
in every dtype: a uniform row), and so must the op."""


def rebased_additive_mask(mask: Tensor) -> Tensor:
    """An additive mask [..., Sk] with each row less its largest value m where m lies in `REBASED_ROW_MAX`:
    softmax(scores + mask) is the same function of the scores, and the op's float32 sum keeps their digits. A row
    whose every key eager code adds -1e9 to (a query that sees no key) is, in float64, the softmax of its scores;
    next to -1e9 float32's ulp of 64 absorbs them in steps of 64 (bfloat16's absorbs them all: a uniform row), a
    third answer, dq of such a row 5x eager's error from float64. The values of the row within [2m, m] come out
    exact in the mask's dtype (Sterbenz); lower ones, which weigh below e^-128 of the row's largest, are rounded."""
    largest = mask.amax(-1, keepdim=True)
    low, high = REBASED_ROW_MAX
    return mask - torch.where((largest > low) & (largest <= high), largest, torch.zeros_like(largest))


library.impl("key_mask", key_mask, "CompositeExplicitAutograd")
library.register_fake("key_mask", _key_mask_fake)
