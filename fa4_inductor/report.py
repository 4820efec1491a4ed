"""What the backend rewrote and what it kept, and why: `explain`, plus a readable graph summary."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch

from fa4_inductor.lowering import Record

from .backend import fa4_inductor as default_backend
from .publishing import collecting, publish

__all__ = ["PreparedMemory", "Report", "collecting", "explain", "graph_summary", "prepared_memory", "publish"]


@dataclass
class Report:
    records: list = field(default_factory=list)

    @property
    def rewritten(self) -> list[Record]:
        return [r for r in self.records if r.rewritten]

    @property
    def kept(self) -> list[Record]:
        return [r for r in self.records if not r.rewritten]

    def __str__(self) -> str:
        head = f"fa4_inductor: {len(self.rewritten)} rewritten, {len(self.kept)} kept as written"
        return "\n".join([head] + [f"  {r}" for r in self.records])


@dataclass
class PreparedMemory:
    """Memory the ops hold beside the model's own weights: each weight a kernel reads in its own layout, prepared
    once (and again after the weight changes; `kernels/prepared_weights.py`), as (weight shape, layout, bytes)."""

    rows: list

    @property
    def total_bytes(self) -> int:
        return sum(nbytes for _, _, nbytes in self.rows)

    def __str__(self) -> str:
        head = f"fa4_inductor: {len(self.rows)} prepared weights, {self.total_bytes / 2 ** 20:.1f} MiB"
        return "\n".join([head] + [f"  {list(shape)} {kind}: {nbytes / 2 ** 20:.2f} MiB"
                                    for shape, kind, nbytes in self.rows])


def prepared_memory() -> PreparedMemory:
    """What `PreparedMemory` says, for the weights alive now."""
    from .kernels import prepared_weights

    return PreparedMemory(prepared_weights.report())


def explain(fn, *args, backend=None, **kwargs) -> Report:
    """Runs fn(*args, **kwargs) under Dynamo with the backend's rewrites (no Inductor) and reports them."""
    chosen = backend or default_backend
    with collecting() as records:
        torch.compile(fn, backend=chosen.rewrite_only)(*args, **kwargs)
    report = Report(list(records))
    print(report)
    return report


def _target_name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return f".{node.target}"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}"
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__name__", str(target))


def _format_arg(a) -> str:
    if isinstance(a, torch.fx.Node):
        return a.name
    if isinstance(a, float):
        return f"{a:.6g}"
    if isinstance(a, (tuple, list)):
        return "(" + ", ".join(_format_arg(x) for x in a) + ")"
    if isinstance(a, slice):
        parts = [_format_arg(x) if x is not None else "" for x in (a.start, a.stop)]
        return ":".join(parts) + (f":{_format_arg(a.step)}" if a.step is not None else "")
    if isinstance(a, torch.dtype):
        return str(a).removeprefix("torch.")
    return repr(a)


def _format_value(v) -> str:
    if isinstance(v, torch.Tensor):
        dtype = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
                 torch.bool: "b8", torch.int64: "i64", torch.int32: "i32"}.get(v.dtype, str(v.dtype))
        return f"{dtype}[{', '.join(str(s) for s in v.shape)}]"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_format_value(x) for x in v) + ")"
    return type(v).__name__


def graph_summary(gm: torch.fx.GraphModule) -> str:
    """One line per call in the graph: `name: type = op(args, key=value)`."""
    lines = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        args = [_format_arg(a) for a in node.args] + [f"{k}={_format_arg(v)}" for k, v in node.kwargs.items()]
        val = node.meta.get("example_value", node.meta.get("val"))
        lines.append(f"{node.name}: {_format_value(val)} = {_target_name(node)}({', '.join(args)})")
    return "\n".join(lines)
