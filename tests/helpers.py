"""Test helpers: a recording backend, float64 comparisons, tiny transformers models."""

from __future__ import annotations

import copy
import importlib
import logging
import re
from unittest import mock

import pytest
import torch
from torch._inductor.compile_fx import compile_fx
from torch._inductor.utils import run_and_get_code

import fa4_inductor
from fa4_inductor import report
from fa4_inductor.backend import inductor_config_patches
from fa4_inductor.kernels import COMPUTED_ONCE
from fa4_inductor.lowering import post_grad
from fa4_inductor.report import _format_value, _target_name
from fa4_inductor.lowering import run_torch_ir_passes


class Recorder(fa4_inductor.Backend):
    """Runs the backend's rewrites and keeps each rewritten graph and its records.

    `inductor=False` runs the rewritten graph eagerly (fast: graph-capture tests); True hands it to
    Inductor as the real backend does (numerics of compiled code)."""

    def __init__(self, inductor: bool = False, **options):
        super().__init__(fa4_inductor.Options(**options))
        self.inductor = inductor
        self.graphs: list[torch.fx.GraphModule] = []
        self.inserted: list[list[torch.fx.Node]] = []  # per graph: the nodes the rewrites added, in graph order
        self.records = []

    def __call__(self, gm, example_inputs, mode=None, options=None):
        before = set(gm.graph.nodes)
        records = run_torch_ir_passes(gm, example_inputs, self.options)
        # the rotary tables' fa4::computed_once (test_rotary_tables.py) left out: the summaries show the families' work
        self.inserted.append([n for n in gm.graph.nodes if n not in before and n.target is not COMPUTED_ONCE])
        for node in gm.graph.find_nodes(op="placeholder"):  # Dynamo drops the sources once the backend returns
            node.meta["user_name"] = input_name(node)
        compiled = gm.forward
        if self.inductor:
            compiled = compile_fx(gm, example_inputs, config_patches=inductor_config_patches(mode, options))
        self.records += records
        self.graphs.append(gm)
        return compiled

    @property
    def summary(self) -> str:
        """What the rewrites added to each graph (`rewritten_nodes`), graphs separated by a blank line."""
        return "\n\n".join(rewritten_nodes(nodes) for nodes in self.inserted)

    @property
    def full_summary(self) -> str:
        """Every call of every graph, under Dynamo's names (`fa4_inductor.graph_summary`)."""
        return "\n\n".join(fa4_inductor.graph_summary(g) for g in self.graphs)

    @property
    def reasons(self) -> list[str]:
        return [r.detail for r in self.records if not r.rewritten]

    def calls(self, graph, op="fa4::attention") -> list[torch.fx.Node]:
        """The calls of `op` (a qualified name) in one graph."""
        return [n for n in graph.graph.nodes if isinstance(n.target, torch._ops.OpOverload) and n.target.name() == op]

    def count(self, op="fa4::attention") -> int:
        return sum(len(self.calls(g, op)) for g in self.graphs)


