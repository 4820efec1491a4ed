"""Int8 x int8 linears (torchao's `Int8DynamicActivationInt8WeightConfig`) -> `fa4::int8_int8_linear`, on
Inductor's aten graphs (POST_GRAD).

The subgraph as `post_grad_custom_pre_pass` receives it (torch 2.13, torchao 0.18; printed with
tests/test_int8_int8_linear.py's graphs): w an int8 [N, K] graph input with its float32 scale [N, 1], x the
activation, quantized per token in the graph (amax, scale, round, clamp, cast: that chain stays, for
Inductor), then

    _int_mm(x_int8 [M, K], permute(w, [1, 0]))                 int32 [M, N]
      -> convert_element_type(., float32) -> mul(., x_scale [M, 1])
         (torch 2.11: mul(., expand(x_scale [M, 1], [M, N])), the float32 scale promoting the product)
      -> convert_element_type(., x.dtype)                     (no step for a float32 x)
      [-> reshape] -> mul(., reshape(w_scale, [N]))            float32 (the scale is)
      [-> reshape] [-> add(., bias [N])]
      [-> reshape] -> convert_element_type(., x.dtype)
    becomes  int8_int8_linear(x_int8, x_scale, w, reshape(w_scale, [N]), bias, out_dtype=x.dtype) [-> reshape]

(with a 3-D x the activation is reshaped to [M, K] before the matmul and the result back to [B, S, N]
between the multiplications, as above; the reshapes move after the op, which computes on [M, N]).

Where the op would run the call on `fa4::int8_linear`'s mixed-input kernel (CUDA, a static M below 17, a bf16 /
fp16 output: `_scaled_in_graph`), the graph calls that op itself, on the activation cast to the output dtype (exact),
and scales its result in the graph, so that Inductor fuses the cast and the scaling with their neighbours:

    int8_linear(convert_element_type(x_int8, out_dtype), w, w_scale) * x_scale [+ bias] -> convert(., out_dtype)

Only where default compile cannot run it as well: M above 16 stays as written (Inductor runs `_int_mm`
there and fuses the scaling into one kernel; the op would run the same GEMM with unfused elementwise kernels
after it). M of 16 rows or fewer (decode: `_int_mm` refuses it on CUDA and default compile fails) becomes the
op, which pads such calls for cuBLAS. A symbolic M is decided for the call being compiled, under a guard (a
later call on the other side of 16 recompiles); where no guard can be added any more (a backward compiled after
Dynamo built its guards) it becomes the op, which takes every M.
Kept as written, with the reason: a weight computed in the graph or frozen, scales of other shapes, a
chain of other steps or dtypes (an order the op does not compute), intermediate values other nodes read.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ..kernels import INT8_INT8_LINEAR, INT8_LINEAR, int8_int8_linear_unsupported_reason
from ..kernels import int8_int8_linear as int8_int8_kernels
from ..kernels.int8_int8_linear import INT_MM_MIN_ROWS
from ..kernels.layout import dtype_name as _name
from .family import POST_GRAD, Context, Family
from .graph_edit import NodeMaker, erase_dead
from .records import Decline
from .spellings import describe_operand as _describe, dtype_of as _dtype, guardable, is_call as _is, shape, single_user
from .spellings import size_hint, value

aten, prims = torch.ops.aten, torch.ops.prims
CONVERT = prims.convert_element_type.default
RESHAPES = (aten.reshape.default, aten.view.default)
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
SCALED_IN_GRAPH_DEVICES = ("cuda",)


def _weight(matmul: Node) -> Node | None:
    operand = matmul.args[1]
    if _is(operand, aten.permute.default) and list(operand.args[1]) == [1, 0]:
        return operand.args[0]
    return None


def is_candidate(node: Node) -> bool:
    """`_int_mm(x, W^T)`: an int8 GEMM whose right operand is a transposed [N, K] tensor."""
    return _is(node, aten._int_mm.default) and _weight(node) is not None


def _next(node: Node, replaced: list[Node]) -> Node:
    """node's one user (the next step of the chain), after `node` joins `replaced`."""
    replaced.append(node)
    user = single_user(node)
    if user is None:
        readers = ", ".join(u.name for u in node.users) or "nothing"
        raise Decline(f"{node.name}, a step of the int8 GEMM's scaling, is read by {readers}, not one next step")
    return user


def _past_reshapes(node: Node, replaced: list[Node], n) -> Node:
    """`node`, or the first step after it that is not a reshape keeping the N columns last (the reshapes join
    `replaced`)."""
    while _is(node, *RESHAPES):
        if not shape(node) or shape(node)[-1] != n:
            raise Decline(f"the int8 GEMM's output is reshaped to {list(shape(node))}, which moves its {n} columns")
        node = _next(node, replaced)
    return node


def _other(mul: Node, product: Node):
    if len(mul.args) != 2:
        return None
    a, b = mul.args
    return b if a is product else a if b is product else None


