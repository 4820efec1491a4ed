"""NVFP4 weight-only linears -> `fa4::nvfp4_linear`, on Inductor's aten graphs (POST_GRAD).

Matched at the matmul; its weight operand is walked back to the packed codes, the block scales and the
global scale. w_fp4 is a uint8 [N, K / 2] graph input (a parameter or buffer; two e2m1 codes a byte), the
block scales any float8_e4m3fn [N, K / 16] value, the global scale any 0-d float32 value. With a 3-D x,
`reshape(x, [M, K])` comes before the matmul and the op takes the 2-D x in its place.

    unpack:  cat([unsqueeze(lo(w_fp4), -1), unsqueeze(hi(w_fp4), -1)], -1) | stack([lo, hi], -1)
             -> reshape(., [N, K])                                     the codes, input 2i from the low nibble
    decode:  a pointwise function of the codes, float32 [N, K]        (bit tricks, where, a constant table...)
    scale:   mul(global, convert(block_e4m3, float32)) | convert(block_e4m3, float32)     [N, K / 16]
    weight:  mul(reshape(decoded, [N, K / 16, 16]), reshape(scale, [N, K / 16, 1]))       float32
             -> reshape(., [N, K]) [-> convert_element_type(., x.dtype)] -> permute([1, 0]) -> mm(x, .) | addmm(bias, x, .)
    becomes  nvfp4_linear(x, w_fp4, block_e4m3, global, bias)     (global: full([], 1.0) when there is none)
             [, quantize_activations=True]           under `backend(nvfp4_activations=True)`: W4A4 on Blackwell

    block_e4m3 = slice(view(permute(...(blocked))))  only layout ops, static sizes, from a graph input `blocked`
    becomes  nvfp4_linear(x, w_fp4, blocked, global, bias, scale_layout="blocked")
             when, evaluated on an index probe, the chain reads for each [n, g] exactly the element the 128 x 4
             blocked layout holds it in (`kernels.nvfp4_linear.blocked_index`): the op un-blocks once per tensor

torchao 0.18's `NVFP4WeightOnlyConfig` (`torchao.prototype.mx_formats`; an `NVFP4Tensor` weight, desugared by
AOTAutograd) spells the decode with shifts, masks and `index_put` into float32 bits, and its block scales are
un-swizzled from their blocked layout by reshapes, permutes and a slice of the stored scales; the op takes the
stored scales with `scale_layout="blocked"` instead, so that no copy kernel un-swizzles them at every call (a
chain of layout ops that reads anything else, a transposed or otherwise sliced tensor, feeds the op as before,
un-swizzled in the graph). `fa4_inductor.nvfp4.NVFP4Linear` spells the decode with integer arithmetic and `where`
(verified on CPU, torch 2.13; on CUDA torchao's dequantization is the same code, read from source, and
tests/test_gpu_nvfp4.py runs it).
User code may also look the values up in a constant table made in its forward. The unpack's nibble functions
and the decode are not matched op by op: they are checked by running them, on CPU, over every byte value and
every code (`evaluated`), so any pointwise spelling is taken and a wrong one (high nibble first, another
table) is not.

The op computes `(e2m1 * (global * float(block))).to(x.dtype)`, the order above; so the weight must be
dequantized in float32 with the scales' product taken first. Kept as written, with the reason: a weight
dequantized in another dtype or order (the global scale applied after the block scales, compressed-tensors'
division by its global scale), packed codes computed in the graph, the high nibble first, a decode that is
not pointwise or reads other graph inputs (a lookup table in a buffer), block scales of another shape, a
dequantized weight something else also reads (a training forward saves it), dtypes the op does not take.
"""

from __future__ import annotations

import math

import torch
from torch.fx import Node
from torch.utils import _pytree as pytree

from ..kernels import NVFP4_LINEAR, nvfp4_linear_gemv_reason, nvfp4_linear_rows_reason
from ..kernels import nvfp4_linear_unsupported_reason
from ..kernels.layout import dtype_name as _name
from ..kernels.nvfp4_linear import BLOCK, E2M1_VALUES, blocked_index, blocked_numel
from . import gemv
from .family import POST_GRAD, Context, Family
from .graph_edit import NodeMaker, decline_other_readers, erase_dead
from .records import Decline
from .spellings import describe_operand as _describe, dtype_of as _dtype, is_call as _is
from .spellings import evaluated, guardable, is_pointwise, is_transpose_2d as _is_transpose, shape, value

