"""Hardware counters of our W4A16 kernels on one decode-sized call (issue 15: what holds them at ~2 TB/s).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis python3 docs/scripts/ncu_w4a16.py [N K [R,K,S,W ...]]

One row of x (bf16) times an N x K weight (default 8192 x 8192), NVFP4 and int8, on the CUDA-core GEMV and on the
tensor-core kernel, and NVFP4 on the integer GEMV (`nvfp4_int_gemv`): each compiled and run once outside the profiled
range, then once inside it (between cudaProfilerStart / Stop), so ncu reports five kernels (plus the tensor-core
kernel's split-K reduce where split). Each further argument adds the integer GEMV forced to that shape (rows a warp,
K warps, splits, warps a CTA: `4,1,4,4` splits K in four, `4,1,1,16` runs CTAs of 16 warps).
"""

import sys

import torch
from ncu_range import profile_calls

from fa4_inductor.kernels import w4a16_decode as w4

sys.path.insert(0, "tests")
from test_nvfp4_linear import random_nvfp4  # noqa: E402

n, k = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (8192, 8192)
x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
w_fp4, block, global_scale = random_nvfp4(n, k, seed=1, device="cuda")
w_int8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
scale = torch.rand(n, device="cuda") / 100
calls = [("nvfp4 int gemv", lambda: w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=w4.INT_GEMV)),
         ("nvfp4 gemv", lambda: w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=True)),
         ("nvfp4 mma", lambda: w4.nvfp4_matmul(x, w_fp4, block, global_scale, gemv=False)),
         ("int8 gemv", lambda: w4.int8_matmul(x, w_int8, scale, gemv=True)),
         ("int8 mma", lambda: w4.int8_matmul(x, w_int8, scale, gemv=False))]
for spec in sys.argv[3:]:
    shape = (w4.INT_GEMV, *map(int, spec.split(",")))
    calls.append((f"nvfp4 int gemv {spec}", lambda shape=shape: w4.nvfp4_matmul(x, w_fp4, block, global_scale,
                                                                                gemv=shape)))
profile_calls(calls)
