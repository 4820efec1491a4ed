"""Torch-IR spellings: one predicate per operation, whichever way the model code wrote it.

Dynamo graphs are not normalized: `q @ k.mT`, `torch.matmul(q, k.transpose(-2, -1))` and
`q.matmul(k.transpose(2, 3))` are different nodes. The matchers in this package ask these
predicates instead of comparing targets, so each pattern is written once.
"""

from __future__ import annotations

import math
import operator
import os
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.fx import Node
from torch.fx.node import map_arg
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, guard_or_false, statically_known_true

from ..kernels.layout import dtype_name

_MISSING = object()


@dataclass(frozen=True)
class Spelling:
    """An operation: the torch functions (call_function) and Tensor methods (call_method) that spell it.

    `neutral`: keyword arguments that change what the call computes, with the one value at which it is
    still this operation (`torch.div(a, b, rounding_mode="floor")` is not a division). A call that writes
    into `out=` is never matched."""

    functions: tuple = ()
    methods: tuple = ()
    neutral: tuple = ()

    def __call__(self, node) -> bool:
        if not isinstance(node, Node):
            return False
        if node.op == "call_function":
            spelled = node.target in self.functions
        elif node.op == "call_method":
            spelled = node.target in self.methods
        else:
            return False
        return spelled and "out" not in node.kwargs and all(node.kwargs.get(k, v) == v for k, v in self.neutral)


SDPA = Spelling((F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default))
"""The aten overload is what a graph exported by `torch.export` calls (then compiled: `program.module()`)."""
MATMUL = Spelling((torch.matmul, operator.matmul, torch.bmm), ("matmul", "bmm", "__matmul__"))
LINEAR = Spelling((F.linear, torch.nn.functional.linear), ("linear",))
MM = Spelling((torch.mm,), ("mm",))
ADDMM = Spelling((torch.addmm,), ("addmm",))
"""`addmm(bias, a, b)`: HF GPT-2's `Conv1D` layers."""
SCALED_MM = Spelling((torch._scaled_mm,))
"""A float8 matmul with its scales (torchao's fp8 weights as plain buffers: `fa4_inductor.fp8.Fp8Linear`)."""
INT4PACK_MM = Spelling((torch.ops.aten._weight_int4pack_mm, torch.ops.aten._weight_int4pack_mm.default))
"""`(x, packed int4 weight, group size, scales and zeros)`: gpt-fast's int4 weight-only linears."""
SOFTMAX = Spelling((F.softmax, torch.softmax, torch.Tensor.softmax), ("softmax",))
DROPOUT = Spelling((F.dropout, torch.dropout), ("dropout",))
MUL = Spelling((operator.mul, torch.mul), ("mul", "__mul__", "__rmul__"))
DIV = Spelling((operator.truediv, torch.div, torch.true_divide), ("div", "true_divide", "__truediv__"),
               neutral=(("rounding_mode", None),))
ADD = Spelling((operator.add, torch.add), ("add", "__add__", "__radd__"), neutral=(("alpha", 1),))
TANH = Spelling((torch.tanh,), ("tanh",))
COS = Spelling((torch.cos,), ("cos",))
SIN = Spelling((torch.sin,), ("sin",))
NEG = Spelling((operator.neg, torch.neg, torch.negative), ("neg", "negative", "__neg__"))
MASKED_FILL = Spelling((torch.masked_fill,), ("masked_fill",))
WHERE = Spelling((torch.where,))
TRANSPOSE = Spelling((torch.transpose, torch.swapaxes, torch.swapdims), ("transpose", "swapaxes", "swapdims"))
PERMUTE = Spelling((torch.permute,), ("permute",))
RESHAPE = Spelling((torch.reshape,), ("reshape", "view"))
FLATTEN = Spelling((torch.flatten,), ("flatten",))
EXPAND = Spelling((), ("expand",))
UNSQUEEZE = Spelling((torch.unsqueeze,), ("unsqueeze",))
REPEAT_INTERLEAVE = Spelling((torch.repeat_interleave,), ("repeat_interleave",))
GETITEM = Spelling((operator.getitem,))
CAST = Spelling((), ("to", "type_as", "type", "float", "half", "bfloat16", "double", "bool"))
ONES = Spelling((torch.ones,), ("new_ones",))
ZEROS = Spelling((torch.zeros,), ("new_zeros",))
FULL = Spelling((torch.full,), ("new_full",))
TENSOR = Spelling((torch.tensor, torch.as_tensor, torch.scalar_tensor), ("new_tensor",))
TRIL = Spelling((torch.tril,), ("tril",))
TRIU = Spelling((torch.triu,), ("triu",))
EQ = Spelling((operator.eq, torch.eq), ("eq", "__eq__"))
LE = Spelling((operator.le, torch.le), ("le", "__le__"))
LT = Spelling((operator.lt, torch.lt), ("lt", "__lt__"))
GE = Spelling((operator.ge, torch.ge), ("ge", "__ge__"))
GT = Spelling((operator.gt, torch.gt), ("gt", "__gt__"))
AND = Spelling((operator.and_, torch.logical_and, torch.bitwise_and), ("logical_and", "bitwise_and", "__and__"))
ARANGE = Spelling((torch.arange,))
SUB = Spelling((operator.sub, torch.sub), ("sub", "__sub__"), neutral=(("alpha", 1),))
NE = Spelling((operator.ne, torch.ne), ("ne", "__ne__"))
LOGICAL_NOT = Spelling((torch.logical_not, operator.invert, torch.bitwise_not), ("logical_not", "bitwise_not", "__invert__"))
SAME_VALUES = Spelling((torch.clone,), ("contiguous", "clone"))  # a copy, or x itself
IN_PLACE_MUL = Spelling((operator.imul,))
IN_PLACE_DIV = Spelling((operator.itruediv,))
IN_PLACE_ADD = Spelling((operator.iadd,))
IN_PLACE_SUB = Spelling((operator.isub,))
"""`s *= c`, `s /= c`, `s += mask` (the gpt-oss reference's scores), `kv_arange += kv_offset` (transformers 4's mask
builders): the same values as MUL, DIV, ADD, SUB, for the matchers that check the written tensor has no other reader
(`sole_update`)."""
CAT = Spelling((torch.cat, torch.concat, torch.concatenate), ("cat",))
MAX = Spelling((torch.max,), ("max",))
AMAX = Spelling((torch.amax,), ("amax",))
LOGSUMEXP = Spelling((torch.logsumexp,), ("logsumexp",))
SIGMOID = Spelling((torch.sigmoid, F.sigmoid), ("sigmoid",))