def _per_channel(operand, n) -> bool:
    """A tensor that varies only along the last dim, over the N output channels."""
    s = shape(operand) if isinstance(operand, Node) else ()
    return bool(s) and s[-1] == n and all(d == 1 for d in s[:-1])


class Match:
    def __init__(self, matmul: Node):
        self.matmul = matmul
        self.x_int8, self.w_int8 = matmul.args[0], _weight(matmul)
        self.x_scale = self.w_scale = self.bias = None
        self.out_dtype: torch.dtype | None = None
        self.end = matmul
        self.replaced: list[Node] = [matmul.args[1]]  # the permute and every step to the end (excluded)


def match(matmul: Node) -> Match:
    m = Match(matmul)
    n = shape(m.w_int8)[0]
    rows = shape(m.x_int8)[0]
    node = _next(matmul, m.replaced)
    cast = matmul  # torch 2.11 multiplies the int32 product by the float32 scale directly (the same promotion)
    if _is(node, CONVERT) and node.args[1] == torch.float32:
        cast = node
        node = _next(node, m.replaced)
    elif not _is(node, aten.mul.Tensor):
        raise Decline(f"the int8 GEMM's int32 output goes to {node.target}, not a cast to float32")
    x_scale = _other(node, cast) if _is(node, aten.mul.Tensor) else None
    if _is(x_scale, aten.expand.default) and len(x_scale.users) == 1 and shape(x_scale) == (rows, n):
        x_scale = x_scale.args[0]  # torch 2.11 broadcasts the [M, 1] scale explicitly
    if cast is matmul and isinstance(x_scale, Node) and _dtype(x_scale) != torch.float32:
        raise Decline(f"the int8 GEMM's int32 output is multiplied by a {_name(_dtype(x_scale))} scale, not "
                      "float32 (an order the op does not compute)")
    if not (isinstance(x_scale, Node) and shape(x_scale) in ((rows, 1), (rows,)) and x_scale is not cast
            and value(x_scale).is_floating_point()):
        raise Decline(f"the int8 GEMM's float32 output is multiplied by {_describe(x_scale)}, not a per-row "
                      f"activation scale [{rows}, 1]" if _is(node, aten.mul.Tensor) else
                      f"the int8 GEMM's float32 output goes to {node.target}, not a multiplication by the "
                      "activation's scale")
    m.x_scale = x_scale
    node = _next(node, m.replaced)
    if _is(node, CONVERT) and node.args[1] in FLOATS:
        m.out_dtype = node.args[1]
        node = _past_reshapes(_next(node, m.replaced), m.replaced, n)
    elif _dtype(m.replaced[-1]) == torch.float32 and _is(node, aten.mul.Tensor, *RESHAPES):
        m.out_dtype = torch.float32  # a float32 activation: torchao's cast back to its dtype is no step
        node = _past_reshapes(node, m.replaced, n)
    else:
        raise Decline(f"the activation-scaled product goes to {node.target}, not a cast to the output dtype")
    w_scale = _other(node, m.replaced[-1]) if _is(node, aten.mul.Tensor) else None
    if not (_per_channel(w_scale, n) and value(w_scale).is_floating_point()):
        raise Decline(f"the scaled product is multiplied by {_describe(w_scale)}, not a per-channel weight scale "
                      f"[{n}]" if _is(node, aten.mul.Tensor) else
                      f"the scaled product goes to {node.target}, not a multiplication by the weight's scale")
    m.w_scale, m.end = w_scale, node
    _follow_bias_and_cast(m, n)
    return m


def _follow_bias_and_cast(m: Match, n) -> None:
    """[reshape] [add(., bias)] [reshape] [convert(., out_dtype)] after the weight scale: what the op's result
    stands for ends at the last of them present."""
    node = single_user(m.end)
    chain = [m.end]
    while node is not None and _is(node, *RESHAPES) and shape(node) and shape(node)[-1] == n:
        chain.append(node)
        node = single_user(node)
    if _is(node, aten.add.Tensor) and _other(node, chain[-1]) is not None \
            and _per_channel(_other(node, chain[-1]), n) and value(_other(node, chain[-1])).is_floating_point():
        m.bias = _other(node, chain[-1])
        chain.append(node)
        node = single_user(node)
        while node is not None and _is(node, *RESHAPES) and shape(node) and shape(node)[-1] == n:
            chain.append(node)
            node = single_user(node)
    if _is(node, CONVERT) and node.args[1] == m.out_dtype:
        chain.append(node)
    while chain and _is(chain[-1], *RESHAPES):
        chain.pop()  # a trailing reshape stays as written, after the op's
    for step in chain[:-1]:
        if len(step.users) != 1:
            raise Decline(f"{step.name}, a step of the int8 GEMM's scaling, is read by "
                          f"{', '.join(u.name for u in step.users)}, not one next step")
    m.replaced += chain[:-1]
    m.end = chain[-1]
    if _dtype(m.end) != m.out_dtype:
        raise Decline(f"the scaled int8 GEMM ends in {_name(_dtype(m.end))}, not cast back to "
                      f"{_name(m.out_dtype)}: an order the op does not compute")


