"""A gated MLP's gate / up siblings and their activation product -> `fa4::nvfp4_gated_linear`, on Inductor's aten
graphs (POST_GRAD, over what `sibling_linears` grouped; option `gated_linears`):

    s = nvfp4_sibling_linears(x [1, K], [w_gate, w_up], [block, block], [global, global], [None, None])
    g = getitem(s, 0) [-> reshape]          u = getitem(s, 1) [-> reshape]
    a = act(g)                              any pointwise spelling of g alone of silu (Inductor's decomposition, torch
                                            2.13: convert(div(g32, add(exp(neg(g32)), 1)), x.dtype), g32 = convert(g,
                                            float32)) or of GELU's tanh approximation, told apart by running it on
                                            every finite value of g's dtype
    h = mul(a, u)
    becomes  nvfp4_gated_linear(x, [w_gate, w_up], [block, block], [global, global], activation=act)
             [-> reshape(., shape(h))]

Only for one row of x (a static 1: a decode step of batch 1), where the op runs one launch; with more rows it would
run the siblings, then the activation and the product unfused, which Inductor fuses into one kernel. Nothing else may read g,
u or the steps between; any other function of g (exact GELU) leaves the graph as it is.
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx import Node

from ..kernels import NVFP4_GATED_LINEAR, NVFP4_SIBLING_LINEARS
from ..kernels.nvfp4_gated_linear import ACTIVATIONS
from .family import POST_GRAD, Context, Family
from .graph_edit import NodeMaker, erase_dead
from .sibling_linears import VIEWS
from .spellings import dtype_of, evaluated, is_pointwise, shape

aten = torch.ops.aten
ACTIVATION_ULPS = 1  # steps of g's dtype a spelling of an activation may differ from the op's by
CANCELLATION = 2.0 ** -21  # and, times |g|: where x (1 + tanh(.)) cancels, float32 spellings differ by ~2^-23 |x|


def is_candidate(node: Node) -> bool:
    """Two sibling NVFP4 linears without biases over one row of x (static sizes, read without a guard)."""
    if node.op != "call_function" or node.target is not NVFP4_SIBLING_LINEARS or len(node.args[1]) != 2 or \
            any(b is not None for b in node.args[4]):
        return False
    rows = shape(node.args[0])[:-1]
    return all(type(d) is int for d in rows) and math.prod(rows) == 1


def _past_views(node: Node) -> Node:
    """The last of the single-user views that follow `node` (node itself if none)."""
    while len(node.users) == 1 and next(iter(node.users)).target in VIEWS:
        node = next(iter(node.users))
    return node


def _function_of(a: Node, g: Node, product: Node) -> list[Node] | None:
    """The nodes that compute `a` from `g` alone, elementwise at g's shape, read by nothing but each other and
    `product`; None where `a` is not such a function (it reads another tensor, reduces, reshapes)."""
    chain, work = [], [a]
    while work:
        node = work.pop()
        if node is g or node in chain:
            continue
        if not is_pointwise(node) or shape(node) != shape(g):
            return None
        chain.append(node)
        work.extend(node.all_input_nodes)
    inside = set(chain) | {product}
    if any(user not in inside for node in [g, *chain] for user in node.users):
        return None
    return chain


def _activation(a: Node, g: Node) -> str | None:
    """The op's activation `a` computes of g (run on every finite value of g's dtype, within ACTIVATION_ULPS steps
    and CANCELLATION), or None."""
    dtype = dtype_of(g)
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    probe = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    probe = probe[probe.isfinite()]
    got = evaluated(a, g, probe).float()
    bound = torch.finfo(dtype).eps * ACTIVATION_ULPS
    for name, function in ACTIVATIONS.items():
        want = function(probe).float()
        if got.shape == want.shape and bool(((got - want).abs() <= bound * want.abs() + CANCELLATION *
                                             probe.float().abs() + torch.finfo(dtype).tiny).all()):
            return name
    return None


def rewrite(node: Node, context: Context) -> str | None:
    items = {u.args[1]: u for u in node.users if u.target is operator.getitem}
    if sorted(items) != [0, 1] or len(node.users) != 2:
        return None
    g, u = _past_views(items[0]), _past_views(items[1])
    if len(u.users) != 1:
        return None
    product = next(iter(u.users))
    if product.target is not aten.mul.Tensor or len(product.args) != 2 or u not in product.args:
        return None
    a = product.args[0] if product.args[1] is u else product.args[1]
    if not isinstance(a, Node) or shape(u) != shape(g) or shape(product) != shape(g) or \
            dtype_of(product) != dtype_of(g) or _function_of(a, g, product) is None:
        return None
    activation = _activation(a, g)
    if activation is None:
        return None
    x, w_fp4, w_block_scale, w_global_scale = node.args[:4]
    graph = context.gm.graph
    with graph.inserting_before(product):
        make = NodeMaker(graph, product, context.fake_mode)
        out = make(NVFP4_GATED_LINEAR, x, list(w_fp4), list(w_block_scale), list(w_global_scale),
                   **{k: v for k, v in node.kwargs.items() if k == "scale_layout"}, activation=activation)
        if shape(out) != shape(product):
            out = make(aten.reshape.default, out, list(shape(product)))
    product.replace_all_uses_with(out)
    erase_dead(graph, [product])
    n, k = shape(w_fp4[0])
    return (f"fa4.nvfp4_gated_linear(x[{'x'.join(map(str, shape(x)))}], {activation}(gate[{n}x{2 * k}]) * "
            f"up[{n}x{2 * k}])")


FAMILY = Family("gated_linears", POST_GRAD, is_candidate, rewrite)
