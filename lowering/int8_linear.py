"""Int8 weight-only linears -> `fa4::int8_linear`, on Inductor's aten graphs (POST_GRAD).

The subgraphs as `post_grad_custom_pre_pass` receives them (torch 2.13); w is an int8 [N, K] graph input
(a parameter or buffer); with a 3-D x, `reshape(x, [M, K])` comes before the matmul and
`reshape(., [B, S, N])` after it, and the op takes the 2-D x in place of the matmul.

gpt-fast's `WeightOnlyInt8Linear`, `F.linear(x, w.to(x.dtype)) * scales` (scales [N] in x's dtype):

    convert_element_type(w, x.dtype) -> permute([1, 0]) -> mm(x, .) [-> reshape] -> mul(., scales)
    becomes  int8_linear(x, w, scales, scale_after_matmul=True) [-> reshape]

torchao's `Int8WeightOnlyConfig` (an `Int8Tensor` weight; its scale kept in float32, cast to x's dtype; the
bias added after the scale, which stays as written after the op):

    permute(w, [1, 0]) -> convert_element_type(., x.dtype) -> mm(x, .) -> mul(., reshape(convert(scale)))
        [-> add(., bias)]
    becomes  int8_linear(x, w, reshape(convert(scale)), scale_after_matmul=True) [-> add(., bias)]

dequantize per output channel, then linear: `F.linear(x, w.to(x.dtype) * scale[:, None], bias)`, also
`scale.view(-1, 1)` / `unsqueeze(-1)`, and `(w.float() * scale[:, None]).to(x.dtype)` with a float32 scale:

    convert_element_type(w, float) -> mul(., scale [N, 1]) [-> convert_element_type(., x.dtype)]
        -> permute([1, 0]) -> mm(x, .) | addmm(bias, x, .)
    becomes  int8_linear(x, w, scale [N], bias)

dequantize per group of g inputs, `(w.view(N, K // g, g).to(x.dtype) * scale[..., None]).view(N, K)` (the
reshape and the cast in either order; `flatten(1)` or `reshape` back):

    reshape(w, [N, K // g, g]), convert_element_type(., float) -> mul(., scale [N, K // g, 1])
        -> reshape(., [N, K]) [-> convert_element_type] -> permute([1, 0]) -> mm | addmm
    becomes  int8_linear(x, w, scale [N, K // g], bias, group_size=g)

The op computes each in the same arithmetic order (kernels/int8_linear.py); so the product must be taken
in x's dtype or float32 and rounded only to those. Kept as written, with the reason: an int8 weight that
is computed in the graph, a dequantized weight or matmul output that something else also reads (a
training forward saves the weight for the backward), scales of another shape (per input channel, per
tensor), a bias added before a scale, dtypes the op does not take.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ..kernels import INT8_LINEAR, int8_linear_gemv_reason, int8_linear_unsupported_reason
from ..kernels.layout import dtype_name as _name
from . import gemv
from .family import POST_GRAD, Context, Family
from .graph_edit import NodeMaker, decline_other_readers, erase_dead
from .records import Decline
from .spellings import describe_operand as _describe, dtype_of as _dtype, is_call as _is
from .spellings import is_transpose_2d as _is_transpose, same_size, shape, single_user, value

aten, prims = torch.ops.aten, torch.ops.prims
CONVERT = prims.convert_element_type.default
RESHAPES = (aten.reshape.default, aten.view.default)
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
WEIGHT_STEPS = (CONVERT, *RESHAPES, aten.mul.Tensor, aten.unsqueeze.default, aten.expand.default, aten.clone.default)


def _transposed_weight(matmul: Node) -> Node | None:
    """W of `x @ W^T`: the matmul's right operand is a permute([1, 0]) of it, or (torchao's Int8Tensor) a
    cast of the int8 weight's permute, the cast being elementwise."""
    operand = gemv.right_operand(matmul)
    if operand is None:
        return None
    if _is_transpose(operand):
        return operand.args[0]
    if _is(operand, CONVERT) and _is_transpose(operand.args[0]):
        return operand.args[0].args[0]
    return None


def _reaches_int8(node, depth: int = 8) -> bool:
    if not isinstance(node, Node) or depth == 0:
        return False
    if isinstance(value(node), torch.Tensor) and _dtype(node) == torch.int8:
        return True
    return _is(node, *WEIGHT_STEPS) and any(_reaches_int8(n, depth - 1) for n in node.all_input_nodes)


def is_candidate(node: Node) -> bool:
    """A matmul `x @ W^T` (or Inductor's decomposed one-row matmul, `gemv.py`) whose W is computed from an int8
    tensor."""
    weight = _transposed_weight(node)
    return weight is not None and _reaches_int8(weight)


