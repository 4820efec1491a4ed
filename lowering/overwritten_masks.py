"""A fresh tensor written whole in place, as the value written: transformers 4's older `_update_causal_mask` (OPT,
BioGPT, Falcon, Nemotron, GPT-J, CodeGen in 4.57) clones its causal mask and writes the padded mask over all of it:

    mask = causal.clone()
    padded = mask[:, :, :, :L].masked_fill((mask[:, :, :, :L] + attention_mask[:, None, None, :]) == 0, min)
    mask[:, :, :, :L] = padded                      operator.setitem; L is the key length, so the slice is all of it
    ... attention reads mask ...

After the write every element of `mask` is `padded`'s, cast to mask's dtype. `overwrite` gives the later readers
that value (`padded.to(mask.dtype).expand(mask.shape)`) and removes the write, so the mask proofs read the masks
that built it. A write over part of the tensor (a cache longer than the mask), or one whose tensor is read through a
view taken before the write, stays as it is.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from .graph_edit import NodeMaker
from .spellings import equal_size, shape, value


def overwrite(gm: GraphModule, fake_mode) -> int:
    """Rewrite every whole write of a cloned tensor as above; returns how many were."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    done = 0
    for write in list(gm.graph.find_nodes(op="call_function", target=operator.setitem)):
        target, index, written = write.args
        if not _whole_write_of_a_clone(target, index, written, write, order):
            continue
        make = NodeMaker(gm.graph, write, fake_mode)
        with gm.graph.inserting_before(write.next):
            after = make("expand", make("to", written, value(target).dtype), *shape(target))
        for user in [u for u in target.users if order.get(u, len(order)) > order[write]]:
            user.replace_input_with(target, after)
        gm.graph.erase_node(write)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _whole_write_of_a_clone(target, index, written, write: Node, order: dict) -> bool:
    if not (isinstance(target, Node) and target.op == "call_method" and target.target == "clone"
            and isinstance(written, Node) and isinstance(value(written), torch.Tensor)):
        return False
    if not _covers(index, shape(target)):
        return False
    at = order[write]
    for user in target.users:
        if user is write:
            continue
        if order[user] < at and any(order.get(u, len(order)) > at for u in user.users):
            return False  # read (perhaps through a view) after the write: not redirected
        if order[user] > at and user.target is operator.setitem:
            return False  # written again
    return True


def _covers(index, sizes) -> bool:
    """Whether `x[index]` is all of x: one full slice per dim (a stop at or past the size)."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) != len(sizes):
        return False
    for entry, size in zip(index, sizes):
        if not isinstance(entry, slice) or entry.start not in (None, 0) or entry.step not in (None, 1):
            return False
        if entry.stop is not None and not (isinstance(entry.stop, int) and isinstance(size, int)
                                           and entry.stop >= size or equal_size(entry.stop, size)):
            return False
    return True