def sole_update(node: Node) -> bool:
    """Whether `node` updates in place a tensor that nothing else reads: every later read goes through its result,
    so it computes what the out-of-place op would."""
    return bool(node.args) and isinstance(node.args[0], Node) and len(node.args[0].users) == 1


def arg(node: Node, index: int, name: str, default=_MISSING):
    """Argument `name` of a call, given positionally at `index` (the tensor itself is index 0) or by keyword."""
    if len(node.args) > index:
        return node.args[index]
    if name in node.kwargs:
        return node.kwargs[name]
    if default is _MISSING:
        raise KeyError(f"{node.format_node()} has no argument {name}")
    return default


def value(node):
    """The example value (FakeTensor, SymInt, ...) Dynamo recorded for a node, or the constant itself."""
    if isinstance(node, Node):
        return node.meta.get("example_value", node.meta.get("val"))
    return node


def shape(node) -> tuple:
    return tuple(value(node).shape)


def same_size(a, b) -> bool:
    """True when two sizes (ints or SymInts) are provably equal, without adding guards."""
    return statically_known_true(a == b)


def equal_size(a, b) -> bool:
    """Two sizes equal for this graph: provably, or for its example sizes under a guard (a later call where they
    differ recompiles); backed symbols only."""
    return same_size(a, b) or (guardable(a, b) and guard_or_false(a == b))


def guardable(*sizes) -> bool:
    """Static sizes, or symbolic ones whose comparisons can still add a guard: backed by an input's size (a
    data-dependent one cannot be compared at compile time), and Dynamo has not built its guards yet (a backward
    compiled lazily, after them, would have the guard dropped with a warning: unsound)."""
    return all(not isinstance(size, (torch.SymInt, torch.SymFloat))
               or (not free_unbacked_symbols(size) and not size.node.shape_env.frozen) for size in sizes)


def size_hint(size):
    """A size's value for the call being compiled (a symbolic size carries it)."""
    return size.node.hint if isinstance(size, (torch.SymInt, torch.SymFloat)) else size


def is_getattr(node, attribute: str) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target is getattr and node.args[1] == attribute


def normalize_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def transposed_last_two(node) -> Node | None:
    """The tensor x when node is x with its last two dims swapped (`x.mT`, `x.transpose(-2, -1)`, a permute). Dynamo
    records `x.mT` as a getattr before torch 2.14, as `aten.mT` from 2.14."""
    if is_getattr(node, "mT") or is_call(node, torch.ops.aten.mT, torch.ops.aten.mT.default):
        return node.args[0]
    if TRANSPOSE(node):
        ndim = len(shape(node))
        dims = {normalize_dim(arg(node, 1, "dim0"), ndim), normalize_dim(arg(node, 2, "dim1"), ndim)}
        if dims == {ndim - 2, ndim - 1}:
            return node.args[0]
    if PERMUTE(node):
        dims = node.args[1] if isinstance(node.args[1], (tuple, list)) else node.args[1:]
        ndim = len(dims)
        swapped = list(range(ndim - 2)) + [ndim - 1, ndim - 2]
        if [normalize_dim(d, ndim) for d in dims] == swapped:
            return node.args[0]
    return None


