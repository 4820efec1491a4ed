"""FP8 (e4m3) weight linears at decode sizes on a GPU: ours (`w4a16_decode.fp8_matmul`, the weight-only decode GEMM
reading one byte a weight) against `torch._scaled_mm` on the same fp8 codes (what torchao's
`Float8DynamicActivationFloat8WeightConfig` runs, rowwise scales) and bf16 cuBLAS on a bf16 weight.

    python tests/bench_fp8.py                         # M = 1, 4, 16 on the W4A16 bench's shapes
    python tests/bench_fp8.py --m 1,16 --shapes 8192x8192

Timing as `tests/bench_w4a16.py` (`graph_us`: C copies of each weight, more than twice the L2, replayed in one CUDA
graph; median per call). TB/s counts the weight bytes (fp8 codes + scales; bf16: 2 bytes a weight). The accuracy
column is ours against `_scaled_mm`, max abs difference over max |out|.
"""

import argparse

import torch
import torch.nn.functional as F

from bench_w4a16 import SHAPES, copies, graph_us
from fa4_inductor.kernels import w4a16_decode as w4


def row(n, k, m):
    fp8_bytes, bf16_bytes = n * k + 4 * n, 2 * n * k
    c = copies(fp8_bytes)
    g = torch.Generator(device="cuda").manual_seed(n + k + m)
    ws = [(torch.randn(n, k, device="cuda", generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
          for _ in range(c)]
    w_scales = [torch.rand(n, 1, device="cuda", generator=g) / 64 + 1e-3 for _ in range(c)]
    x = torch.randn(m, k, device="cuda", generator=g)
    x_scale = x.abs().amax(-1, keepdim=True) / 448
    x_fp8 = (x / x_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    x_bf16 = x_fp8.to(torch.bfloat16)
    wbf = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies(bf16_bytes))]
    xb = x.to(torch.bfloat16)

    def scaled_mm(w, s):
        return torch._scaled_mm(x_fp8, w.t(), x_scale, s.t(), out_dtype=torch.bfloat16, use_fast_accum=True)

    def ours(w, s):
        return w4.fp8_matmul(x_bf16, w, s.reshape(-1), x_scale.reshape(-1))

    t_bf16 = graph_us([lambda w=w: F.linear(xb, w) for w in wbf])
    t_smm = graph_us([lambda w=w, s=s: scaled_mm(w, s) for w, s in zip(ws, w_scales)])
    t_ours = graph_us([lambda w=w, s=s: ours(w, s) for w, s in zip(ws, w_scales)])
    a, b = ours(ws[0], w_scales[0]).float(), scaled_mm(ws[0], w_scales[0]).float()
    acc = ((a - b).abs().max() / b.abs().max()).item()
    print(f"| {n} x {k} | {m} | {t_bf16:.1f} ({bf16_bytes / t_bf16 / 1e6:.2f}) | {t_smm:.1f} "
          f"({fp8_bytes / t_smm / 1e6:.2f}) | **{t_ours:.1f}** ({fp8_bytes / t_ours / 1e6:.2f}) | "
          f"{t_bf16 / t_ours:.2f}x | {t_smm / t_ours:.2f}x | {acc:.1e} |", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", default="1,4,16")
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES[:5]))
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us (TB/s of weight bytes)")
    print("| N x K | M | bf16 cuBLAS | fp8 _scaled_mm rowwise | ours fp8 | ours vs bf16 | ours vs _scaled_mm | "
          "|ours - _scaled_mm| / max |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        for m in map(int, args.m.split(",")):
            row(n, k, m)


if __name__ == "__main__":
    main()
