"""The post-grad stage: POST_GRAD families on Inductor's aten graphs, through `post_grad_custom_pre_pass`.

First it points `fa4::attention` calls at `fa4::attention_forward` (no autograd layer on the host path) and
folds transposes that undo each other (`graph_edit.fold_identity_permutes`).
Inductor calls the hook once for the forward graph and once for the backward graph of each compiled
region, before its own post-grad patterns (which would otherwise turn a weight-only int8 linear into
`_weight_int8pack_mm` first). The hook's object must say what it does in `uuid()`: the FX graph cache
keys compiled code by it, so it hashes the source of every module whose behaviour reaches the rewritten
graph (lowering and kernels: the op schemas and fake implementations), the backend's options and any
user pass it runs after its own. An unchanged install hits the cache; an edited one misses it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

from torch._guards import detect_fake_mode
from torch._inductor.custom_graph_pass import CustomGraphPass

from ..kernels import ATTENTION, ATTENTION_FORWARD
from .family import POST_GRAD, Context
from .graph_edit import fold_identity_permutes
from .records import Record

log = logging.getLogger("fa4_inductor.lowering")

HOOK = "post_grad_custom_pre_pass"


@functools.cache
def source_hash() -> str:
    """A digest of the lowering and kernel sources (this package's behaviour as far as graphs see it)."""
    from .. import kernels

    digest = hashlib.sha256()
    for folder in (Path(__file__).parent, Path(kernels.__file__).parent):
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def without_autograd(graph) -> int:
    """Point every `fa4::attention` call at `fa4::attention_forward`, its twin without an autograd formula:
    AOTAutograd has written the backward out as its own graph, and compiled graphs run with no gradient
    to record. Returns how many calls changed."""
    calls = [n for n in graph.nodes if n.op == "call_function" and n.target is ATTENTION]
    for node in calls:
        node.target = ATTENTION_FORWARD
    return len(calls)


class PostGradPasses(CustomGraphPass):
    """`fa4::attention` calls made `fa4::attention_forward`, the POST_GRAD families, the groupings of their calls
    (`passes.GROUPINGS`), then the pass the user had set on the same hook (if any)."""

    def __init__(self, options, user_pass=None):
        self.options, self.user_pass = options, user_pass
        self.records: list[Record] = []
        self.graphs = 0  # graphs this pass saw; none when Inductor served the code from its caches

    def __call__(self, graph) -> None:
        from .passes import FAMILIES, GROUPINGS, run_families

        self.graphs += 1
        gm = graph.owning_module
        without_autograd(graph)
        fold_identity_permutes(graph)
        fake_mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes if "val" in n.meta])
        context = Context(gm, self.options, fake_mode)
        records = run_families(context, POST_GRAD, FAMILIES)
        for grouping in GROUPINGS:  # each over what the ones before wrote
            records += run_families(context, POST_GRAD, (grouping,))
        for record in records:
            log.debug("%s", record)
        self.records += records
        if self.user_pass is not None:
            self.user_pass(graph)

    def uuid(self) -> str:
        user = self.user_pass.uuid() if hasattr(self.user_pass, "uuid") else repr(self.user_pass)
        return f"fa4_inductor:{source_hash()}:{self.options!r}:{user}"
