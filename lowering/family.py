"""What a pattern family is to the pass that runs it (passes.py), and what that pass hands each rewrite."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from torch.fx import GraphModule, Node

from .mutations import Mutations

TORCH_IR = "torch_ir"  # the Dynamo graph, before AOTAutograd: rewrites there also serve training
POST_GRAD = "post_grad"  # Inductor's aten graphs, forward and backward, before its own post-grad patterns


@dataclass(frozen=True)
class Family:
    """A family of subgraphs rewritten into one kind of `fa4::` op call.

    `is_candidate(node)` picks the nodes a subgraph of the family ends in (cheap: it sees every node);
    `rewrite(node, context)` rewrites the subgraph there and returns the record text (the op call), raises
    `Decline` with the reason it stays as written, or returns None when the node is not one after all."""

    name: str  # in records and `explain`; also the `Options` field that turns the family off, if it has one
    stage: str  # TORCH_IR or POST_GRAD
    is_candidate: Callable[[Node], bool]
    rewrite: Callable[[Node, "Context"], str | None]

    def enabled(self, options) -> bool:
        return getattr(options, self.name, True)


@dataclass
class Context:
    """One graph's rewriting state, shared by every rewrite in it."""

    gm: GraphModule
    options: object
    fake_mode: object
    constants: dict = field(default_factory=dict)  # module-buffer placeholders -> (name, real tensor)
    shared: dict = field(default_factory=dict)  # nodes built once per graph (positions, key masks, checks)
    read_by_value: set = field(default_factory=set)  # module buffers a rewrite depends on the contents of
    mutations: Mutations = None

    def __post_init__(self):
        if self.mutations is None:
            self.mutations = Mutations(self.gm.graph)
