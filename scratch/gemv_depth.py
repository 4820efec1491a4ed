"""The CUDA-core GEMV (`cute/w4a16_gemv.py`) with one weight piece in flight (before session 29) against two (each_piece),
uncapped and capped at 4 CTAs a SM (GEMV_MIN_CTAS): M = 1 (and 4), NVFP4 and int8, cold-L2 CUDA-graph medians.
    python scratch/gemv_depth.py LABEL MIN_CTAS[,MIN_CTAS]"""
import sys

import torch

sys.path.insert(0, "tests")
from bench_w4a16 import copies, graph_us, weights  # noqa: E402

from fa4_inductor.kernels import w4a16_decode as w4  # noqa: E402

label = sys.argv[1]
SHAPES = [(2048, 8192), (2048, 2048), (8192, 2048), (4096, 14336), (14336, 4096), (8192, 8192), (1024, 4096)]
for mc in map(int, sys.argv[2].split(",")):
    for m in (1, 4):
        w4.GEMV_MIN_CTAS[m] = mc
    for n, k in SHAPES:
        ws = weights(n, k, copies(n * k * 9 // 16))
        cells = []
        for m in ((1, 4) if (n, k) == (2048, 8192) else (1,)):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            t4 = graph_us([lambda w=w: w4.nvfp4_matmul(x, *w[:3], gemv=True) for w in ws])
            t8 = graph_us([lambda w=w: w4.int8_matmul(x, w[3], w[4], gemv=True) for w in ws])
            cells.append(f"m{m} nvfp4 {t4:6.2f} us int8 {t8:6.2f} us")
        print(f"{label:5s} min_ctas {mc} {n}x{k}: " + " | ".join(cells), flush=True)