def _cast_of_int8(node: Node) -> tuple[Node, list[Node]] | None:
    """(the int8 tensor, the nodes between) when `node` is it reshaped and cast to floating dtypes, which
    keeps every value exactly; else None."""
    between = []
    while _is(node, CONVERT, *RESHAPES):
        if _is(node, CONVERT) and node.args[1] not in FLOATS:
            return None
        between.append(node)
        node = node.args[0]
    if isinstance(node, Node) and _dtype(node) == torch.int8:
        return node, between
    return None


def _peel_casts_and_reshapes(node: Node) -> tuple[Node, list[Node]]:
    peeled = []
    while _is(node, CONVERT, *RESHAPES):
        peeled.append(node)
        node = node.args[0]
    return node, peeled


class Match:
    """A matched int8 linear: the op's arguments and the nodes it replaces."""

    def __init__(self, matmul: Node):
        self.matmul, self.end = matmul, matmul  # `end`: the node whose value the op's output replaces
        self.x, self.bias = gemv.left_operand_and_bias(matmul)
        self.w_int8 = self.scale = self.output_reshape = None
        self.scale_shape: tuple = ()  # the op's: [N], or [N, K // g]
        self.group_size, self.scale_after_matmul = -1, False
        self.chain: list[Node] = []  # from the int8 weight (excluded) to the matmul (excluded): W and its transpose

    @property
    def n_k(self) -> tuple[int, int]:
        return tuple(shape(self.w_int8))


def match(matmul: Node) -> Match:
    m = Match(matmul)
    transpose = matmul.args[1] if matmul.target is aten.mm.default else matmul.args[2]
    x_dtype = _dtype(m.x)
    if _is(transpose, CONVERT):  # torchao's Int8Tensor: the int8 weight transposed, then cast
        m.w_int8, m.chain = transpose.args[0].args[0], [transpose, transpose.args[0]]
        if _dtype(m.w_int8) != torch.int8 or transpose.args[1] != x_dtype:
            raise Decline(f"the matmul's weight is a {_name(_dtype(transpose.args[0]))} tensor cast to "
                          f"{_name(transpose.args[1])} for a {_name(x_dtype)} x")
        _match_scale_after_matmul(m)
        return m
    weight = transpose.args[0]
    if _dtype(weight) != x_dtype:
        raise Decline(f"the matmul takes a {_name(x_dtype)} x and a {_name(_dtype(weight))} weight")
    cast = _cast_of_int8(weight)
    if cast is not None:
        m.w_int8, between = cast
        m.chain = [transpose, *between]
        _match_scale_after_matmul(m)
    else:
        _match_dequantized(m, weight, x_dtype)
        m.chain.insert(0, transpose)
    if shape(m.w_int8) != shape(weight):
        raise Decline(f"the int8 weight has shape {list(shape(m.w_int8))}, the matmul's {list(shape(weight))}")
    return m


def _match_scale_after_matmul(m: Match) -> None:
    """`mm(x, w.to(dtype)^T)`, then the output scaled per channel: gpt-fast's order."""
    if m.bias is not None:
        raise Decline("a bias is added before the scale (addmm of an int8 weight cast without its scale)")
    n = shape(m.w_int8)[0]
    user = single_user(m.matmul)
    if _is(user, *RESHAPES) and len(shape(user)) >= 1 and same_size(shape(user)[-1], n):
        m.output_reshape, user = user, single_user(user)
    if not _is(user, aten.mul.Tensor):
        raise Decline("the int8 weight is cast to a float without a scale: no per-channel scale multiplies the "
                      "matmul's output" + (" (it has other users)" if user is None else ""))
    product = m.output_reshape or m.matmul
    scale = user.args[1] if user.args[0] is product else user.args[0]
    scale_shape = shape(scale) if isinstance(scale, Node) and scale is not product else ()
    if not (scale_shape and scale_shape[-1] == n and all(s == 1 for s in scale_shape[:-1])
            and len(scale_shape) <= len(shape(product)) and _same_shape(user, product)):
        raise Decline(f"the matmul's output is multiplied by {_describe(scale)}, not a per-channel scale [{n}]")
    m.scale, m.scale_shape, m.end, m.scale_after_matmul = scale, (n,), user, True


def _same_shape(a: Node, b: Node) -> bool:
    """Provably the same shape, without a guard on symbolic sizes."""
    return len(shape(a)) == len(shape(b)) and all(same_size(i, j) for i, j in zip(shape(a), shape(b)))


