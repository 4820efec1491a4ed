"""Ops in the `fa4` torch.library namespace and the kernels behind them. Importing registers them.

`library.py` owns the namespace; each op file defines its ops in it (`attention.py`: `fa4::attention`
`fa4::attention_forward`, its twin without autograd, and `fa4::attention_backward`; `int8_linear.py`:
`fa4::int8_linear`); `sharding.py` says how each runs on DTensors (imported where torch.distributed is
available). `attention_unsupported_reason(device_type, dtype, head_dim, head_dim_v)` is the check
lowering asks before it emits `fa4::attention`, `int8_linear_unsupported_reason(device_type, dtype,
scale_dtype, in_features, group_size, scale_after_matmul)` the one before `fa4::int8_linear`.
"""

import sys

if __name__ != "fa4_inductor.kernels":
    # Found as a top-level `kernels` because the repo root is on sys.path (e.g. `python -m pytest` run
    # there; transformers probes for a `kernels` package by importing it). Loading this folder a
    # second time under that name would register the ops again; hand out the installed package.
    import importlib

    sys.modules[__name__] = importlib.import_module("fa4_inductor.kernels")
else:
    import torch

    from . import attention, int8_linear
    from .attention import unsupported_reason as attention_unsupported_reason
    from .int8_linear import unsupported_reason as int8_linear_unsupported_reason

    if torch.distributed.is_available():
        from . import sharding

    ATTENTION = torch.ops.fa4.attention.default  # differentiable: what lowering emits
    ATTENTION_FORWARD = torch.ops.fa4.attention_forward.default  # no autograd: inside compiled graphs
    INT8_LINEAR = torch.ops.fa4.int8_linear.default

    __all__ = ["ATTENTION", "ATTENTION_FORWARD", "INT8_LINEAR", "attention", "attention_unsupported_reason",
               "int8_linear", "int8_linear_unsupported_reason"]