def scalar(x) -> float | None:
    """A Python number argument as a float, None for tensors, nodes and symbolic values."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def number(x) -> float | None:
    """A Python number argument as a float, or the number a node holds as a 0-d tensor made from one
    (`torch.tensor(c)`, `torch.full([], c)`: transformers 4's mask values); None otherwise."""
    if not isinstance(x, Node):
        return scalar(x)
    c = None
    if is_call(x, torch.tensor, torch.scalar_tensor, torch.as_tensor) and x.args:
        c = scalar(x.args[0])
    elif is_call(x, torch.full) and len(x.args) >= 2 and isinstance(x.args[0], (list, tuple)) and not x.args[0]:
        c = scalar(x.args[1])
    v = value(x)
    if c is None or not isinstance(v, torch.Tensor) or v.dim() != 0:
        return None
    return float(torch.tensor(c, dtype=v.dtype)) if v.dtype.is_floating_point else c  # as rounded to its dtype


def is_zero(x) -> bool:
    """A number argument that is 0: a Python number, or a node of a symbolic one (a float `dynamic=True` leaves
    unspecialized, such as HF's attention dropout) that is 0 for this graph, under a guard (a later call where it is
    not recompiles)."""
    if isinstance(x, Node):
        v = value(x)
        return isinstance(v, (torch.SymFloat, torch.SymInt)) and guardable(v) and guard_or_false(v == 0)
    return scalar(x) == 0.0


HIDING_FILL = -1e4
"""The largest value a masking step may overwrite scores with to hide their keys (-inf, finfo.min, the Annotated
Transformer's -1e9, old GPT-2 code's -1e4): next to a visible score s such a key weighs exp(fill - s) of it, below
float32's resolution for any s above fill + 17, and a row of nothing but the fill is uniform, as one of finfo.min is."""


def hides_keys(fill) -> bool:
    """A fill that hides the keys whose scores a masking step overwrites with it (`HIDING_FILL`)."""
    f = scalar(fill)
    return f is not None and f <= HIDING_FILL


def is_large_negative(fill) -> bool:
    """-inf, or the most negative finite value of a floating dtype (`torch.finfo(dtype).min`)."""
    f = scalar(fill)
    if f is None:
        return False
    return f == -math.inf or f in {torch.finfo(d).min for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def single_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def module_path(node: Node) -> str:
    """The path of the innermost module that produced a node ("model.layers.0.self_attn"), "" outside modules."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return re.sub(r"^L\['[^']*'\]\.?", "", path)


TORCH_SOURCES = os.path.dirname(torch.__file__) + os.sep


def location(node: Node) -> str:
    """`file:line in function` of the model code that produced a node, from Dynamo's stack trace: its innermost
    frame outside torch's own Python (which Dynamo traces into: flex_attention's wrapper)."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip().startswith("File ")]
    if not lines:
        return "<unknown>"
    outside = [line for line in lines if f'"{TORCH_SOURCES}' not in line]
    last = (outside or lines)[-1]  # File "path", line N, in fn
    try:
        path = last.split('"')[1]
        rest = last.split('"')[2].strip(", ")
        line_no = rest.split(",")[0].replace("line ", "")
        func = rest.split(" in ")[-1]
        return f"{path.rsplit('/', 1)[-1]}:{line_no} in {func}"
    except IndexError:
        return last


# Aten-level helpers of the POST_GRAD families (quantized linears): their graphs hold OpOverloads, not spellings.

def is_call(node, *targets) -> bool:
    """node calls one of `targets` (OpOverloads)."""
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def dtype_of(node) -> torch.dtype:
    return value(node).dtype


def is_transpose_2d(node) -> bool:
    """permute(x, [1, 0]) (or [-1, -2])."""
    return is_call(node, torch.ops.aten.permute.default) and [d % 2 for d in node.args[1]] == [1, 0]


def is_pointwise(node: Node) -> bool:
    """An aten / prims op tagged pointwise (convert_element_type is)."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and \
        torch.Tag.pointwise in node.target.tags


def evaluated(root: Node, leaf: Node, probe: torch.Tensor) -> torch.Tensor:
    """`root` computed from `probe` in place of `leaf`, on CPU, by running its (pointwise) nodes."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    gm = root.graph.owning_module
    env = {leaf: probe}

    def run(node):
        if node not in env:
            if node.op == "get_attr":
                env[node] = getattr(gm, node.target).detach().cpu()
            else:
                args, kwargs = map_arg((node.args, node.kwargs), run)
                if "device" in kwargs:
                    kwargs = {**kwargs, "device": torch.device("cpu")}
                env[node] = node.target(*args, **kwargs)
        return env[node]

    with unset_fake_temporarily(), torch.no_grad():
        return run(root)


def describe_node(node) -> str:
    """"le (le_1)": a node's target and name, for decline reasons."""
    if not isinstance(node, Node):
        return repr(node)
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return f"{target} ({node.name})"


def describe_operand(operand) -> str:
    """"a bfloat16 tensor of shape [4, 8]" or "the number 2.0", for decline reasons."""
    if isinstance(operand, Node):
        return f"a {dtype_name(dtype_of(operand))} tensor of shape {list(shape(operand))}"
    return f"the number {operand}"

