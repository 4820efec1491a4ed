"""What the suites produce: markdown `Table`s, the run's environment, the op suite's plot, and the
cells a failed measurement leaves (`attempt`, `or_failed`, `speedup`)."""

from __future__ import annotations

import datetime
import platform
import sys
import traceback
from dataclasses import dataclass, field

import torch


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    note: str = ""

    def markdown(self) -> str:
        def cell(x):
            return f"{x:.3g}" if isinstance(x, float) and abs(x) < 100 else (f"{x:.0f}" if isinstance(x, float) else str(x))

        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines += ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"


def attempt(what: str, fn):
    """fn(), or None after printing why it failed: one broken measurement must not cost the others."""
    try:
        return fn()
    except Exception as e:  # reported in the table and on stderr, never hidden
        report_failure(what, e)
        return None


def report_failure(what: str, error: Exception) -> str:
    """Prints `error` with its traceback on stderr; returns "Type: message" for a table cell."""
    print(f"  {what} failed: {type(error).__name__}: {error}", file=sys.stderr)
    traceback.print_exception(error, file=sys.stderr)
    return f"{type(error).__name__}: {error}"


def or_failed(value):
    """A table cell: the measurement, or "failed" where `attempt` returned None."""
    return "failed" if value is None else value


def speedup(base, ours, invert=False) -> str:
    """base / ours as "1.23x" (ours / base with `invert`, for rates); "n/a" when either failed."""
    if base is None or ours is None:
        return "n/a"
    return f"{(ours / base if invert else base / ours):.2f}x"


def environment() -> dict:
    info = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    for package in ("nvidia-cutlass-dsl", "flash-attn-4", "transformers", "triton"):
        try:
            from importlib.metadata import version

            info[package] = version(package)
        except Exception:
            pass
    return info


def plot(table: Table, path: str) -> None:
    """The op suite's table as TFLOP/s against sequence length, one panel per (head dim, causal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = table.columns[4:-1]
    variants = sorted({(row[0], row[1]) for row in table.rows})
    fig, axes = plt.subplots(1, len(variants), figsize=(4.5 * len(variants), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], variants):
        rows = [r for r in table.rows if (r[0], r[1]) == (d, causal)]
        for i, name in enumerate(impls):
            ax.plot([r[2] for r in rows], [r[4 + i] for r in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d{d}, {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(table.title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