def input_name(node: torch.fx.Node) -> str:
    """A graph input by the name the user's code gives it (`q`, `self.kv_cache.k_cache`, `kwargs['mask']`),
    read from Dynamo's source of the placeholder; Dynamo's own name where it has none."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None:
        return node.name
    name = source.name() if callable(source.name) else source.name  # a method before torch 2.12
    name = re.sub(r"\._(?:modules|buffers|parameters)\['(\w+)'\]", r".\1", name)
    return re.sub(r"^L\['(\w+)'\]", r"\1", name)


def rewritten_nodes(nodes: list[torch.fx.Node]) -> str:
    """One line per node a rewrite added (the `fa4::` calls and what it built around them: seqused_k, key
    masks, run-time checks, layout fixes), `name: type = op(args, key=value)`, named stably: the added nodes by
    the rewrite's name for them, numbered in order of appearance (`ge`, `ge_1`, not Dynamo's graph-wide
    counters); graph inputs by their user-facing name (`input_name`); other nodes of the model's graph by what
    computes them, three calls deep (`.transpose(.view(getitem(..., 0), 2, 10, 2, 16), 1, 2)`)."""
    names, used = {}, {}
    for node in nodes:
        base = re.sub(r"_\d+$", "", node.name)
        names[node] = base if base not in used else f"{base}_{used[base]}"
        used[base] = used.get(base, 0) + 1

    def fmt(a, depth=3) -> str:
        if isinstance(a, torch.fx.Node):
            if a in names:
                return names[a]
            if a.op == "placeholder":
                return a.meta.get("user_name", a.name)
            if depth == 0:
                return "..."
            args = [fmt(x, depth - 1) for x in a.args] + [f"{k}={fmt(v, depth - 1)}" for k, v in a.kwargs.items()]
            return f"{_target_name(a)}({', '.join(args)})"
        if isinstance(a, float):
            return f"{a:.6g}"
        if isinstance(a, (tuple, list)):
            return "(" + ", ".join(fmt(x, depth) for x in a) + ")"
        if isinstance(a, slice):
            parts = [fmt(x, depth) if x is not None else "" for x in (a.start, a.stop)]
            return ":".join(parts) + (f":{fmt(a.step, depth)}" if a.step is not None else "")
        if isinstance(a, torch.dtype):
            return str(a).removeprefix("torch.")
        return repr(a)

    lines = []
    for node in nodes:
        args = [fmt(a) for a in node.args] + [f"{k}={fmt(v)}" for k, v in node.kwargs.items()]
        val = node.meta.get("example_value", node.meta.get("val"))
        lines.append(f"{names[node]}: {_format_value(val)} = {_target_name(node)}({', '.join(args)})")
    return "\n".join(lines)


def compile_and_record(fn, *args, inductor=False, **options):
    torch._dynamo.reset()
    recorder = Recorder(inductor=inductor, **options)
    out = torch.compile(fn, backend=recorder, fullgraph=True)(*args)
    return recorder, out


def module_call_against_float64(module, *args, call=None, atol=1e-5, rtol=1e-5):
    """The recorder of `call(module, *args)` (default: `module(*args)`, compiled as the module itself, so the graph
    keeps its input names) compiled with it (no gradients), after checking the compiled output against the same call
    on a float64 copy of `module` with the floating inputs in float64."""
    compiled = module if call is None else lambda *inputs: call(module, *inputs)
    reference_call = call or (lambda m, *inputs: m(*inputs))
    with torch.no_grad():
        recorder, out = compile_and_record(compiled, *args)
        reference = reference_call(copy.deepcopy(module).double(),
                                   *(a.double() if a.is_floating_point() else a for a in args))
    torch.testing.assert_close(out.double(), reference, atol=atol, rtol=rtol)
    return recorder


def recording_compile(fn, *, inductor=False, **compile_options):
    """A fresh Dynamo and (Recorder, fn compiled with it as `torch.compile(fn, backend=recorder, **compile_options)`),
    for a test that calls the compiled function more than once."""
    torch._dynamo.reset()
    recorder = Recorder(inductor=inductor)
    return recorder, torch.compile(fn, backend=recorder, **compile_options)


def assert_close_to_reference(actual, expected_fn, *args, atol=None, rtol=None):
    """`actual` matches fn(*args) computed in float64."""
    ref = expected_fn(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args])
    torch.testing.assert_close(actual.double(), ref, atol=atol, rtol=rtol)


# the start of the records of lowering/crossover.py's routes to what default compile runs (CUDA): SDPA, or the
# attention as written
CROSSOVER_ROUTES = ("F.scaled_dot_product_attention(", "a small attention ", "a decode step ",
                    "a short attention in padded training ")


def loss_and_gradients(fn, model, inputs: dict) -> list:
    """One training step of `model` through `fn` (the model or its compiled form): [the loss, then each parameter's
    gradient, None where none reaches it]."""
    model.zero_grad(set_to_none=True)
    loss = fn(**inputs).loss
    loss.backward()
    return [loss.detach()] + [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def error_to_float64(got: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest error of `got` against a float64 `reference`, relative to the reference's largest magnitude (at
    least 1e-6: a gradient that is 0 in exact arithmetic)."""
    return (got.double() - reference).abs().max().item() / max(reference.abs().max().item(), 1e-6)


