"""Decode benchmark of issue 5 on a GPU: our split-KV kernel vs SDPA (enable_gqa) vs FA4.

    python tests/bench_decode.py                 # the issue's shapes (hq32 hkv8 d128 bf16)
    python tests/bench_decode.py --b 1 --sk 32768 --splits 48 --no-graphs
    python tests/bench_decode.py --sweep         # tuning: split counts x ring depths x PDL, our kernel only
    python tests/bench_decode.py --crossover     # short caches and per-sequence lengths, all kernels

Times are medians over CUDA-graph replays (decode runs under graphs); TB/s counts K and V bytes.
Targets (issue 5, H200): b1 sk32k >= 3.5 TB/s, b8 sk32k >= 4.2, b1 sk4k >= 1.5.
"""

import argparse
import os

import torch

from fa4_inductor.bench import decode_kernel_comparison, gpu_ms
from fa4_inductor.kernels import decode, switches

SHAPES = [(1, 32768), (8, 32768), (1, 4096), (64, 32768), (1, 1024), (4, 8192), (16, 16384)]
SWEEP_SHAPES = [  # (b, sk, hq, hkv, d)
    (1, 32768, 32, 8, 128), (8, 32768, 32, 8, 128), (1, 4096, 32, 8, 128), (1, 4096, 64, 8, 128),
    (1, 131072, 32, 8, 128), (1, 32768, 32, 8, 64), (4, 8192, 32, 8, 128), (8, 4096, 64, 8, 128),
]


def line(r) -> str:
    others = "  ".join(f"{k[:-3]} {r[k] * 1e3:7.1f} us {r[k[:-3] + '_tbps']:.2f} TB/s"
                       for k in r if k.endswith("_ms") and k != "decode_ms")
    diff = r.get("max_abs_diff_vs_sdpa", float("nan"))
    return (f"b{r['b']:<3} sk{r['sk']:<6} hq{r['hq']} hkv{r['hkv']} d{r['d']} splits {r['splits']:<3} decode "
            f"{r['decode_ms'] * 1e3:7.1f} us {r['decode_tbps']:.2f} TB/s   {others}   max|diff| vs sdpa {diff:.2e}")


def sweep():
    """Our kernel alone over split counts around the heuristic's, ring depths (shared-memory budget) and
    PDL on/off: the data behind `decode.num_splits` and the defaults."""
    dev = torch.cuda.current_device()
    for b, sk, hq, hkv, d in SWEEP_SHAPES:
        q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, hkv, sk, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        kv_bytes = 2 * k.numel() * k.element_size()
        results = []
        for smem_kb in (72, 100, 160, 220):
            os.environ[decode.SMEM_KB_ENV] = str(smem_kb)
            switches.reset()
            n0 = decode.num_splits(b, hkv, 1, hq // hkv, sk, d, decode._num_sms(dev))
            candidates = sorted({max(1, min(decode.MAX_SPLITS, int(n0 * f))) for f in (0.5, 0.75, 1, 1.5, 2, 3, 4)})
            for pdl in ("1", "0") if smem_kb == 100 else ("1",):
                os.environ[decode.PDL_ENV] = pdl
                switches.reset()
                for n in candidates if pdl == "1" else (n0,):
                    ms = gpu_ms(lambda: decode.forward(q, k, v, scale=d ** -0.5, causal=True, splits=n), cuda_graph=True)
                    results.append((ms, smem_kb, decode.stages_for(d), pdl, n, n == n0))
        os.environ.pop(decode.SMEM_KB_ENV)
        os.environ.pop(decode.PDL_ENV)
        switches.reset()
        best = min(results)
        print(f"b{b} sk{sk} hq{hq} hkv{hkv} d{d}: best {best[0] * 1e3:.1f} us "
              f"({kv_bytes / best[0] / 1e9:.2f} TB/s) smem {best[1]} KB stages {best[2]} pdl {best[3]} splits {best[4]}")
        for ms, smem_kb, stages, pdl, n, default in sorted(results, key=lambda r: r[1:]):
            print(f"   smem {smem_kb:3} KB stages {stages} pdl {pdl} splits {n:3}{' (heuristic)' if default else ''}"
                  f"  {ms * 1e3:7.1f} us  {kv_bytes / ms / 1e9:.2f} TB/s")


def crossover():
    """Short caches (where the dispatch threshold sits) and per-sequence lengths (seqused_k), all kernels."""
    for b in (1, 8):
        for sk in (128, 256, 512, 1024, 2048):
            print(line(decode_kernel_comparison(b, sk)))
    for b in (1, 8):
        for sk in (256, 512, 1024, 2048, 4096, 32768):
            print("seqused_k:", line(decode_kernel_comparison(b, sk, seqused=True)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--b", type=int)
    parser.add_argument("--sk", type=int)
    parser.add_argument("--hq", type=int, default=32)
    parser.add_argument("--hkv", type=int, default=8)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--q-len", type=int, default=1)
    parser.add_argument("--splits", type=int)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--seqused", action="store_true")
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--crossover", action="store_true")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    if args.sweep or args.crossover:
        if args.sweep:
            sweep()
        if args.crossover:
            crossover()
        return
    shapes = [(args.b, args.sk)] if args.b and args.sk else SHAPES
    print(f"hq{args.hq} hkv{args.hkv} d{args.d} q_len {args.q_len} {args.dtype}")
    for b, sk in shapes:
        print(line(decode_kernel_comparison(
            b, sk, args.hq, args.hkv, args.d, q_len=args.q_len, dtype=getattr(torch, args.dtype),
            causal=not args.no_causal, seqused=args.seqused, splits=args.splits, graphs=not args.no_graphs)))


if __name__ == "__main__":
    main()