def _match_dequantized(m: Match, weight: Node, x_dtype: torch.dtype) -> None:
    """W = int8 weight times its scales (per channel or per group), then the matmul."""
    product, after = _peel_casts_and_reshapes(weight)
    if not _is(product, aten.mul.Tensor):
        raise Decline(f"the int8 weight reaches the matmul through {product.target}, not a multiplication by "
                      "its scales")
    for operand, scale in (product.args, product.args[::-1]):
        cast = _cast_of_int8(operand) if isinstance(operand, Node) else None
        if cast is not None:
            break
    else:
        raise Decline("the multiplication in the weight has no int8 weight operand")
    m.w_int8, before = cast
    m.chain = [*after, product, *before]
    product_dtype = _dtype(product)
    for dtype in (product_dtype, *(n.args[1] for n in after if _is(n, CONVERT))):
        if dtype not in (x_dtype, torch.float32):
            raise Decline(f"the weight is dequantized through {_name(dtype)} for a {_name(x_dtype)} x, which rounds "
                          "differently from the op")
    n, k = shape(m.w_int8)
    dequantized_shape = shape(operand)
    scale_shape = shape(scale) if isinstance(scale, Node) else ()
    m.scale = scale
    if dequantized_shape == (n, k) and scale_shape == (n, 1):
        m.scale_shape = (n,)
    elif len(dequantized_shape) == 3 and dequantized_shape[0] == n \
            and dequantized_shape[1] * dequantized_shape[2] == k and scale_shape == (*dequantized_shape[:2], 1):
        m.scale_shape, m.group_size = dequantized_shape[:2], dequantized_shape[2]
    else:
        raise Decline(f"the int8 weight viewed as {list(dequantized_shape)} is multiplied by {_describe(scale)}: "
                      "not a scale per output channel or per group")


def _check_sole_users(m: Match) -> None:
    """The dequantized weight (and, when scaled after, the matmul's output) is read by nothing else."""
    replaced = [*m.chain, m.matmul] + [n for n in (m.output_reshape, m.end) if n not in (None, m.matmul)]
    decline_other_readers(
        replaced[:-1], replaced, (aten.permute.default, *RESHAPES),
        lambda node: "matmul's output" if node in (m.matmul, m.output_reshape) else "dequantized weight")


def _check_supported(m: Match) -> None:
    if m.w_int8.op == "get_attr":
        raise Decline(f"the int8 weight ({m.w_int8.name}) is a constant of the graph (Inductor's freezing): not yet")
    if m.w_int8.op != "placeholder":
        raise Decline(f"the int8 weight ({m.w_int8.name}) is computed in the graph, not a parameter or buffer")
    n, k = m.n_k
    if not all(isinstance(d, int) for d in (n, k)):
        raise Decline(f"the int8 weight's shape {[n, k]} is symbolic")
    x, scale = value(m.x), value(m.scale)
    reason = int8_linear_unsupported_reason(x.device.type, x.dtype, scale.dtype, k, m.group_size,
                                            m.scale_after_matmul)
    if reason is not None:
        raise Decline(reason)
    if m.bias is not None:
        bias = value(m.bias)
        if bias.dtype != x.dtype or tuple(bias.shape) != (n,):
            raise Decline(f"the bias is {_describe(m.bias)}, not [{n}] {_name(x.dtype)}")


def _scale_argument(scale: Node, wanted: tuple, make: NodeMaker) -> Node:
    """`scale` [..., 1] as the op's [N] or [N, K // g]: the tensor it was unsqueezed or reshaped from, if
    it has that shape, else a reshape."""
    if shape(scale) == tuple(wanted):
        return scale
    if _is(scale, aten.unsqueeze.default, *RESHAPES) and shape(scale.args[0]) == tuple(wanted):
        return scale.args[0]
    return make(aten.reshape.default, scale, list(wanted))


def rewrite(node: Node, context: Context) -> str:
    with gemv.as_matmul(node, context) as matmul:
        m = match(matmul)
        _check_supported(m)
        _check_sole_users(m)
        gemv.keep_inductors_if_faster(node, matmul, context, int8_linear_gemv_reason, value(m.x).device.type, *m.n_k)
    graph = context.gm.graph
    with graph.inserting_before(m.end):
        make = NodeMaker(graph, m.end, context.fake_mode)
        scale = _scale_argument(m.scale, m.scale_shape, make)
        kwargs = {"group_size": m.group_size} if m.group_size != -1 else {}
        if m.scale_after_matmul:
            kwargs["scale_after_matmul"] = True
        out = make(INT8_LINEAR, m.x, m.w_int8, scale, m.bias, **kwargs)
        if m.scale_after_matmul and m.output_reshape is not None:
            out = make(aten.reshape.default, out, m.output_reshape.args[1])
    m.end.replace_all_uses_with(out)
    erase_dead(graph, [m.end])
    return _describe_call(m, scale, kwargs)


def _describe_call(m: Match, scale: Node, kwargs: dict) -> str:
    def dims(node):
        return "x".join(str(s) for s in shape(node))

    bias = f", bias[{dims(m.bias)}]" if m.bias is not None else ""
    flags = "".join(f", {k}={v}" for k, v in kwargs.items())
    return (f"fa4.int8_linear(x[{dims(m.x)}] {_name(_dtype(m.x))}, w[{dims(m.w_int8)}] int8, "
            f"scale[{dims(scale)}] {_name(_dtype(scale))}{bias}{flags})")


FAMILY = Family("int8_linear", POST_GRAD, is_candidate, rewrite)
