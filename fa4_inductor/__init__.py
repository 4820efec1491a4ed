"""fa4_inductor: a torch.compile backend that runs attention on FA4-class kernels.

    import fa4_inductor
    model = torch.compile(model, backend=fa4_inductor)     # the module itself is the backend
    model = torch.compile(model, backend="fa4_inductor")   # by name (entry point)
    fa4_inductor.explain(model, *example_inputs)           # what was rewritten, what was kept and why
    fa4_inductor.Int8StaticCache(config, max_cache_len)    # an int8 KV cache for HF models (int8_cache.py)
    fa4_inductor.nvfp4.load_checkpoint(model, path)        # NVFP4 checkpoints kept in 4 bits (fa4_inductor/nvfp4.py)
    fa4_inductor.int8.from_torchao(model)                  # torchao int8 weight-only weights as plain buffers (int8.py)
    fa4_inductor.fp8.from_torchao(model)                   # torchao fp8 weights likewise (fp8.py)
    print(fa4_inductor.prepared_memory())                  # weights the ops keep in their kernels' layouts
"""

from __future__ import annotations

import sys
import types

from . import kernels  # noqa: F401  (registers the fa4:: ops)
from . import fp8, int8, nvfp4
from .backend import Backend, backend, fa4_inductor
from .nvfp4 import NVFP4Linear
from .options import Options
from .report import Report, explain, graph_summary, prepared_memory

__all__ = ["Backend", "Int8StaticCache", "NVFP4Linear", "Options", "Report", "backend", "explain", "fa4_inductor",
           "fp8", "graph_summary", "int8", "nvfp4", "prepared_memory"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Int8StaticCache":  # imported on first use: it needs transformers, an optional dependency
        from .int8_cache import Int8StaticCache

        return Int8StaticCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _BackendModule(types.ModuleType):
    """Lets `torch.compile(model, backend=fa4_inductor)` take the module itself."""

    def __call__(self, gm, example_inputs, **kwargs):
        return fa4_inductor(gm, example_inputs, **kwargs)

    def __deepcopy__(self, memo):
        return self  # as `Backend.__deepcopy__`: `CompileConfig(backend=fa4_inductor)` works


sys.modules[__name__].__class__ = _BackendModule