def assert_as_close_as_eager(key: str, got: torch.Tensor, eager: torch.Tensor, reference: torch.Tensor,
                             slack: float) -> None:
    """`got` (ours) at most twice eager's error against the float64 `reference`, plus `slack` (`error_to_float64`).
    A gradient that is 0 in exact arithmetic (a key projection's bias, which the softmax cancels: float64 leaves
    ~1e-10) is float32 rounding noise in both, which moves with the order of the sums: there ours must stay noise,
    within 1e-8 absolutely."""
    if reference.abs().max().item() < 1e-8:
        error = (got.double() - reference).abs().max().item()
        assert error < 1e-8, f"{key}: {error:.2e} where the exact gradient is 0"
        return
    ours, theirs = error_to_float64(got, reference), error_to_float64(eager, reference)
    assert ours <= 2 * theirs + slack, f"{key}: error {ours:.2e} against eager's {theirs:.2e}"


def tiny(name, attn_implementation):
    """A tiny transformers model (`fa4_inductor.hf`). Skips the test where transformers is missing or has no such
    model type (Gemma 4 before 5.x), or where its model class declares no such attention code (`hf.unsupported`,
    decided before building: a model that fails to build fails the test)."""
    transformers = pytest.importorskip("transformers")
    from fa4_inductor import hf

    if name not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
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


class PostGradCompiled:
    """A function compiled by the backend with Inductor: its output, its forward's generated code, the
    aten graphs after our post-grad passes (`fa4_inductor.graph_summary`; each checked by `Graph.lint`) and the
    published records. `compile_options` go to `torch.compile` (`dynamic=True`)."""

    def __init__(self, fn, *args, backend, **compile_options):
        torch._dynamo.reset()
        self.graphs = []
        passes = post_grad.PostGradPasses.__call__

        def capturing(pass_self, graph):
            passes(pass_self, graph)
            graph.lint()  # every node after its inputs, as Inductor's later passes expect
            self.graphs.append(fa4_inductor.graph_summary(graph.owning_module))

        with mock.patch.object(post_grad.PostGradPasses, "__call__", capturing), report.collecting() as records:
            self.out, codes = run_and_get_code(torch.compile(fn, backend=backend, **compile_options), *args)
        self.code, self.records = codes[0], records

    @property
    def details(self) -> list[tuple[bool, str]]:
        return [(r.rewritten, r.detail) for r in self.records]


def one_row_matmuls_decomposed():
    """Inductor's decomposition of a one-row `mm` into a multiply and a sum in float32, which it applies on CUDA
    when `coordinate_descent_tuning` is on (torchao's `quantize_` turns it on), applied on the CPU too: the
    decomposition's own wrapper (`pw_cast_for_opmath`) around its own expression (lowering/gemv.py)."""
    from torch._inductor import decomposition

    @decomposition.pw_cast_for_opmath
    def one_row_mm(x, w, out_dtype=None):
        if out_dtype is None and x.shape[0] == 1:
            return (x.unsqueeze(2) * w.unsqueeze(0)).sum(dim=1)
        return NotImplemented

    # Inductor reads a table merged once per process (`fast_random_decomps`, cached): patch that one.
    table = {**decomposition.fast_random_decomps(), torch.ops.aten.mm.default: one_row_mm}
    return mock.patch.object(decomposition, "fast_random_decomps", lambda: table)


def compiled_one_row_decomposed(fn, x, backend, family_off, op_call: str):
    """fn(x) compiled under Inductor's one-row decomposition (`one_row_matmuls_decomposed`) with `backend`, and with
    `family_off` (the quantized family off), checking that the decomposition reaches our stage (a sum and no mm
    without the family) and that `backend` calls `op_call` in place of the sum. Returns (compiled, the eager
    output)."""
    with one_row_matmuls_decomposed(), torch.no_grad():
        compiled = PostGradCompiled(fn, x, backend=backend)
        decomposed_only = PostGradCompiled(fn, x, backend=family_off)
        expected = fn(x)
    assert "aten.sum(" in decomposed_only.graphs[0] and "aten.mm(" not in decomposed_only.graphs[0]
    assert "aten.sum(" not in compiled.graphs[0] and op_call in compiled.code
    return compiled, expected


