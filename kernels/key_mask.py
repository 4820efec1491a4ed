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


library.impl("key_mask", key_mask, "CompositeExplicitAutograd")
library.register_fake("key_mask", _key_mask_fake)
