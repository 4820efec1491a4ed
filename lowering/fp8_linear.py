"""FP8 (float8_e4m3fn) weight linears -> `fa4::fp8_linear`, on Inductor's aten graphs (POST_GRAD).

The subgraphs as `post_grad_custom_pre_pass` receives them (torch 2.13, torchao 0.18; printed with
tests/test_fp8_linear.py's graphs); w is a float8_e4m3fn [N, K] graph input (a parameter or buffer), w_scale its
float32 scale, [N, 1] (per row) or [1, 1] (per tensor). With a 3-D x, `reshape(x, [M, K])` comes before the
matmul and `reshape(., [B, S, N])` after it; the op takes the 2-D x in the matmul's place.

torchao's `Float8DynamicActivationFloat8WeightConfig`, x quantized in the graph (amax, / 448, x / scale, clamp to
+-448, cast to e4m3: that chain stays, for Inductor), x_scale [M, 1] (PerRow) or [1, 1] (PerTensor):

    _scaled_mm(x_fp8 [M, K], permute(w, [1, 0]), x_scale, permute(w_scale, [1, 0]), bias | None, None,
               out_dtype, use_fast_accum)
    becomes  fp8_linear(convert_element_type(x_fp8, out_dtype), w, reshape(w_scale, [-1]), reshape(x_scale, [-1]),
                        bias, use_fast_accum=use_fast_accum)

torchao's `Float8WeightOnlyConfig` (its bias added after the matmul stays as written, after the op), and user code
`F.linear(x, (w.float() * w_scale[:, None]).to(x.dtype), bias)`; also a one-row mm that Inductor has decomposed
(lowering/gemv.py):

    permute(w, [1, 0]) -> convert_element_type(., float32) -> mul(., permute(w_scale, [1, 0]))
        -> convert_element_type(., x.dtype) -> mm(x, .) [-> reshape -> add(., bias)]
    convert_element_type(w, float32) -> mul(., w_scale [N, 1]) -> convert_element_type(., x.dtype)
        -> permute(., [1, 0]) -> mm(x, .) | addmm(bias, x, .)
    becomes  fp8_linear(x, w, reshape(w_scale, [-1]), None, bias)

The op computes each in the replaced code's arithmetic order (kernels/fp8_linear.py): so the weight must be
multiplied by its scale in float32 and rounded only to x's dtype. Kept as written, with the reason: a weight
computed in the graph or frozen, float8_e5m2 or other dtypes, scales of other shapes (per input channel, blocks),
a result scale (`scale_result`), a dequantized weight something else also reads (a training forward saves it for
the backward), and, on CUDA, a `_scaled_mm` the op would only call again (`fp8_linear_scaled_mm_kept_reason`: more
than 16 rows, known when compiling, a float32 output, or a weight of more than 2048 rows whose K is under twice its N,
where cuBLAS's fp8 GEMM is measured as fast as ours; a symbolic row count becomes the op, which decides per call).
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ..kernels import FP8_LINEAR, fp8_linear_scaled_mm_kept_reason, fp8_linear_unsupported_reason
from ..kernels.layout import dtype_name as _name
from . import gemv
from .family import POST_GRAD, Context, Family
from .graph_edit import NodeMaker, decline_other_readers, erase_dead
from .records import Decline
from .spellings import arg, describe_node, describe_operand as _describe, dtype_of as _dtype, is_call as _is
from .spellings import is_transpose_2d, same_size, shape, value

aten, prims = torch.ops.aten, torch.ops.prims
CONVERT = prims.convert_element_type.default
SCALED_MM = aten._scaled_mm.default
RESHAPES = (aten.reshape.default, aten.view.default)
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def _is_transpose(node) -> bool:
    return is_transpose_2d(node) or _is(node, aten.t.default)


def _fp8_source(node) -> tuple[Node, list[Node]] | None:
    """(the float8 tensor, the nodes between) when `node` is it transposed and cast to floating dtypes (which keeps
    every value); else None."""
    between = []
    while (_is(node, CONVERT) and node.args[1] in FLOATS) or _is_transpose(node):
        between.append(node)
        node = node.args[0]
    if isinstance(node, Node) and isinstance(value(node), torch.Tensor) and _dtype(node) in FLOAT8:
        return node, between
    return None


def _product(matmul: Node) -> tuple[Node, list[Node]] | None:
    """(the multiplication, the casts and transposes after it) that the matmul's right operand W is computed by."""
    after, node = [], gemv.right_operand(matmul)
    while _is(node, CONVERT) or _is_transpose(node):
        after.append(node)
        node = node.args[0]
    return (node, after) if _is(node, aten.mul.Tensor) else None