def assert_within_int8_int8_bound(out, x_int8, x_scale, w_int8, w_scale, bias):
    """An int8 x int8 linear's result with its two scales applied in either order, each product rounded to bf16 once
    (and the result once more): within a bf16 rounding of the scaled product plus one of the result, from float64."""
    product = (x_int8.double() @ w_int8.double().T) * x_scale.double().reshape(-1, 1) * w_scale.double()
    exact = product if bias is None else product + bias.double()
    bound = 2 ** -8 * (product.abs() * 1.01 + exact.abs()) + 1e-6
    assert ((out.double() - exact).abs() <= bound).all(), (out.double() - exact).abs().max()


class SiblingLinearsBlock(torch.nn.Module):
    """A decoder layer's projections for the sibling-linears tests: q / k / v (rows `qkv`) of one normed x, q
    reshaped before k and v are computed (so a grouped call must move what reads q after it), then gate / up (128
    rows) of another, and a lone down projection; `linear(n, k)` makes each (a quantized linear module)."""

    def __init__(self, linear, k=64, qkv=(48, 16, 16)):
        super().__init__()
        torch.manual_seed(0)
        self.k_features = k
        self.q, self.k, self.v = (linear(n, k) for n in qkv)
        self.gate, self.up, self.down = linear(128, k), linear(128, k), linear(k, 128)

    def forward(self, x):
        k_features = self.k_features
        h = torch.nn.functional.rms_norm(x, (k_features,))
        q = self.q(h).view(*x.shape[:-1], 3, 16).transpose(-2, -3)
        k, v = self.k(h), self.v(h)
        a = x + (q.sum(-3) + k * v).repeat(1, 1, k_features // 16)
        h2 = torch.nn.functional.rms_norm(a, (k_features,))
        return a + self.down(torch.nn.functional.silu(self.gate(h2)) * self.up(h2))


MOE_GRAPH_BREAKS_ON_TRANSFORMERS_4 = {"gpt_oss", "mixtral"}
"""transformers 4.57's MoE routing breaks the graph under any backend: a forward is many graphs, and Dynamo runs a frame
it cannot resume after the break eagerly, so some attention layers never reach a compiled graph."""


def layers_reaching_graphs(name: str, layers: int, counted: int) -> bool:
    """Whether `counted` attention layers are all that reach compiled graphs of `layers`: every one, or on 4.57 some
    (`MOE_GRAPH_BREAKS_ON_TRANSFORMERS_4`)."""
    from fa4_inductor import hf

    if hf.transformers_major() < 5 and name in MOE_GRAPH_BREAKS_ON_TRANSFORMERS_4:
        return 1 <= counted <= layers
    return counted == layers


class Messages(logging.Handler):
    """The (level name, message) of each record of a logger (pytest's log capture is off in this suite:
    pyproject.toml)."""

    def __init__(self, level=logging.WARNING):
        super().__init__(level)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))


def from_torchao_hints(monkeypatch, model, x, compiles=1, **options) -> list[tuple[str, str]]:
    """(level name, message) of each log record of the backend that names a `from_torchao`, over `compiles` compiles
    of `model(x)` with `fa4_inductor.backend(**options)` (its once-a-process hint re-armed first)."""
    monkeypatch.setattr(importlib.import_module("fa4_inductor.backend"), "_HINTED", [])
    handler = Messages(logging.INFO)
    logger = logging.getLogger("fa4_inductor")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        for _ in range(compiles):
            torch._dynamo.reset()
            with torch.no_grad():
                torch.compile(model, backend=fa4_inductor.backend(**options))(x)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return [(name, m) for name, m in handler.records if "from_torchao" in m]
