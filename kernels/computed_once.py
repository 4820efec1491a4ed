"""`fa4::computed_once(x) -> Tensor`: a copy of x that Inductor computes into a buffer of its own once, which every
consumer then reads (lowering/rotary_tables.py registers that Inductor lowering; elsewhere the op copies x).

Inductor inlines a cheap pointwise value into each consumer, and recomputes it there for every element the consumer
writes. For the rotary tables a transformer computes once per forward (`emb.cos()`, `emb.sin()`, [B, S, D]) and
every layer broadcasts over its heads, that is two transcendental functions per element of every layer's q and k,
forward and backward; read from a buffer, each is a load.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import library

library.define("computed_once(Tensor x) -> Tensor")


def computed_once(x: Tensor) -> Tensor:
    return x.clone()


def _computed_once_fake(x: Tensor) -> Tensor:
    return torch.empty_like(x)


library.impl("computed_once", computed_once, "CompositeExplicitAutograd")
library.register_fake("computed_once", _computed_once_fake)
library.register_autograd("computed_once", lambda ctx, grad: grad, setup_context=lambda ctx, inputs, output: None)