def is_candidate(node: Node) -> bool:
    """`_scaled_mm`, or a matmul `x @ W^T` (or Inductor's decomposed one-row matmul) whose W is a float8 tensor
    times something, cast and transposed."""
    if _is(node, SCALED_MM):
        return True
    found = _product(node)
    return found is not None and any(_fp8_source(a) is not None for a in found[0].args)


def _check_weight(w: Node, x_dtype: torch.dtype, device_type: str) -> None:
    if w.op == "get_attr":
        raise Decline(f"the fp8 weight ({w.name}) is a constant of the graph (Inductor's freezing): not yet")
    if w.op != "placeholder":
        raise Decline(f"the fp8 weight ({w.name}) is computed in the graph, not a parameter or buffer")
    reason = fp8_linear_unsupported_reason(device_type, x_dtype, _dtype(w))
    if reason is not None:
        raise Decline(reason)
    if len(shape(w)) != 2 or not all(isinstance(d, int) for d in shape(w)):
        raise Decline(f"the fp8 weight's shape {list(shape(w))} is not a static [N, K]")


def _one_element(s: tuple) -> bool:
    return len(s) <= 2 and all(d == 1 for d in s)


def _flat_scale(scale: Node, make: NodeMaker) -> Node:
    """A per-channel (or per-row, or single) scale as the op's 1-D one: the 1-D tensor it was transposed, unsqueezed
    or reshaped from, else it reshaped to [-1]."""
    source = scale.args[0] if _is_transpose(scale) else scale
    if _is(source, aten.unsqueeze.default, *RESHAPES) and len(shape(source.args[0])) == 1:
        source = source.args[0]
    return source if len(shape(source)) == 1 else make(aten.reshape.default, source, [-1])


def _op_call(make: NodeMaker, x, w, w_scale, x_scale=None, bias=None, use_fast_accum=False) -> Node:
    args = [x, w, w_scale, x_scale, bias]
    while args[-1] is None:
        args.pop()
    return make(FP8_LINEAR, *args, **({"use_fast_accum": True} if use_fast_accum else {}))


def _tensor(name: str, node: Node) -> str:
    return f"{name}[{'x'.join(str(s) for s in shape(node))}] {_name(_dtype(node))}"


# ------------------------------------------------------------------------------- _scaled_mm (dynamic activation)


def _rewrite_scaled_mm(node: Node, context: Context) -> str:
    a, b, scale_a, scale_b = node.args[:4]
    bias = arg(node, 4, "bias", None)
    out_dtype = arg(node, 6, "out_dtype", None)
    use_fast_accum = bool(arg(node, 7, "use_fast_accum", False))
    if arg(node, 5, "scale_result", None) is not None:
        raise Decline("torch._scaled_mm is given a result scale (scale_result), which the op does not take")
    if not _is_transpose(b):
        raise Decline(f"torch._scaled_mm's second operand is {describe_node(b)}, not a transposed [N, K] weight")
    w = b.args[0]
    if out_dtype not in FLOATS:
        raise Decline(f"torch._scaled_mm outputs {_name(out_dtype or _dtype(a))}, not one of "
                      f"{', '.join(map(_name, FLOATS))}")
    device_type = value(a).device.type
    _check_weight(w, out_dtype, device_type)
    if _dtype(a) != torch.float8_e4m3fn:
        raise Decline(f"the activation is {_name(_dtype(a))}, not float8_e4m3fn")
    n, k = shape(w)
    rows = shape(a)[0]
    for name, scale, per in (("activation", scale_a, (rows, 1)), ("weight", scale_b, (1, n))):
        s = shape(scale) if isinstance(scale, Node) else ()
        if not (isinstance(scale, Node) and _dtype(scale) == torch.float32 and
                (_one_element(s) or (len(s) == 2 and all(same_size(i, j) for i, j in zip(s, per))))):
            raise Decline(f"the {name}'s scale is {_describe(scale)}, not float32 {list(per)} or [1, 1]")
    if bias is not None and (_dtype(bias) != out_dtype or shape(bias) != (n,)):
        raise Decline(f"the bias is {_describe(bias)}, not [{n}] {_name(out_dtype)}")
    reason = fp8_linear_scaled_mm_kept_reason(device_type, out_dtype, rows if isinstance(rows, int) else None, n, k)
    if reason is not None:
        raise Decline(reason)
    graph = context.gm.graph
    with graph.inserting_before(node):
        make = NodeMaker(graph, node, context.fake_mode)
        w_scale, x_scale = _flat_scale(scale_b, make), _flat_scale(scale_a, make)
        out = _op_call(make, make(CONVERT, a, out_dtype), w, w_scale, x_scale, bias, use_fast_accum)
    node.replace_all_uses_with(out)
    erase_dead(graph, [node])
    parts = [f"{_tensor('x', a)} as {_name(out_dtype)}", _tensor("w", w), _tensor("w_scale", w_scale),
             _tensor("x_scale", x_scale)] + ([_tensor("bias", bias)] if bias is not None else [])
    return f"fa4.fp8_linear({', '.join(parts)}" + (", use_fast_accum=True)" if use_fast_accum else ")")