aten, prims = torch.ops.aten, torch.ops.prims
CONVERT = prims.convert_element_type.default
RESHAPES = (aten.reshape.default, aten.view.default, aten.unsqueeze.default, aten.squeeze.dim)
E4M3 = torch.float8_e4m3fn
# Ops a decode may use besides those tagged pointwise, each elementwise on the codes as `_region` admits them.
MASKED_WRITE, BITCAST, TABLE_LOOKUP = aten.index_put.default, aten.view.dtype, aten.index.Tensor
CONSTANTS = (aten.full.default, aten.scalar_tensor.default)
# Ops that move elements without computing any: what an un-swizzle of the block scales may use.
LAYOUT_OPS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.permute.default,
              aten.transpose.int, aten.slice.Tensor, aten.clone.default, aten.contiguous.default)


def _weight_of(matmul: Node) -> Node | None:
    """W of `x @ W^T` (or of Inductor's decomposed one-row matmul, `gemv.py`): the matmul's right operand is a
    permute([1, 0]) of it."""
    operand = gemv.right_operand(matmul)
    return operand.args[0] if operand is not None and _is_transpose(operand) else None


def _peel(node: Node, targets) -> tuple[Node, list[Node]]:
    peeled = []
    while _is(node, *targets):
        peeled.append(node)
        node = node.args[0]
    return node, peeled


def _reaches(node, dtype: torch.dtype, depth: int) -> bool:
    """Whether a tensor of `dtype` is among `node` and the nodes it is computed from, `depth` steps back."""
    frontier, seen = [node], set()
    for _ in range(depth + 1):
        for n in frontier:
            val = value(n)
            if isinstance(val, torch.Tensor) and val.dtype == dtype:
                return True
        seen.update(frontier)
        frontier = [i for n in frontier if n.op == "call_function" for i in n.all_input_nodes if i not in seen]
    return False


def _product(matmul: Node) -> Node | None:
    weight = _weight_of(matmul)
    if weight is None:
        return None
    product, _ = _peel(weight, (CONVERT, *RESHAPES))
    return product if _is(product, aten.mul.Tensor) else None


def is_candidate(node: Node) -> bool:
    """A matmul `x @ W^T` whose W is a product computed from e4m3 scales and uint8 codes."""
    product = _product(node)
    return product is not None and _reaches(product, E4M3, 6) and _reaches(product, torch.uint8, 12)


class Match:
    """A matched NVFP4 linear: the op's arguments and the nodes it replaces."""

    def __init__(self, matmul: Node):
        self.matmul = matmul
        self.x, self.bias = gemv.left_operand_and_bias(matmul)
        self.w_fp4 = self.block_scale = self.global_scale = None
        self.blocked_scale: Node | None = None  # the graph input block_scale un-blocks, where it is that
        self.chain: list[Node] = []  # the dequantized weight, from the scales' product to its transpose


def match(matmul: Node) -> Match:
    m = Match(matmul)
    x_dtype = _dtype(m.x)
    transpose = matmul.args[1] if matmul.target is aten.mm.default else matmul.args[2]
    weight = transpose.args[0]
    if _dtype(weight) != x_dtype:
        raise Decline(f"the matmul takes a {_name(x_dtype)} x and a {_name(_dtype(weight))} weight")
    product, after = _peel(weight, (CONVERT, *RESHAPES))
    m.chain = [transpose, *after, product]
    if _dtype(product) != torch.float32:
        raise Decline(f"the weight is dequantized in {_name(_dtype(product))}; the op dequantizes in float32")
    for cast in after:  # (Inductor's joint-graph `pointless_convert` already folds float casts in a row)
        if _is(cast, CONVERT) and cast.args[1] not in (x_dtype, torch.float32):
            raise Decline(f"the dequantized weight is rounded to {_name(cast.args[1])} on its way to a "
                          f"{_name(x_dtype)} matmul; the op rounds it once, to x's dtype")
    n, k = shape(weight)
    groups = k // BLOCK
    decoded_side, scale_side = _sides(product)
    if shape(product) != (n, groups, BLOCK) or shape(scale_side) != (n, groups, 1):
        raise Decline(f"the scales ({list(shape(scale_side))}) multiply the decoded weight as "
                      f"{list(shape(product))}, not one per {BLOCK} inputs ([{n}, {groups}, 1] against "
                      f"[{n}, {groups}, {BLOCK}])")
    _match_scale(m, _peel(scale_side, RESHAPES)[0], (n, groups))
    m.blocked_scale = _blocked_source(m.block_scale, n, groups)
    decoded, _ = _peel(decoded_side, RESHAPES)
    if shape(decoded) != (n, k) or _dtype(decoded) != torch.float32:
        raise Decline(f"the decoded weight is a {_name(_dtype(decoded))} tensor of shape {list(shape(decoded))}, "
                      f"not float32 [{n}, {k}]")
    m.w_fp4 = _match_decode(decoded)
    return m


