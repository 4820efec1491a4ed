"""Issue 15 probe: would one GEMV over sibling weights (q/k/v, gate/up: the same x) beat the separate calls that
decode runs today (PDL chained, one CUDA graph)? One weight of the summed rows stands in for the grouped kernel.

    python3 scratch/sibling_gemv.py
"""
import sys

import torch

from fa4_inductor.bench import gpu_ms
from fa4_inductor.kernels import w4a16_decode as w4

sys.path.insert(0, "tests")
from test_nvfp4_linear import random_nvfp4  # noqa: E402

GROUPS = {"llama-1b qkv": (2048, (2048, 512, 512)), "llama-1b gate/up": (2048, (8192, 8192)),
          "llama-8b qkv": (4096, (4096, 1024, 1024)), "llama-8b gate/up": (4096, (14336, 14336))}

for name, (k, rows) in GROUPS.items():
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    weights = [random_nvfp4(n, k, seed=i, device="cuda") for i, n in enumerate(rows)]
    whole = random_nvfp4(sum(rows), k, seed=9, device="cuda")
    separate = gpu_ms(lambda: [w4.nvfp4_matmul(x, *w) for w in weights], cuda_graph=True) * 1e3
    alone = [gpu_ms(lambda w=w: w4.nvfp4_matmul(x, *w), cuda_graph=True) * 1e3 for w in weights]
    one = gpu_ms(lambda: w4.nvfp4_matmul(x, *whole), cuda_graph=True) * 1e3
    print(f"{name:18} K {k}: separate calls {separate:6.1f} us (each alone {' + '.join(f'{a:.1f}' for a in alone)}), "
          f"one {sum(rows)}-row weight {one:6.1f} us: {separate / one:.2f}x", flush=True)