# ------------------------------------------------------------------------------------------------- weight-only


class WeightOnly:
    """A matched weight-only fp8 linear: the op's arguments and the nodes it replaces."""

    def __init__(self, matmul: Node):
        self.matmul = matmul
        self.x, self.bias = gemv.left_operand_and_bias(matmul)
        self.w = self.scale = None
        self.chain: list[Node] = []  # from the matmul's W (included) back to the fp8 weight (excluded)


def match_weight_only(matmul: Node) -> WeightOnly:
    m = WeightOnly(matmul)
    found = _product(matmul)
    if found is None:
        raise Decline("the matmul's weight is not a float8 tensor times its scale")
    product, after = found
    for operand, scale in (product.args, product.args[::-1]):
        source = _fp8_source(operand)
        if source is not None:
            break
    else:
        raise Decline("the multiplication in the weight has no float8 weight operand")
    m.w, before = source
    m.scale, m.chain = scale, [*after, product, *before]
    x_dtype = _dtype(m.x)
    transposes = sum(map(_is_transpose, m.chain))
    if transposes != 1:
        raise Decline(f"the fp8 weight reaches the matmul transposed {transposes} times, not once")
    if _dtype(product) != torch.float32:
        raise Decline(f"the fp8 weight is multiplied by its scale in {_name(_dtype(product))}, not float32 "
                      "(the op's order)")
    for cast in after:
        if _is(cast, CONVERT) and cast.args[1] not in (torch.float32, x_dtype):
            raise Decline(f"the dequantized weight is rounded to {_name(cast.args[1])} for a {_name(x_dtype)} x, "
                          "which rounds differently from the op")
    w_shape = shape(m.w)
    n = w_shape[0] if w_shape else None
    transposed = sum(map(_is_transpose, before)) == 1  # the weight as [K, N] where the scale multiplies it
    per_channel = ((1, n), (n,)) if transposed else ((n, 1),)
    s = shape(scale) if isinstance(scale, Node) else ()
    if not (isinstance(scale, Node) and len(w_shape) == 2 and (_one_element(s) or s in per_channel)
            and shape(product) == (w_shape[::-1] if transposed else w_shape)):
        raise Decline(f"the fp8 weight{' transposed' if transposed else ''} is multiplied by {_describe(scale)}: "
                      "not a scale per output channel or per tensor")
    if _dtype(scale) != torch.float32:
        raise Decline(f"the fp8 weight's scale is {_name(_dtype(scale))}, not float32")
    return m


def _check_weight_only(m: WeightOnly) -> None:
    x = value(m.x)
    _check_weight(m.w, x.dtype, x.device.type)
    n, _ = shape(m.w)
    if m.bias is not None and (_dtype(m.bias) != x.dtype or shape(m.bias) != (n,)):
        raise Decline(f"the bias is {_describe(m.bias)}, not [{n}] {_name(x.dtype)}")
    decline_other_readers(m.chain, [*m.chain, m.matmul], (aten.permute.default, *RESHAPES),
                          lambda node: "dequantized weight")


def _rewrite_weight_only(node: Node, context: Context) -> str:
    with gemv.as_matmul(node, context) as matmul:
        m = match_weight_only(matmul)
        _check_weight_only(m)
    graph = context.gm.graph
    with graph.inserting_before(matmul):
        make = NodeMaker(graph, matmul, context.fake_mode)
        w_scale = _flat_scale(m.scale, make)
        out = _op_call(make, m.x, m.w, w_scale, None, m.bias)
    matmul.replace_all_uses_with(out)
    erase_dead(graph, [matmul])
    parts = [_tensor("x", m.x), _tensor("w", m.w), _tensor("w_scale", w_scale)]
    return f"fa4.fp8_linear({', '.join(parts + ([_tensor('bias', m.bias)] if m.bias is not None else []))})"


def rewrite(node: Node, context: Context) -> str:
    if _is(node, SCALED_MM):
        return _rewrite_scaled_mm(node, context)
    return _rewrite_weight_only(node, context)


FAMILY = Family("fp8_linear", POST_GRAD, is_candidate, rewrite)
