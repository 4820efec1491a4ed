"""Session 28: the gated integer GEMV (silu(x @ gate^T) * (x @ up^T) in one launch, `nvfp4_int_gemv.run_gated`)
against what a decode step runs today: the sibling GEMV over gate and up, then silu and the product (Inductor's one
fused kernel, as in a compiled step), chained in one CUDA graph. One row of x, bf16.

    python3 scratch/gated_gemv.py
"""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, "tests")
from bench_w4a16 import graph_us  # noqa: E402
from test_nvfp4_linear import random_nvfp4  # noqa: E402

from fa4_inductor.kernels import nvfp4_int_gemv as g  # noqa: E402


silu_mul = torch.compile(lambda a, b: F.silu(a) * b)
print(torch.cuda.get_device_name(), torch.__version__)
for n, k in ((8192, 2048), (14336, 4096), (5632, 2048)):
    gate, up = random_nvfp4(n, k, seed=1, device="cuda"), random_nvfp4(n, k, seed=2, device="cuda")
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")

    def apart():
        a, b = g.run_siblings(x, [gate, up])
        return silu_mul(a, b)

    def siblings_only():
        return g.run_siblings(x, [gate, up])

    t_apart, t_sib, t_gated = (graph_us([fn]) for fn in (apart, siblings_only, lambda: g.run_gated(x, gate, up)))
    err = (g.run_gated(x, gate, up).float() - apart().float()).abs().max().item()
    print(f"{n} x {k}: siblings + silu * up {t_apart:.1f} us (siblings alone {t_sib:.1f}), gated {t_gated:.1f} us; "
          f"max difference {err:.3g}", flush=True)
