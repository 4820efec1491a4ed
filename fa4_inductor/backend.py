"""The Dynamo backend: our graph rewrites, then Inductor for everything else.

    torch.compile(model, backend=fa4_inductor)                    # the module, or backend="fa4_inductor"
    torch.compile(model, backend=fa4_inductor.backend(gqa=False))  # with options (options.py)
    torch.compile(model, backend="fa4_inductor", mode="reduce-overhead", options={...})

`mode` and `options` mean what they mean for the inductor backend: they become Inductor config
patches, so "reduce-overhead" turns on CUDA graphs.
"""

from __future__ import annotations

import logging

import torch
from torch._inductor.compile_fx import compile_fx

from fa4_inductor.lowering import run_torch_ir_passes

from . import report
from .options import Options

log = logging.getLogger("fa4_inductor")


def inductor_config_patches(mode: str | None, options: dict | None) -> dict:
    """Inductor config for torch.compile's `mode=` and `options=`, as the inductor backend reads them."""
    patches = dict(torch._inductor.list_mode_options(mode)) if mode else {}
    patches.update(options or {})
    return patches


class Backend:
    """A torch.compile backend with fixed options; `fa4_inductor.backend(**options)` makes one."""

    def __init__(self, options: Options | None = None):
        self.options = options or Options()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
        records = run_torch_ir_passes(gm, example_inputs, self.options)
        compiled = compile_fx(gm, example_inputs, config_patches=inductor_config_patches(mode, options))
        report.publish(records)  # after compile_fx: a restarted analysis (it raises) leaves no stale records
        return compiled

    def rewrite_only(self, gm: torch.fx.GraphModule, example_inputs, **_):
        """The same rewrites, run eagerly without Inductor: what `explain` uses."""
        report.publish(run_torch_ir_passes(gm, example_inputs, self.options))
        return gm.forward

    def __repr__(self) -> str:
        return f"fa4_inductor.backend({self.options})"


def backend(**options) -> Backend:
    """A backend with non-default options, e.g. `backend(gqa=False)`; see `Options` for the names."""
    unknown = set(options) - set(Options.names())
    if unknown:
        raise TypeError(f"unknown fa4_inductor options {sorted(unknown)}; known: {Options.names()}")
    return Backend(Options(**options))


fa4_inductor = Backend()
