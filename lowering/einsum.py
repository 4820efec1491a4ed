"""Two-operand einsums that are batched matrix products, written as the matmuls the attention matchers read:

    einsum("b h i d, b h j d -> b h i j", q, k)   ->  q @ k.mT
    einsum("qhmd,khmd->hmqk", q, k)               ->  q.permute(1, 2, 0, 3) @ k.permute(1, 2, 0, 3).mT
    einsum("hmqk,khmd->qhmd", p, v)               ->  (p @ v.permute(1, 2, 3, 0).mT).permute(2, 0, 1, 3)

Each operand holds the batch indices (in both operands and the output), one index of its own (in the output) and
the one contracted index. Anything else (an ellipsis, a repeated or summed-out index, other operand counts) stays
an einsum. The handwritten family rewrites the einsums next to a softmax this way before it matches (`around`):
the product is the same, and a softmax that is no attention keeps the matmuls.
"""

from __future__ import annotations

import operator
from collections import deque

import torch
from torch.fx import Node

from .graph_edit import NodeMaker
from .spellings import Spelling, shape, single_user

EINSUM = Spelling((torch.einsum, torch.functional.einsum))
SEARCH_DEPTH = 8  # nodes from the softmax to the scores' einsum (scale, mask, softcap, sink, casts)
PV_DEPTH = 4  # single users from the softmax to the weights' einsum with V (the sink's drop, dropout, casts)


def plan(equation: str, a_ndim: int, b_ndim: int) -> tuple[list, list, list] | None:
    """(a's permutation to [batch..., a's own, contracted], b's to [batch..., b's own, contracted], the product's
    permutation to the output's order) for a matmul-shaped equation, else None."""
    equation = equation.replace(" ", "")
    if "..." in equation or equation.count("->") != 1:
        return None
    inputs, out = equation.split("->")
    operands = inputs.split(",")
    if len(operands) != 2 or (len(operands[0]), len(operands[1])) != (a_ndim, b_ndim):
        return None
    a, b = operands
    if any(len(set(t)) != len(t) for t in (a, b, out)):
        return None
    contracted = [i for i in a if i in b and i not in out]
    batch = [i for i in out if i in a and i in b]
    own_a, own_b = [i for i in a if i not in b], [i for i in b if i not in a]
    if len(contracted) != 1 or len(own_a) != 1 or len(own_b) != 1 or \
            sorted(out) != sorted(batch + own_a + own_b) or len(a) != len(batch) + 2 or len(b) != len(batch) + 2:
        return None
    product = batch + own_a + own_b
    return ([a.index(i) for i in batch + own_a + contracted], [b.index(i) for i in batch + own_b + contracted],
            [product.index(i) for i in out])


def as_matmul(node: Node, fake_mode) -> Node | None:
    """Replace a matmul-shaped einsum node by permutes and a matmul (`plan`); the new output node, or None."""
    listed = len(node.args) == 2 and isinstance(node.args[1], (list, tuple))
    args = tuple(node.args[1]) if listed else node.args[1:]
    if node.kwargs or len(args) != 2 or not isinstance(node.args[0], str) or \
            not all(isinstance(t, Node) for t in args):
        return None
    a, b = args
    steps = plan(node.args[0], len(shape(a)), len(shape(b)))
    if steps is None:
        return None
    a_perm, b_perm, out_perm = steps
    graph = node.graph
    make = NodeMaker(graph, node, fake_mode)

    def permuted(t, perm):
        return t if perm == sorted(perm) else make("permute", t, *perm)

    with graph.inserting_before(node):
        product = make(operator.matmul, permuted(a, a_perm), make("transpose", permuted(b, b_perm), -2, -1))
        out = permuted(product, out_perm)
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    return out


def around(softmax: Node, fake_mode) -> None:
    """Rewrite the matmul-shaped einsums within SEARCH_DEPTH nodes above `softmax`, and the one its weights feed
    within PV_DEPTH single users, as matmuls (`as_matmul`)."""
    found, seen, queue = [], {softmax}, deque([(softmax, 0)])
    while queue:
        node, depth = queue.popleft()
        for source in node.all_input_nodes:
            if source not in seen and depth < SEARCH_DEPTH:
                seen.add(source)
                found += [source] if EINSUM(source) else []
                queue.append((source, depth + 1))
    node = softmax
    for _ in range(PV_DEPTH):
        node = single_user(node)
        if node is None:
            break
        if EINSUM(node):
            found.append(node)
            break
    for einsum in found:
        as_matmul(einsum, fake_mode)
