"""Issue 15: one GEMV launch over sibling weights (q/k/v, gate/up: the same x) against the separate calls that decode
ran before (PDL chained, one CUDA graph); one weight of the summed rows for scale.

    python3 scratch/sibling_gemv.py
"""
import sys

import torch

from fa4_inductor.bench import gpu_ms
from fa4_inductor.kernels import INT8_SIBLING_LINEARS, NVFP4_SIBLING_LINEARS
from fa4_inductor.kernels import w4a16_decode as w4

sys.path.insert(0, "tests")
from test_nvfp4_linear import random_nvfp4  # noqa: E402

GROUPS = {"llama-1b qkv": (2048, (2048, 512, 512)), "llama-1b gate/up": (2048, (8192, 8192)),
          "llama-8b qkv": (4096, (4096, 1024, 1024)), "llama-8b gate/up": (4096, (14336, 14336))}

for name, (k, rows) in GROUPS.items():
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    weights = [random_nvfp4(n, k, seed=i, device="cuda") for i, n in enumerate(rows)]
    whole = random_nvfp4(sum(rows), k, seed=9, device="cuda")
    args = ([w[0] for w in weights], [w[1] for w in weights], [w[2] for w in weights], [None] * len(weights))
    separate = gpu_ms(lambda: [w4.nvfp4_matmul(x, *w) for w in weights], cuda_graph=True) * 1e3
    alone = [gpu_ms(lambda w=w: w4.nvfp4_matmul(x, *w), cuda_graph=True) * 1e3 for w in weights]
    one = gpu_ms(lambda: w4.nvfp4_matmul(x, *whole), cuda_graph=True) * 1e3
    siblings = gpu_ms(lambda: NVFP4_SIBLING_LINEARS(x, *args), cuda_graph=True) * 1e3
    print(f"{name:18} K {k}: separate calls {separate:6.1f} us (each alone {' + '.join(f'{a:.1f}' for a in alone)}), "
          f"fa4::nvfp4_sibling_linears {siblings:6.1f} us ({separate / siblings:.2f}x), one {sum(rows)}-row weight "
          f"{one:6.1f} us", flush=True)

for name, (k, rows) in GROUPS.items():
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    weights = [(torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda"),
                torch.rand(n, device="cuda").to(torch.bfloat16) / 64) for n in rows]
    args = ([w for w, _ in weights], [s for _, s in weights], [None] * len(weights))
    separate = gpu_ms(lambda: [w4.int8_matmul(x, *w) for w in weights], cuda_graph=True) * 1e3
    siblings = gpu_ms(lambda: INT8_SIBLING_LINEARS(x, *args), cuda_graph=True) * 1e3
    print(f"int8 {name:18} K {k}: separate calls {separate:6.1f} us, fa4::int8_sibling_linears {siblings:6.1f} us "
          f"({separate / siblings:.2f}x)", flush=True)
