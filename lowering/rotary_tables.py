"""Rotary tables computed once: the cos / sin a transformer's rotary embedding computes once per forward and every layer
reads, made `fa4::computed_once` so that Inductor writes each table to a buffer once:

    emb = cat(freqs, freqs)          [B, S, D] float32
    cos = emb.cos() * scaling        a trigonometric function, then any number of multiplications by numbers,
    cos = cos.to(bfloat16)           negations and dtype conversions: the table
    layer i: q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)     read by two or more consumers (via views)

Left to itself Inductor inlines the table into every consumer, which then evaluates cos and sin for each element of
q and k of every layer (H times per table element and layer), forward and backward; on the H200 that made the
rotary kernels of Llama-1B's training step ~3x their memory time (docs/benchmarks.md, session 32: 2.3-2.6 ms of a
57 ms step). The tables are small ([B, S, D]); a table read by one consumer, or of fewer than MIN_ELEMENTS elements,
stays as it is.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..kernels import COMPUTED_ONCE
from .graph_edit import NodeMaker
from .spellings import (CAST, COS, DIV, EXPAND, GETITEM, MUL, NEG, PERMUTE, RESHAPE, SAME_VALUES, SIN, TRANSPOSE,
                        UNSQUEEZE, value)

VIEWS = (UNSQUEEZE, RESHAPE, EXPAND, TRANSPOSE, PERMUTE, SAME_VALUES, GETITEM)
MIN_ELEMENTS = 4096
"""Smaller tables (a decode step's [B, 1, D]) stay inlined: there the recomputation is a few instructions, and the
table's own kernel would be one more launch."""


def compute_once(gm: GraphModule, fake_mode) -> int:
    """Put `fa4::computed_once` after every rotary table of the graph (above) read by two or more consumers; returns
    how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if not (COS(node) or SIN(node)):
            continue
        table = node
        while len(table.users) == 1 and _elementwise_step(next(iter(table.users)), table):
            table = next(iter(table.users))
        if _consumers(table, limit=2) < 2 or _elements(table) < MIN_ELEMENTS:
            continue
        with gm.graph.inserting_after(table):
            once = NodeMaker(gm.graph, table, fake_mode)(COMPUTED_ONCE, table)
        table.replace_all_uses_with(once, delete_user_cb=lambda user: user is not once)
        done += 1
    if done:
        register_inductor_lowering()
    return done


def _elementwise_step(user: Node, table: Node) -> bool:
    """`user` computes from `table` alone (numbers and dtypes aside), element by element."""
    others = [a for a in (*user.args, *user.kwargs.values()) if a is not table]
    if MUL(user) or DIV(user):  # by a number, or one the graph reads at run time (`dynamic=True`: a float attribute)
        return len(others) == 1 and isinstance(value(others[0]), (int, float, torch.SymInt, torch.SymFloat))
    if CAST(user) or NEG(user):
        return all(isinstance(a, torch.dtype) for a in others)
    return False


def _elements(node: Node) -> int:
    """The table's element count (a symbolic one: its value for the inputs being compiled; 0 where unknown)."""
    example = value(node)
    count = example.numel() if isinstance(example, torch.Tensor) else 0
    return count if isinstance(count, int) else count.node.hint or 0


def _consumers(node: Node, limit: int) -> int:
    """How many nodes read `node`'s elements, looking through views (counting stops at `limit`)."""
    count = 0
    for user in node.users:
        view = any(spelled(user) for spelled in VIEWS) and user.args[0] is node
        count += _consumers(user, limit - count) if view else 1
        if count >= limit:
            break
    return count


def register_inductor_lowering() -> None:
    """Inductor lowers `fa4::computed_once(x)` to x's buffer, realized: consumers load from it, no copy is made."""
    from torch._inductor import lowering

    if COMPUTED_ONCE in lowering.lowerings:
        return

    @lowering.register_lowering(COMPUTED_ONCE, type_promotion_kind=None)
    def _computed_once(x):
        x.realize()
        return lowering.clone(x)  # a view of the buffer Inductor inlines as a load, so x itself is never aliased
