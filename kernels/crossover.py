"""Where `fa4::attention` loses to PyTorch's SDPA: small attentions, whose kernels take microseconds while
the op's host path (Python dispatch, routing, FA4's launch: 50-85 us on the H200) costs more than SDPA's
C++ path (~20 us).

Measured (`python -m fa4_inductor bench --suite crossover`; docs/benchmarks.md, session 6, run 2): back to
back, SDPA wins below ~17 GFLOP of causal attention at head dim 32 and ~35-70 at head dims 64 and 128;
above, FA4 wins by up to 1.4x. The thresholds sit on the generous side (SDPA is default compile's own
kernel, so routing to it is never slower than default compile).

Also where Inductor's own fused one-row GEMV (coordinate descent tuning) beats a quantized-linear op:
`inductor_gemv_reason`, over each op's table of measured weight shapes.

Three users: lowering keeps small SDPA calls in host-bound graphs on SDPA (`lowering/crossover.py`, symbolic
sizes under a guard); the op itself sends a small call with a key mask to the SDPA fallback rather than reading
the mask's form on the host (a sync that stalls a host-bound graph; `attention.py`), and a small unmasked one to
cuDNN SDPA (route `sdpa_small`, `sdpa_cudnn.small_reason`): the small calls lowering gave the op (graphs with
enough GPU work per layer to hide its host path, or the option off).
"""

from __future__ import annotations

GFLOP_BELOW = ((32, 20.0), (256, 60.0))  # (head dims up to, GFLOP of attention below which SDPA is kept)


def attention_gflop(b, h, sq, sk, d, causal: bool = False) -> float:
    """GFLOP of attention over [b, h, sq, d] queries and sk keys (q @ k^T and p @ v), halved when causal."""
    return 4 * b * h * sq * sk * d / (2 if causal else 1) / 1e9


def gflop_limit(head_dim: int) -> float:
    """The attention GFLOP below which SDPA is the faster at this head dim (0: never)."""
    return next((g for dims, g in GFLOP_BELOW if head_dim <= dims), 0.0)


def small(b, h, sq, sk, d, causal: bool = False):
    """Whether the attention is under `gflop_limit`: a bool, or for symbolic sizes (lowering's) a SymBool whose
    test guards the compiled graph, compared in integer FLOP so that the guard stays exact."""
    return 4 * b * h * sq * sk * d < int(gflop_limit(d) * 1e9) * (2 if causal else 1)


def inductor_gemv_reason(device_type: str, n: int, k: int, faster: frozenset, table: str) -> str | None:
    """Why a one-row linear over an [n, k] weight stays with Inductor's fused GEMV: on CUDA, its shape is in `faster`
    (the op module's `table`, H200-measured), else None."""
    if device_type == "cuda" and (n, k) in faster:
        return (f"one row over a [{n}, {k}] weight: Inductor's fused GEMV measured faster than the op "
                f"({table})")
    return None