def _check_supported(m: Match) -> None:
    w = m.w_int8
    if w.op == "get_attr":
        raise Decline(f"the int8 weight ({w.name}) is a constant of the graph (Inductor's freezing): not yet")
    if w.op != "placeholder":
        raise Decline(f"the int8 weight ({w.name}) is computed in the graph, not a parameter or buffer")
    if _dtype(w) != torch.int8 or _dtype(m.x_int8) != torch.int8:
        raise Decline(f"the GEMM multiplies {_name(_dtype(m.x_int8))} by {_name(_dtype(w))}, not int8 by int8")
    n, k = shape(w)
    if not all(isinstance(d, int) for d in (n, k)):
        raise Decline(f"the int8 weight's shape {[n, k]} is symbolic")
    rows = shape(m.x_int8)[0]
    if guardable(rows) and rows >= INT_MM_MIN_ROWS:  # a guard when symbolic
        when = "" if isinstance(rows, int) else " (M symbolic: this compile's, under a guard)"
        raise Decline(f"{size_hint(rows)} rows{when}: default compile runs torch._int_mm with the scaling fused (the "
                      f"op would add unfused kernels); it takes M below {INT_MM_MIN_ROWS}")
    reason = int8_int8_linear_unsupported_reason(value(m.x_int8).device.type, m.out_dtype, n, k)
    if reason is not None:
        raise Decline(reason)


def _scaled_in_graph(m: Match, w_scale: Node) -> bool:
    """Whether the op would run this call on `fa4::int8_linear`'s mixed-input kernel (a static M below
    `INT_MM_MIN_ROWS`, a float16 / bfloat16 output, a kernel that takes the shape: `weight_only_route`): then the graph
    calls that op on the activation cast to the output dtype (exact) and scales its result itself, so that Inductor
    fuses the cast into the activation's quantization and the scaling into what reads the result."""
    x, rows = value(m.x_int8), shape(m.x_int8)[0]
    return (x.device.type in SCALED_IN_GRAPH_DEVICES and isinstance(rows, int)
            and int8_int8_kernels.casts_to_weight_only(rows, m.out_dtype)
            and int8_int8_kernels.weight_only_route(x.to(m.out_dtype), value(m.w_int8), value(w_scale)) is not None)


def rewrite(matmul: Node, context: Context) -> str:
    m = match(matmul)
    _check_supported(m)
    graph = context.gm.graph
    n = shape(m.w_int8)[0]
    with graph.inserting_before(m.end):
        make = NodeMaker(graph, m.end, context.fake_mode)
        w_scale = m.w_scale if shape(m.w_scale) == (n,) else make(aten.reshape.default, m.w_scale, [n])
        in_graph = _scaled_in_graph(m, w_scale)
        if in_graph:  # out = (int8_linear(x_int8 as out_dtype, w, w_scale) * x_scale [+ bias]) as out_dtype
            product = make(INT8_LINEAR, make(CONVERT, m.x_int8, m.out_dtype), m.w_int8, w_scale)
            rows = shape(m.x_int8)[0]
            x_scale = m.x_scale if shape(m.x_scale) == (rows, 1) else make(aten.reshape.default, m.x_scale, [rows, 1])
            out = make(aten.mul.Tensor, product, x_scale)
            if m.bias is not None:
                out = make(aten.add.Tensor, out, m.bias)
            out = make(CONVERT, out, m.out_dtype)
        else:
            out = make(INT8_INT8_LINEAR, m.x_int8, m.x_scale, m.w_int8, w_scale, m.bias, out_dtype=m.out_dtype)
        if shape(m.end) != shape(out):  # a reshape in the chain moved the result's shape: the last one says to what
            reshape = [node for node in m.replaced if _is(node, *RESHAPES)][-1]
            out = make(aten.reshape.default, out, reshape.args[1])
    m.end.replace_all_uses_with(out)
    erase_dead(graph, [m.end])
    return _describe_call(m, w_scale, in_graph)


def _describe_call(m: Match, w_scale: Node, in_graph: bool) -> str:
    def tensor(name, node):
        return f"{name}[{'x'.join(str(s) for s in shape(node))}] {_name(_dtype(node))}"

    if in_graph:
        return (f"fa4.int8_linear({tensor('x', m.x_int8)} as {_name(m.out_dtype)}, {tensor('w', m.w_int8)}, "
                f"{tensor('w_scale', w_scale)}) * {tensor('x_scale', m.x_scale)}"
                + (f" + {tensor('bias', m.bias)}" if m.bias is not None else "")
                + f" as {_name(m.out_dtype)}: the cast and the scaling in the graph, for Inductor to fuse")
    parts = [tensor("x", m.x_int8), tensor("x_scale", m.x_scale), tensor("w", m.w_int8), tensor("w_scale", w_scale)]
    if m.bias is not None:
        parts.append(tensor("bias", m.bias))
    return f"fa4.int8_int8_linear({', '.join(parts)}, out_dtype={_name(m.out_dtype)})"


FAMILY = Family("int8_int8_linear", POST_GRAD, is_candidate, rewrite)
