"""One-row quantized linears under `coordinate_descent_tuning` (torchao's `quantize_` and gpt-fast turn it on): Inductor
decomposes `x[1, K] @ W^T` into a multiply and a float32 sum before our stage, and generates one fused dequantize-GEMV
kernel for it. This times that kernel (default torch.compile) against our op (our backend, which sees the matmul
again: lowering/gemv.py) and bf16 cuBLAS, per weight shape, for gpt-fast's int8 weight-only linear and NVFP4Linear.

    python3 docs/scripts/one_row_gemv.py [--formats int8,nvfp4] [--shapes 2048x2048,...]

Each column compiles a module of C copies of the linear (C * weight bytes >= 2x the 50 MB L2, as a decode step reads
every weight from HBM), called on one x [1, 1, K]; CUDA-graph median / C = microseconds per linear. Our column runs
with `backend(inductor_gemvs=False)` (every one-row linear to the op), which is what the crossover rule is set from.
"""
import argparse
import math
import sys

import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import nvfp4
from fa4_inductor.bench.timing import gpu_ms

sys.path.insert(0, "tests")
import upstream  # noqa: E402

SHAPES = [(2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (4096, 4096), (1024, 4096), (14336, 4096),
          (4096, 14336), (8192, 8192)]
BYTES_PER_WEIGHT = {"int8": 1.0, "nvfp4": 0.5625, "bf16": 2.0}


class Copies(nn.Module):
    def __init__(self, linears):
        super().__init__()
        self.linears = nn.ModuleList(linears)

    def forward(self, x):
        return tuple(linear(x) for linear in self.linears)


def quantized(fmt: str, n: int, k: int, copies: int) -> Copies:
    linears = []
    for _ in range(copies):
        linear = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        if fmt == "int8":
            linear = upstream.WeightOnlyInt8Linear.from_linear(linear, torch.bfloat16).cuda()
        linears.append(linear)
    model = Copies(linears).requires_grad_(False)
    if fmt == "nvfp4":
        nvfp4.quantize(model)
    return model


def timed(model, x, backend, copies):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        out = compiled(x)
        us = gpu_ms(lambda: compiled(x), cuda_graph=True) * 1e3 / copies
    return us, out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", default="int8,nvfp4")
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; x [1, 1, K] bf16; us per linear")
    print("| format | N x K | copies | bf16 cuBLAS | Inductor GEMV (default compile) | ours (op) | ours vs Inductor | op calls |")
    print("|---|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        for shape in args.shapes.split(","):
            n, k = map(int, shape.split("x"))
            copies = max(2, min(96, math.ceil(100e6 / (n * k * BYTES_PER_WEIGHT[fmt]))))
            bf16_copies = max(2, min(96, math.ceil(100e6 / (n * k * 2))))
            torch.manual_seed(0)
            x = torch.randn(1, 1, k, device="cuda", dtype=torch.bfloat16)
            with torch._inductor.config.patch(coordinate_descent_tuning=True, fx_graph_cache=False):
                bf16 = Copies([nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
                               for _ in range(bf16_copies)]).requires_grad_(False)
                bf16_us = gpu_ms(lambda: [m(x) for m in bf16.linears], cuda_graph=True) * 1e3 / bf16_copies
                del bf16
                model = quantized(fmt, n, k, copies)
                inductor_us, expected = timed(model, x, "inductor", copies)
                from torch._inductor.utils import run_and_get_code
                torch._dynamo.reset()
                compiled = torch.compile(model, backend=fa4_inductor.backend(inductor_gemvs=False), dynamic=False)
                with torch.no_grad():
                    out, code = run_and_get_code(compiled, x)
                    calls = sum(c.count(f"torch.ops.fa4.{fmt}_linear") for c in code)
                    ours_us = gpu_ms(lambda: compiled(x), cuda_graph=True) * 1e3 / copies
            error = max((a.float() - b.float()).abs().max().item() / b.float().abs().max().item()
                        for a, b in zip(out, expected))
            assert error < 2e-2, f"{fmt} {shape}: ours differs from default compile by {error:.1e}"
            print(f"| {fmt} | {n} x {k} | {copies} | {bf16_us:.2f} | {inductor_us:.2f} | {ours_us:.2f} | "
                  f"{inductor_us / ours_us:.2f}x | {calls} |", flush=True)
            del model, compiled, out, expected


if __name__ == "__main__":
    main()
