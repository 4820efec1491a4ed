"""One-row matmuls that Inductor has already decomposed, seen again as the matmuls they are.

With `coordinate_descent_tuning` on (torchao's `quantize_` turns it on for the whole process, through its
configs' `set_inductor_config`), Inductor decomposes `mm(x, W)` whose x has one row known when compiling,
on CUDA, into a multiply and a sum before the post-grad stage, in float32 for half-precision operands:

    convert(x [1, K], f32) -> unsqueeze(., 2) ----.
                                                    mul -> sum(., [1]) [-> convert(., x.dtype)]   [1, N]
    convert(W [K, N], f32) -> unsqueeze(., 0) ----'

(no converts for float32 operands; torch 2.11 folds a model's cast of int8 codes to x's dtype into W's widening,
`Gemv.w_cast`). That is the matmul's arithmetic: products summed in float32, rounded
once to x's dtype. The quantized-linear families take `W` of `right_operand(node)` for their candidate test,
and rewrite under `as_matmul(node, context)`, which puts `mm(x, W)` in the decomposition's place while they
match, and puts the decomposition back if they decline (a declined linear keeps Inductor's code).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch.fx import Node

from .graph_edit import NodeMaker, erased
from .records import Decline
from .spellings import dtype_of, is_call, shape

aten, prims = torch.ops.aten, torch.ops.prims
CONVERT = prims.convert_element_type.default
MATMULS = (aten.mm.default, aten.addmm.default)
HALF = (torch.float16, torch.bfloat16)
CODES = (torch.int8, torch.uint8)


class Gemv(NamedTuple):
    x: Node  # [1, K]
    w: Node  # [K, N]
    nodes: list  # the decomposition, from its first node to its last (x and W excluded)
    w_cast: torch.dtype | None = None
    """x's dtype when W is an integer tensor the decomposition widens straight to float32: the matmul reads
    `convert(w, w_cast)` (torch 2.11 folds the model's cast of int8 codes to x's dtype into the widening; codes
    of at most 8 bits are exact in half precision, so it is the same arithmetic)."""


def _widened(node: Node, sources: tuple) -> bool:
    return is_call(node, CONVERT) and node.args[1] == torch.float32 and dtype_of(node.args[0]) in sources


def _from_float32(node: Node, nodes: list, sources: tuple = HALF) -> Node:
    """The tensor of a dtype in `sources` that `node` widens to float32, or `node` itself. The widening joins
    `nodes` unless something else reads it too (the one-row matmuls of q, k and v share x's)."""
    if _widened(node, sources):
        if len(node.users) == 1:
            nodes.append(node)
        return node.args[0]
    return node


def decomposed(end: Node) -> Gemv | None:
    """The decomposed one-row matmul ending at `end`, or None."""
    nodes = [end]
    total = end.args[0] if is_call(end, CONVERT) else end
    if total is not end:
        nodes.append(total)
    if not is_call(total, aten.sum.dim_IntList) or list(total.args[1]) != [1] or total.kwargs.get("keepdim") \
            or (len(total.args) > 2 and total.args[2]):
        return None
    product = total.args[0]
    if not is_call(product, aten.mul.Tensor) or len(product.users) != 1:
        return None
    a, b = product.args
    if not (is_call(a, aten.unsqueeze.default) and is_call(b, aten.unsqueeze.default)):
        return None
    if a.args[1] == 0 and b.args[1] == 2:
        a, b = b, a
    if a.args[1] != 2 or b.args[1] != 0:
        return None
    nodes += [product, a, b]
    x = _from_float32(a.args[0], nodes)
    w_cast = dtype_of(x) if dtype_of(x) in HALF and _widened(b.args[0], CODES) else None
    w = _from_float32(b.args[0], nodes, CODES if w_cast else HALF)
    if len(shape(x)) != 2 or shape(x)[0] != 1 or len(shape(w)) != 2 or dtype_of(x) != (w_cast or dtype_of(w)):
        return None
    widened = dtype_of(x) in HALF
    if widened != (total is not end) or (widened and end.args[1] != dtype_of(x)) \
            or widened != (a.args[0] is not x) or widened != (b.args[0] is not w):
        return None
    if dtype_of(total) != torch.float32 or any(len(n.users) != 1 for n in nodes[1:]):
        return None
    return Gemv(x, w, nodes[::-1], w_cast)


def right_operand(node: Node) -> Node | None:
    """W of a matmul `x @ W` ending at `node`: mm's or addmm's right operand, or a decomposed one-row mm's."""
    if is_call(node, aten.mm.default):
        return node.args[1]
    if is_call(node, aten.addmm.default):
        return node.args[2]
    gemv = decomposed(node) if is_call(node, CONVERT, aten.sum.dim_IntList) else None
    return gemv.w if gemv is not None else None


def left_operand_and_bias(matmul: Node) -> tuple[Node, Node | None]:
    """(x, bias) of `x @ W (+ bias)` ending at `matmul`: addmm's left operand and its bias, else the left operand and
    None. An addmm that scales either term (beta or alpha other than 1) is declined."""
    if not is_call(matmul, aten.addmm.default):
        return matmul.args[0], None
    beta, alpha = matmul.kwargs.get("beta", 1), matmul.kwargs.get("alpha", 1)
    if beta != 1 or alpha != 1:
        raise Decline(f"addmm with beta={beta}, alpha={alpha}")
    return matmul.args[1], matmul.args[0]


def keep_inductors_if_faster(node: Node, matmul: Node, context, gemv_reason, *args) -> None:
    """Inside `as_matmul(node, ...)`: when `matmul` stands for a decomposition and the `inductor_gemvs` option is on,
    decline with `gemv_reason(*args)` (the op's measured crossover) if it gives one, which puts the decomposition
    back for Inductor's own GEMV."""
    if matmul is node or not getattr(context.options, "inductor_gemvs", True):
        return
    reason = gemv_reason(*args)
    if reason is not None:
        raise Decline(reason)


@contextlib.contextmanager
def as_matmul(node: Node, context):
    """Yields the matmul ending at `node`: `node` itself when it is one, else an `mm(x, W)` put in place of the
    decomposition `node` ends (which is erased); if the body raises `Decline`, the decomposition is rebuilt
    in the mm's place (when the mm is still there) and the exception goes on."""
    if is_call(node, *MATMULS):
        yield node
        return
    gemv = decomposed(node)
    if gemv is None:
        raise Decline(f"{node.name} is not a matmul")
    graph = context.gm.graph
    recipe = [(n.target, n.args, dict(n.kwargs)) for n in gemv.nodes]
    old = list(gemv.nodes)
    with graph.inserting_before(node):
        make = NodeMaker(graph, node, context.fake_mode)
        w = make(CONVERT, gemv.w, gemv.w_cast) if gemv.w_cast else gemv.w
        mm = make(aten.mm.default, gemv.x, w)
    node.replace_all_uses_with(mm)
    for n in reversed(old):
        graph.erase_node(n)
    try:
        yield mm
    except Decline:
        if not erased(mm):
            _rebuild(graph, mm, recipe, old, context)
        if w is not gemv.w and not erased(w) and not w.users:
            graph.erase_node(w)
        raise


def _rebuild(graph, mm: Node, recipe, old: list, context) -> None:
    """The decomposition, from `recipe` (target, args, kwargs per node of `old`), in `mm`'s place."""
    new: dict = {}
    with graph.inserting_before(mm):
        make = NodeMaker(graph, mm, context.fake_mode)
        for node, (target, args, kwargs) in zip(old, recipe):
            args, kwargs = torch.fx.node.map_arg((args, kwargs), lambda n: new.get(n, n))
            new[node] = make(target, *args, **kwargs)
    mm.replace_all_uses_with(new[old[-1]])
    graph.erase_node(mm)
