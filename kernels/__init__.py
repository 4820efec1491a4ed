"""Ops in the `fa4` torch.library namespace and the kernels behind them. Importing registers them.

`library.py` owns the namespace; each op file defines its ops in it:

| file | ops | check lowering asks before emitting them |
|---|---|---|
| `attention.py` | `fa4::attention`, `fa4::attention_forward` (its twin without autograd), `fa4::attention_backward` | `attention_unsupported_reason(device_type, dtype, head_dim, head_dim_v)`; `crossover` says where SDPA is faster |
| `attention_int8kv.py` | `fa4::attention_int8kv`: attention over an int8 KV cache (forward only) | `attention_int8kv_unsupported_reason` (the same arguments) |
| `key_mask.py` | `fa4::key_mask`: the boolean key mask the attention ops take, a tensor of its own (why: its docstring) | none |
| `computed_once.py` | `fa4::computed_once`: a value Inductor computes once for all its consumers (rotary tables) | none |
| `int8_linear.py` | `fa4::int8_linear`: int8 weight-only linears | `int8_linear_unsupported_reason(device_type, dtype, scale_dtype, in_features, group_size, scale_after_matmul)`; `int8_linear_gemv_reason` says where Inductor's one-row GEMV is faster |
| `int8_int8_linear.py` | `fa4::int8_int8_linear`: int8 activations x int8 weights | `int8_int8_linear_unsupported_reason(device_type, out_dtype, n, k)` |
| `fp8_linear.py` | `fa4::fp8_linear`: float8_e4m3fn weights, weight-only or with an fp8 activation's scale | `fp8_linear_unsupported_reason(device_type, dtype, weight_dtype)`; `fp8_linear_scaled_mm_kept_reason` says where `torch._scaled_mm` stays |
| `nvfp4_linear.py` | `fa4::nvfp4_linear`: NVFP4 weight-only linears | `nvfp4_linear_unsupported_reason(device_type, dtype, in_features)`; `nvfp4_linear_rows_reason`, `nvfp4_linear_gemv_reason` |
| `nvfp4_sibling_linears.py` | `fa4::nvfp4_sibling_linears`: 2-3 `fa4::nvfp4_linear` calls of one x in one launch | none (takes what `fa4::nvfp4_linear` takes) |
| `int8_sibling_linears.py` | `fa4::int8_sibling_linears`: 2-3 `fa4::int8_linear` calls of one x in one launch | none (takes what `fa4::int8_linear` takes) |
| `nvfp4_gated_linear.py` | `fa4::nvfp4_gated_linear`: silu(x @ gate^T) * (x @ up^T) over two NVFP4 weights, one launch | none (takes what `fa4::nvfp4_linear` takes, no bias) |

`quack_w4a16.py` is the adapter to quack's mixed-input GEMM that the quantized ops call;
`prepared_weights.py` keeps what a kernel prepares once per weight; `sharding.py` says how each op runs on
DTensors (imported where torch.distributed is available).
"""

import sys

if __name__ != "fa4_inductor.kernels":
    # Found as a top-level `kernels` because the repo root is on sys.path (e.g. `python -m pytest` run
    # there). Whoever imports `kernels` means another package of that name: Hugging Face's hub kernels,
    # which transformers (>= 5.25 depends on it) imports when it is installed. Hand out that package if
    # it is installed, else this one as installed (loading this folder a second time under another name
    # would register the ops again).
    import importlib
    import importlib.machinery
    import importlib.util
    import os

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _spec = importlib.machinery.PathFinder.find_spec(
        __name__, [p for p in sys.path if os.path.abspath(p or os.curdir) != _root])
    if _spec is None:
        sys.modules[__name__] = importlib.import_module("fa4_inductor.kernels")
    else:
        _other = importlib.util.module_from_spec(_spec)
        sys.modules[__name__] = _other
        _spec.loader.exec_module(_other)
else:
    import torch

    from . import (attention, attention_int8kv, computed_once, crossover, fp8_linear, int8_int8_linear, int8_linear,
                   int8_sibling_linears, key_mask, nvfp4_gated_linear, nvfp4_linear, nvfp4_sibling_linears, quack_w4a16)
    from .attention import blind_rows_as_eagers, blind_rows_as_mean, nan_where_no_key
    from .attention import unsupported_reason as attention_unsupported_reason
    from .attention_int8kv import unsupported_reason as attention_int8kv_unsupported_reason
    from .fp8_linear import scaled_mm_kept_reason as fp8_linear_scaled_mm_kept_reason
    from .fp8_linear import unsupported_reason as fp8_linear_unsupported_reason
    from .int8_int8_linear import unsupported_reason as int8_int8_linear_unsupported_reason
    from .int8_linear import gemv_reason as int8_linear_gemv_reason
    from .int8_linear import unsupported_reason as int8_linear_unsupported_reason
    from .nvfp4_linear import gemv_reason as nvfp4_linear_gemv_reason
    from .nvfp4_linear import rows_reason as nvfp4_linear_rows_reason
    from .nvfp4_linear import unsupported_reason as nvfp4_linear_unsupported_reason

    if torch.distributed.is_available():
        from . import sharding

    ATTENTION = torch.ops.fa4.attention.default  # differentiable: what lowering emits
    ATTENTION_FORWARD = torch.ops.fa4.attention_forward.default  # no autograd: inside compiled graphs
    ATTENTION_INT8KV = torch.ops.fa4.attention_int8kv.default  # forward only: int8 K/V with float32 scales
    FP8_LINEAR = torch.ops.fa4.fp8_linear.default
    INT8_LINEAR = torch.ops.fa4.int8_linear.default
    INT8_INT8_LINEAR = torch.ops.fa4.int8_int8_linear.default
    INT8_SIBLING_LINEARS = torch.ops.fa4.int8_sibling_linears.default
    KEY_MASK = torch.ops.fa4.key_mask.default  # the attention ops' key mask, once a graph
    COMPUTED_ONCE = torch.ops.fa4.computed_once.default
    NVFP4_LINEAR = torch.ops.fa4.nvfp4_linear.default
    NVFP4_SIBLING_LINEARS = torch.ops.fa4.nvfp4_sibling_linears.default
    NVFP4_GATED_LINEAR = torch.ops.fa4.nvfp4_gated_linear.default

    __all__ = ["ATTENTION", "ATTENTION_FORWARD", "ATTENTION_INT8KV", "COMPUTED_ONCE", "FP8_LINEAR", "INT8_INT8_LINEAR",
               "INT8_LINEAR", "INT8_SIBLING_LINEARS", "KEY_MASK", "NVFP4_GATED_LINEAR", "NVFP4_LINEAR",
               "NVFP4_SIBLING_LINEARS", "attention", "attention_int8kv", "attention_int8kv_unsupported_reason",
               "attention_unsupported_reason", "crossover", "fp8_linear", "fp8_linear_scaled_mm_kept_reason",
               "fp8_linear_unsupported_reason", "int8_int8_linear", "int8_int8_linear_unsupported_reason",
               "int8_linear", "int8_linear_gemv_reason", "int8_linear_unsupported_reason", "int8_sibling_linears",
               "nvfp4_gated_linear", "nvfp4_linear", "nvfp4_linear_gemv_reason", "nvfp4_linear_rows_reason",
               "nvfp4_linear_unsupported_reason", "nvfp4_sibling_linears", "quack_w4a16"]
