"""Why a torchao module under our backend can be slower than under default torch.compile where lowering changes
nothing (docs/benchmarks.md, sessions 13 and 14: int8 weight-only one-row linears left to Inductor's GEMV, 5-9%;
int8 x int8 at 256 rows, 14-17%). Compiles the same one-linear module both ways, times each (CUDA-graph median), and
writes each compile's Inductor output code to $OUT (or /tmp) for a diff:

    python docs/scripts/compare_compiles.py int8_int8 8192 2048 256
    python docs/scripts/compare_compiles.py int8 4096 4096 1
    diff $OUT/default.py $OUT/ours.py

Each compile runs in a fresh Dynamo state with the FX graph cache off, so neither reuses the other's artifacts; the
two timings and the names of the kernels each graph launches are printed.
"""

import glob
import os
import shutil
import sys
import tempfile

import torch

import fa4_inductor
from fa4_inductor.bench import quant
from fa4_inductor.bench.timing import gpu_ms

fmt, n, k, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out_dir = os.environ.get("OUT", "/tmp")
configs = {"int8_int8": quant._int8_dynamic_config, "int8": quant._int8_weight_only_config,
           "nvfp4": quant._nvfp4_weight_only_config}
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs it as a smoke test
w = torch.randn(n, k, dtype=torch.bfloat16, device=device) / k ** 0.5
module = quant._torchao_linear(configs[fmt], w)
x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
torch._inductor.config.fx_graph_cache = False
for name, backend in (("default", "inductor"), ("ours", quant.ours_backend())):
    torch._dynamo.reset()
    debug = tempfile.mkdtemp()
    with torch._inductor.config.patch({"trace.enabled": True, "trace.debug_dir": debug}), torch.no_grad():
        compiled = torch.compile(module, backend=backend)
        compiled(x)
        us = gpu_ms(lambda: compiled(x), cuda_graph=device == "cuda") * 1e3
    codes = sorted(glob.glob(os.path.join(debug, "**", "output_code.py"), recursive=True))
    if codes:
        shutil.copy(codes[-1], os.path.join(out_dir, f"{name}.py"))
        text = open(codes[-1]).read()
        kernels = sorted({line.split("=")[0].strip() for line in text.splitlines() if "async_compile.triton(" in line})
        externs = sorted({word for word in ("extern_kernels.mm", "extern_kernels._int_mm", "torch.ops.fa4",
                                            "extern_kernels.addmm", "cpp_fused") if word in text})
    else:
        kernels, externs = ["(no output_code.py found)"], []
    print(f"{fmt} {n}x{k} M={m} {name}: {us:.2f} us; triton kernels {kernels}; other calls {externs}")
    shutil.rmtree(debug, ignore_errors=True)