def _sides(product: Node) -> tuple[Node, Node]:
    """(the decoded codes' operand, the scales' operand) of the weight's product."""
    a, b = product.args
    if not (isinstance(a, Node) and isinstance(b, Node)):
        raise Decline("the weight's product has a constant operand: no block scales")
    a_codes, b_codes = _reaches(a, torch.uint8, 12), _reaches(b, torch.uint8, 12)
    if a_codes == b_codes:
        raise Decline("the weight's product does not multiply the decoded codes by scales")
    codes, scales = (a, b) if a_codes else (b, a)
    inner, _ = _peel(codes, RESHAPES)
    if _is(inner, aten.mul.Tensor) and any(_reaches(n, E4M3, 6) for n in inner.all_input_nodes):
        raise Decline("the global scale multiplies the weight after the block scales, which rounds once; the op "
                      "rounds the scales' product first")
    return codes, scales


def _match_scale(m: Match, scale: Node, wanted: tuple) -> None:
    """scale = mul(global, convert(block, float32)) (either order) or convert(block, float32)."""
    if _is(scale, aten.div.Tensor):
        raise Decline("the block scales are divided by the global scale (compressed-tensors' dequantization), which "
                      "rounds differently from the op's product")
    if _is(scale, aten.mul.Tensor):
        a, b = scale.args
        block, global_scale = (a, b) if _is_e4m3_cast(a) else (b, a)
        if not (isinstance(global_scale, Node) and shape(global_scale) == () and _dtype(global_scale) == torch.float32):
            raise Decline(f"the block scales are multiplied by {_describe(global_scale)}, not a 0-d float32 global "
                          "scale")
        m.global_scale = global_scale
    else:
        block = scale
    if not (_is_e4m3_cast(block) and block.args[1] == torch.float32):
        raise Decline(f"the scales are {_describe(scale)}, not float8_e4m3fn block scales cast to float32")
    m.block_scale = block.args[0]
    if shape(m.block_scale) != wanted:
        raise Decline(f"the block scales have shape {list(shape(m.block_scale))}, not {list(wanted)}")


def _blocked_source(block: Node, n: int, groups: int) -> Node | None:
    """The graph input that `block` [n, groups] un-blocks from the 128 x 4 blocked layout through layout ops of
    static sizes alone (torchao's un-swizzle), or None: the index map the chain computes, evaluated on an int64
    arange shaped like the input, must be `blocked_index` exactly."""
    chain, node = [], block
    while _is(node, *LAYOUT_OPS) and node.all_input_nodes == [node.args[0]]:
        chain.append(node)
        node = node.args[0]
    if not chain or node.op not in ("placeholder", "get_attr") or _dtype(node) != E4M3:
        return None
    sizes = [s for c in (node, *chain) for s in shape(c)]
    constants = pytree.tree_leaves([(c.args[1:], c.kwargs) for c in chain])
    if any(isinstance(s, torch.SymInt) for s in (*sizes, *constants)):
        return None
    source_shape = shape(node)
    numel = 1
    for s in source_shape:
        numel *= s
    if numel != blocked_numel(n, groups):
        return None
    index = evaluated(block, node, torch.arange(numel).view(source_shape))
    return node if torch.equal(index, blocked_index(n, groups)) else None


def _is_e4m3_cast(node) -> bool:
    return _is(node, CONVERT) and _dtype(node.args[0]) == E4M3


