"""Test helpers: a recording backend, float64 comparisons, tiny transformers models."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.compile_fx import compile_fx

import fa4_inductor
from fa4_inductor.backend import inductor_config_patches
from fa4_inductor.lowering import run_torch_ir_passes


class Recorder(fa4_inductor.Backend):
    """Runs the backend's rewrites and keeps each rewritten graph and its records.

    `inductor=False` runs the rewritten graph eagerly (fast: graph-capture tests); True hands it to
    Inductor as the real backend does (numerics of compiled code)."""

    def __init__(self, inductor: bool = False, **options):
        super().__init__(fa4_inductor.Options(**options))
        self.inductor = inductor
        self.graphs: list[torch.fx.GraphModule] = []
        self.records = []

    def __deepcopy__(self, memo):
        return self  # HF's CompileConfig deep-copies its backend: the records must reach this object

    def __call__(self, gm, example_inputs, mode=None, options=None):
        records = run_torch_ir_passes(gm, example_inputs, self.options)
        compiled = gm.forward
        if self.inductor:
            compiled = compile_fx(gm, example_inputs, config_patches=inductor_config_patches(mode, options))
        self.records += records
        self.graphs.append(gm)
        return compiled

    @property
    def summary(self) -> str:
        return "\n\n".join(fa4_inductor.graph_summary(g) for g in self.graphs)

    @property
    def reasons(self) -> list[str]:
        return [r.detail for r in self.records if not r.rewritten]

    def calls(self, graph, op="fa4::attention") -> list[torch.fx.Node]:
        """The calls of `op` (a qualified name) in one graph."""
        return [n for n in graph.graph.nodes if isinstance(n.target, torch._ops.OpOverload) and n.target.name() == op]

    def count(self, op="fa4::attention") -> int:
        return sum(len(self.calls(g, op)) for g in self.graphs)


def compile_and_record(fn, *args, inductor=False, **options):
    torch._dynamo.reset()
    recorder = Recorder(inductor=inductor, **options)
    out = torch.compile(fn, backend=recorder, fullgraph=True)(*args)
    return recorder, out


def assert_close_to_reference(actual, expected_fn, *args, atol=None, rtol=None):
    """`actual` matches fn(*args) computed in float64."""
    ref = expected_fn(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args])
    torch.testing.assert_close(actual.double(), ref, atol=atol, rtol=rtol)


def tiny(name, attn_implementation):
    """A tiny transformers model (`fa4_inductor.hf`). Skips the test where transformers is missing, or where its
    model class declares no such attention code (`hf.unsupported`, decided before building: a model that fails
    to build fails the test)."""
    pytest.importorskip("transformers")
    from fa4_inductor import hf

    reason = hf.unsupported(name, attn_implementation)
    if reason is not None:
        pytest.skip(reason)
    return hf.build(name, attn_implementation)


def compile_and_run(fn, kwargs, **options):
    """A Recorder of fn compiled and called once on kwargs without gradients, and its output."""
    torch._dynamo.reset()
    recorder = Recorder(**options)
    with torch.no_grad():
        got = torch.compile(fn, backend=recorder)(**kwargs)
    return recorder, got
