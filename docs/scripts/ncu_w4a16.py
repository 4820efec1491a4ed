"""Hardware counters of our W4A16 kernels on one decode-sized call (issue 15: what holds them at ~2 TB/s).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis python3 docs/scripts/ncu_w4a16.py [N K [R,K,S,W ...]]

One row of x (bf16) times an N x K weight (default 8192 x 8192), NVFP4 and int8, on the CUDA-core GEMV and on the
tensor-core kernel, and NVFP4 on the integer GEMV (`nvfp4_int_gemv`): each compiled and run once outside the profiled
range, then once inside it (between cudaProfilerStart / Stop), so ncu reports five kernels (plus the tensor-core
kernel's split-K reduce where split). Each further argument adds the integer GEMV forced to that shape (rows a warp,
K warps, splits, warps a CTA: `4,1,4,4` splits K in four, `4,1,1,16` runs CTAs of 16 warps).

    ... python3 docs/scripts/ncu_w4a16.py 8192 8192 --m 16 --mma registers,rolling+2ctas,rolling@2x2x4

`--m M` (1..16) sets x's rows; above GEMV_MAX_M only the tensor-core kernel runs. `--mma` lists its variants, each
a load path (`w4a16_decode.parse_load`, or auto) with an optional forced CTA shape after "@" (RTxWNxWK); each
adds an NVFP4 and an int8 call (default: one of each on the configured load path). Session 36's question: whether
16 rows are held by the bytes of x the SMs read from L2 (L2 -> L1 sectors, L1 hit rate) rather than by HBM.
"""

import sys

import torch
from ncu_range import profile_calls

from fa4_inductor.kernels import switches, w4a16_decode as w4

sys.path.insert(0, "tests")
from test_nvfp4_linear import random_nvfp4  # noqa: E402

argv, rows, mma = list(sys.argv[1:]), 1, [None]
for flag in ("--m", "--mma"):
    if flag in argv:
        i = argv.index(flag)
        value = argv[i + 1]
        del argv[i:i + 2]
        rows, mma = (int(value), mma) if flag == "--m" else (rows, value.split(","))
n, k = (int(a) for a in argv[:2]) if len(argv) > 1 else (8192, 8192)
x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
w_fp4, block, global_scale = random_nvfp4(n, k, seed=1, device="cuda")
w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
scale = torch.rand(n, device="cuda") / 100
calls = []
if rows <= w4.GEMV_MAX_M:
    calls += [("nvfp4 int gemv", lambda: w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=w4.INT_GEMV)),
              ("nvfp4 gemv", lambda: w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=True)),
              ("int8 gemv", lambda: w4.int8_matmul(x, w_int8, scale, gemv=True))]
for spec in mma:
    load, _, shape = (spec or "").partition("@")
    cta = switches.parse_cta_shape(shape) if shape else None
    options = dict(load=load or None, cta=cta, gemv=False)
    calls += [(f"nvfp4 mma {spec or ''}", lambda o=options: w4.nvfp4_matmul(x, w_fp4, block, global_scale, **o)),
              (f"int8 mma {spec or ''}", lambda o=options: w4.int8_matmul(x, w_int8, scale, **o))]
for spec in argv[2:]:
    shape = (w4.INT_GEMV, *map(int, spec.split(",")))
    calls.append((f"nvfp4 int gemv {spec}", lambda shape=shape: w4.nvfp4_matmul(x, w_fp4, block, global_scale,
                                                                                gemv=shape)))
profile_calls(calls)