def _region(root: Node, leaf_shape: tuple, is_leaf) -> tuple[set[Node], list[Node]]:
    """The leaves and nodes of the pointwise computation of `root` from the nodes `is_leaf` picks: every node
    between has the leaves' shape (or is a 0-d constant), so it is elementwise in them. Declines otherwise."""
    leaves, nodes, seen, work = set(), [], set(), [root]
    while work:
        node = work.pop()
        if node in seen:
            continue
        seen.add(node)
        if is_leaf(node):
            leaves.add(node)
            continue
        if node.op == "get_attr" or _is(node, *CONSTANTS):
            if shape(node) != ():
                raise Decline(f"the decode reads a constant of shape {list(shape(node))} ({node.name})")
            nodes.append(node)
            continue
        if node.op != "call_function":
            raise Decline(f"the decode reads {node.name}, a graph input besides the packed codes")
        if not (is_pointwise(node) or _is(node, MASKED_WRITE, BITCAST, TABLE_LOOKUP)):
            raise Decline(f"the decode computes {node.name} with {node.target}, not a pointwise function of the codes")
        if shape(node) != leaf_shape:
            raise Decline(f"the decode computes {node.name} of shape {list(shape(node))} from codes of shape "
                          f"{list(leaf_shape)}")
        inputs = node.all_input_nodes
        if _is(node, MASKED_WRITE):
            _, indices, values, *accumulate = node.args
            if len(indices) != 1 or shape(indices[0]) != leaf_shape or shape(values) != () or any(accumulate):
                raise Decline(f"the decode writes {node.name} through index_put with other than one full-shape mask")
        if _is(node, TABLE_LOOKUP):
            table, indices = node.args
            constant, _ = _peel(table, (aten.lift_fresh_copy.default, aten.clone.default))
            if constant.op != "get_attr" or len(indices) != 1 or len(shape(table)) != 1:
                raise Decline(f"the decode looks values up in {table.name}, not a constant 1-d table"
                              + (", a graph input: its values are unknown when compiling"
                                 if table.op == "placeholder" else ""))
            nodes.append(table)
            inputs = [indices[0]]
        nodes.append(node)
        work.extend(inputs)
    return leaves, nodes


def _match_decode(decoded: Node) -> Node:
    """The packed uint8 codes `decoded` is the e2m1 decode of, input 2i from byte i's low nibble."""
    n, k = shape(decoded)
    leaves, _ = _region(decoded, (n, k), _is_unpack)
    if len(leaves) != 1:
        raise Decline(f"the decoded weight is computed from {len(leaves)} unpacked code tensors, not one")
    codes = leaves.pop()
    if _dtype(codes).is_floating_point or _dtype(codes) == torch.bool:
        raise Decline(f"the unpacked codes are {_name(_dtype(codes))}, not integers")
    got = evaluated(decoded, codes, torch.arange(16, dtype=_dtype(codes)))
    if not torch.equal(got, torch.tensor(E2M1_VALUES)):
        raise Decline(f"the decode maps codes 0..15 to {got.tolist()}, not the e2m1 values")
    return _match_unpack(codes, n, k)


def _is_unpack(node: Node) -> bool:
    """reshape(cat([lo [N, K/2, 1], hi [N, K/2, 1]], -1) | stack([lo, hi], -1), [N, K])."""
    inner, _ = _peel(node, RESHAPES)
    if inner is node or not _is(inner, aten.cat.default, aten.stack.default) or len(inner.args[0]) != 2:
        return False
    dim = inner.args[1] if len(inner.args) > 1 else inner.kwargs.get("dim", 0)
    return dim in (-1, len(shape(inner)) - 1) and shape(inner)[-1] == 2


