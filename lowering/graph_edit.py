"""Editing a graph, Dynamo's (torch IR) or Inductor's (aten): making nodes with their example values,
placing code after a definition, erasing what a rewrite left dead. Shared by every pattern family."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.fx import Graph, Node

from .mutations import written
from .records import Decline
from .spellings import is_call, value


class NodeMaker:
    """Creates nodes at the graph's current insertion point with the graph's metadata (example values under
    the graph's fake mode, the replaced node's stack trace and module path): `make(target, *args, **kwargs)`, a string
    target being a Tensor method. The value goes where the replaced node keeps its own: Dynamo's
    `example_value`, or `val` in aten graphs."""

    def __init__(self, graph: Graph, original: Node, fake_mode):
        self.graph, self.original, self.fake_mode = graph, original, fake_mode

    def __call__(self, target, *args, name=None, **kwargs) -> Node:
        op = "call_method" if isinstance(target, str) else "call_function"
        node = self.graph.create_node(op, target, args, kwargs, name=name)
        node.meta["stack_trace"] = self.original.meta.get("stack_trace")
        if "nn_module_stack" in self.original.meta:
            node.meta["nn_module_stack"] = self.original.meta["nn_module_stack"]
        if self.fake_mode is not None:
            fake_args = torch.fx.node.map_arg(args, value)
            fake_kwargs = torch.fx.node.map_arg(kwargs, value)
            with self.fake_mode:
                if op == "call_method":
                    result = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    result = _fake_call(target, fake_args, fake_kwargs)
            aten_graph = "val" in self.original.meta and "example_value" not in self.original.meta
            node.meta["val" if aten_graph else "example_value"] = result
        return node


def open_calls(gm, fake_mode, target, bound, written) -> int:
    """Write each call of `target` in gm's graph that `bound(node)` takes (its arguments by name; None: left as it
    is) as what `written(make, arguments)` builds before it, and erase the call and what only it read. A call that
    returns a tuple has its first element replaced (its one reader, `call[0]`). Returns how many were written."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not target or (arguments := bound(node)) is None:
            continue
        with gm.graph.inserting_before(node):
            out = written(NodeMaker(gm.graph, node, fake_mode), arguments)
        replaced = next(iter(node.users)) if isinstance(value(node), tuple) else node
        replaced.replace_all_uses_with(out)
        inputs = list(node.all_input_nodes)
        if replaced is not node:
            gm.graph.erase_node(replaced)
        gm.graph.erase_node(node)
        erase_dead(gm.graph, inputs)
        done += 1
    return done


def _fake_call(target, args, kwargs):
    """target(*args, **kwargs) on fake values. A batched matmul goes through einsum, and a linear over 3 or more dims
    is made from its shape: torch 2.11's fake matmul of operands of 3 or more dims guards their symbolic sizes to the
    example's, a recompile for every new length."""
    if target in (operator.matmul, torch.matmul) and not kwargs and all(a.dim() >= 2 for a in args):
        return torch.einsum("...ij,...jk->...ik", *args).contiguous()
    if target is F.linear and args[0].dim() >= 3:
        x, weight = args[0], args[1]
        return x.new_empty((*x.shape[:-1], weight.shape[0]))
    return target(*args, **kwargs)


def copy_of_dynamo_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A graph module over a copy of gm's graph (the same parameters and submodules), with what Dynamo hangs on a
    graph and its placeholders for AOTAutograd: a rewrite that changes the placeholders works on a copy, as Dynamo
    reads its own graph's placeholders again after the backend returns."""
    graph = torch.fx.Graph()
    copies: dict[Node, Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    for node, copy in copies.items():
        if hasattr(node, "_dynamo_source"):
            copy._dynamo_source = node._dynamo_source
    new = torch.fx.GraphModule(gm, graph)
    new.meta.update(gm.meta)
    for name in ("_param_name_to_source", "_source_to_user_stacks"):
        if hasattr(gm, name):
            setattr(new, name, getattr(gm, name))
    return new


def erased(node: Node) -> bool:
    """Whether an earlier rewrite removed `node` from its graph (a list of nodes taken before it still holds it)."""
    return getattr(node, "_erased", False)


def removable(node: Node) -> bool:
    """A computation whose only effect is its value: no placeholder, output or attribute, no in-place write,
    nothing impure (random numbers, asserts)."""
    return node.op in ("call_function", "call_method") and not node.is_impure() and not written(node)


def erase_dead(graph: Graph, nodes) -> None:
    """Erase each of `nodes` that nothing uses any more, then whatever that leaves unused, transitively."""
    work = list(nodes)
    while work:
        node = work.pop()
        if erased(node) or node.users or not removable(node):
            continue
        inputs = list(node.all_input_nodes)
        graph.erase_node(node)
        work.extend(inputs)


def after_definition(node: Node) -> Node:
    """The node before which code reading `node` right after its definition goes (after all placeholders)."""
    after = node.next
    while after.op == "placeholder":
        after = after.next
    return after


def decline_other_readers(checked, replaced, passthrough: tuple, what) -> None:
    """Decline when a node of `checked` is also read by a node outside `replaced` (the rewrite would leave it
    computed anyway). `what(node)` names it in the reason ("dequantized weight"); a reader that reaches the
    graph's output through `passthrough` ops alone is a value a training forward saves for the backward."""
    for node in checked:
        others = [u for u in node.users if u not in replaced]
        if others:
            saved = any(_reaches_output(u, passthrough) for u in others)
            raise Decline(f"the {what(node)} ({node.name}) is also read by {', '.join(u.name for u in others)}"
                          + (", a graph output (a training forward saves it for the backward)" if saved else ""))


def _reaches_output(node: Node, passthrough: tuple) -> bool:
    while node.op != "output":
        if not is_call(node, *passthrough) or len(node.users) != 1:
            return False
        node = next(iter(node.users))
    return True


def fold_identity_permutes(graph: Graph) -> int:
    """Point the readers of `permute(permute(x, p), q)` whose dims compose to the identity at x (the same view: its
    shape and strides are x's), erasing what that leaves dead: a training graph transposes a tensor-subclass weight
    and its matmul transposes it back (torchao's `t()`), which would hide the weight's codes behind two views.
    Returns how many were folded."""
    permute = torch.ops.aten.permute.default
    folded = []
    for node in graph.find_nodes(op="call_function", target=permute):
        inner = node.args[0]
        if not (isinstance(inner, Node) and inner.op == "call_function" and inner.target is permute):
            continue
        p, q = list(inner.args[1]), list(node.args[1])
        if len(p) == len(q) and [p[d] for d in q] == list(range(len(q))):
            node.replace_all_uses_with(inner.args[0])
            folded.append(node)
    erase_dead(graph, folded)
    return len(folded)
