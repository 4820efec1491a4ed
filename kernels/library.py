"""The `fa4` torch.library namespace: the one `Library` object every op file defines its ops in.

An op file (`attention.py`) calls `define` for each schema, then `impl` per dispatch key,
`register_fake` and `register_autograd` (`define_op`: the first three at once, for an op without autograd);
`kernels/__init__.py` imports the op files, which registers them. The ops use torch.library.Library rather
than custom_op: custom_op wraps every device kernel in Python layers (aliasing checks, a Dynamo-disable frame)
that cost more host time than the launch.
"""

from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "fa4"
LIB = torch.library.Library(NAMESPACE, "DEF")


def define(schema: str) -> None:
    """Declares `fa4::<schema>` (e.g. "attention(Tensor q, ...) -> (Tensor, Tensor)")."""
    LIB.define(schema)


def impl(op: str, fn: Callable, dispatch_key: str) -> None:
    LIB.impl(op, fn, dispatch_key)


def register_fake(op: str, fn: Callable) -> None:
    torch.library.register_fake(f"{NAMESPACE}::{op}", fn, lib=LIB)


def define_op(schema: str, reference: Callable, cuda: Callable, fake: Callable) -> None:
    """`define` an op, its reference for every device (CompositeExplicitAutograd), its CUDA kernel path and its fake."""
    op = schema.split("(")[0]
    define(schema)
    impl(op, reference, "CompositeExplicitAutograd")
    impl(op, cuda, "CUDA")
    register_fake(op, fake)


def register_autograd(op: str, backward: Callable, setup_context: Callable) -> None:
    torch.library.register_autograd(f"{NAMESPACE}::{op}", backward, setup_context=setup_context, lib=LIB)


MAX_SIBLINGS = 3


def check_siblings(op: str, per_weight: dict) -> None:
    """A sibling-linears op's per-weight lists (name -> list, the weights first): 2..MAX_SIBLINGS weights, one entry
    of each list per weight."""
    names = list(per_weight)
    count = len(per_weight[names[0]])
    if not 2 <= count <= MAX_SIBLINGS:
        raise ValueError(f"fa4::{op} takes 2..{MAX_SIBLINGS} weights, got {count}")
    if any(len(v) != count for v in per_weight.values()):
        raise ValueError(f"fa4::{op} takes one of each of {', '.join(names[1:])} per weight; got "
                         + ", ".join(f"{len(v)} {name}" for name, v in per_weight.items()))


def sibling_outputs(x: torch.Tensor, weights: list, outs=None) -> list:
    """A sibling-linears op's outputs, [..., N] for x [..., K] and each [N, ...] weight: `outs` ([M, N] each) viewed
    so, or new empty tensors (the fake)."""
    if outs is None:
        return [x.new_empty((*x.shape[:-1], w.shape[0])) for w in weights]
    return [out.view(*x.shape[:-1], out.shape[-1]) for out in outs]