def _match_unpack(codes: Node, n: int, k: int) -> Node:
    inner, _ = _peel(codes, RESHAPES)
    halves = [_peel(h, RESHAPES)[0] if _is(inner, aten.cat.default) else h for h in inner.args[0]]
    if any(shape(h) != (n, k // 2) for h in halves):
        raise Decline(f"the codes are unpacked from halves of shapes {[list(shape(h)) for h in halves]}, not "
                      f"[{n}, {k // 2}]")
    packed = None
    got = []
    for half in halves:
        leaves, _ = _region(half, (n, k // 2), _is_packed_source)
        if len(leaves) != 1 or (packed is not None and leaves != {packed}):
            raise Decline("the two nibbles are not taken from one packed uint8 tensor")
        packed = next(iter(leaves))
        if _dtype(packed) != torch.uint8:
            raise Decline(f"the codes are unpacked from a {_name(_dtype(packed))} tensor, not uint8")
        got.append(evaluated(half, packed, torch.arange(256, dtype=torch.uint8)).long())
    byte = torch.arange(256)
    if torch.equal(got[0], byte >> 4) and torch.equal(got[1], byte & 15):
        raise Decline("the high nibble holds the even input; the op takes input 2i from the low nibble")
    if not (torch.equal(got[0], byte & 15) and torch.equal(got[1], byte >> 4)):
        raise Decline("the unpacked halves are not the low and high nibbles of each byte")
    if packed.op != "placeholder":
        raise Decline(f"the packed codes ({packed.name}) are computed in the graph, not a parameter or buffer")
    return packed


def _is_packed_source(node: Node) -> bool:
    """Where the walk back from a nibble stops: a graph input or a tensor computed otherwise than pointwise."""
    return node.op == "placeholder" or node.op == "call_function" and not is_pointwise(node) \
        and not _is(node, *CONSTANTS)


def _check_sole_users(m: Match) -> None:
    """The dequantized weight (the product, its reshapes and casts, its transpose) is read by nothing else."""
    decline_other_readers(m.chain, [*m.chain, m.matmul], (aten.permute.default, *RESHAPES),
                          lambda node: "dequantized weight")


def _check_supported(m: Match, w4a4: bool) -> None:
    if not all(isinstance(d, int) for d in shape(m.w_fp4)):
        raise Decline(f"the packed weight's shape {list(shape(m.w_fp4))} is symbolic")
    x = value(m.x)
    n, half_k = shape(m.w_fp4)
    if x.device.type == "cuda" and not guardable(math.prod(x.shape[:-1])):
        raise Decline(f"x has a symbolic row count ({'x'.join(map(str, x.shape[:-1]))}) that cannot be guarded "
                      "(data-dependent, or Dynamo's guards already built): on CUDA the op beats default compile only "
                      "for some row counts")
    reason = nvfp4_linear_unsupported_reason(x.device.type, x.dtype, 2 * half_k) or \
        nvfp4_linear_rows_reason(x, n, 2 * half_k, w4a4)
    if reason is not None:
        raise Decline(reason)
    if m.bias is not None and (_dtype(m.bias) != x.dtype or shape(m.bias) != (n,)):
        raise Decline(f"the bias is {_describe(m.bias)}, not [{n}] {_name(x.dtype)}")


def rewrite(node: Node, context: Context) -> str:
    with gemv.as_matmul(node, context) as matmul:
        m = match(matmul)
        w4a4 = getattr(context.options, "nvfp4_activations", False)
        _check_supported(m, w4a4)
        _check_sole_users(m)
        n, half_k = shape(m.w_fp4)
        gemv.keep_inductors_if_faster(node, matmul, context, nvfp4_linear_gemv_reason, value(m.x).device.type, n,
                                      2 * half_k)
    graph = context.gm.graph
    with graph.inserting_before(matmul):
        make = NodeMaker(graph, matmul, context.fake_mode)
        global_scale = m.global_scale
        if global_scale is None:
            global_scale = make(aten.full.default, [], 1.0, dtype=torch.float32, device=value(m.w_fp4).device)
        flags = {"quantize_activations": True} if w4a4 else {}
        if m.blocked_scale is not None:
            flags["scale_layout"] = "blocked"
        out = make(NVFP4_LINEAR, m.x, m.w_fp4, m.block_scale if m.blocked_scale is None else m.blocked_scale,
                   global_scale, m.bias, **flags)
    matmul.replace_all_uses_with(out)
    erase_dead(graph, [matmul])
    return _describe_call(m) + (" [activations to nvfp4 on Blackwell]" if w4a4 else "")


def _describe_call(m: Match) -> str:
    def dims(node):
        return "x".join(str(s) for s in shape(node))

    bias = f", bias[{dims(m.bias)}]" if m.bias is not None else ""
    global_scale = "global" if m.global_scale is not None else "no global"
    blocked = f" (read from {m.blocked_scale.name}'s blocked layout)" if m.blocked_scale is not None else ""
    return (f"fa4.nvfp4_linear(x[{dims(m.x)}] {_name(_dtype(m.x))}, w[{dims(m.w_fp4)}] uint8, "
            f"block_scale[{dims(m.block_scale)}] e4m3{blocked}, {global_scale} scale{bias})")


FAMILY = Family("nvfp4_linear", POST_GRAD, is_candidate, rewrite)
