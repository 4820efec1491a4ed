"""Decode benchmark of issue 16 on a GPU: our split-KV kernel over an int8 KV cache (`decode_int8kv`) against
our bf16 kernel (`decode`) and cuDNN SDPA (`sdpa_cudnn`) on the same cache in bf16.

    python tests/bench_decode_int8kv.py                 # b1 / b8 / b64 x 4k / 32k / 128k keys, hq32 hkv8, d128 and d64
    python tests/bench_decode_int8kv.py --b 1 --sk 32768 --splits 24
    python tests/bench_decode_int8kv.py --sweep [--d 64] [--min-ctas 0,3]   # split counts x smem budgets x register caps

One query token, bf16 q, no causal mask (it hides nothing at Sq = 1). Medians of CUDA-graph replays
(`bench.gpu_ms`; caches up to ~40 MB stay in L2 across replays, as in `bench_decode.py`). GB/s counts each
kernel's own bytes: int8 K / V plus the float32 scales for ours, bf16 K / V for the others.
Targets (H200, hq32 hkv8 d128): b1 x 32k <= 21 us; b8 x 32k >= 1.85x our bf16 kernel.
"""

import argparse
import os

import torch

from fa4_inductor.bench import gpu_ms
from fa4_inductor.kernels import decode, decode_int8kv, sdpa_cudnn, switches

SHAPES = [(b, sk, d) for d in (128, 64) for b in (1, 8, 64) for sk in (4096, 32768, 131072)]
SWEEP_SHAPES = [(1, 32768, 128), (8, 32768, 128), (1, 131072, 128), (1, 4096, 128), (64, 32768, 128),
                (1, 32768, 64), (8, 32768, 64)]


def make_cache(b, sk, hq, hkv, d):
    """q, int8 k / v with float32 scales, and the same cache dequantized to bf16 (built a batch row at a time)."""
    q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16, device="cuda")
    k8 = torch.randint(-127, 128, (b, hkv, sk, d), dtype=torch.int8, device="cuda")
    v8 = torch.randint(-127, 128, (b, hkv, sk, d), dtype=torch.int8, device="cuda")
    ks = torch.rand(b, hkv, sk, device="cuda") * 0.02 + 0.001
    vs = torch.rand(b, hkv, sk, device="cuda") * 0.02 + 0.001
    kb = torch.empty(b, hkv, sk, d, dtype=torch.bfloat16, device="cuda")
    vb = torch.empty_like(kb)
    for i in range(b):
        kb[i] = (k8[i].float() * ks[i, ..., None]).bfloat16()
        vb[i] = (v8[i].float() * vs[i, ..., None]).bfloat16()
    return q, k8, v8, ks, vs, kb, vb


def compare(b: int = 1, sk: int = 32768, hq: int = 32, hkv: int = 8, d: int = 128, *, splits=None,
            seqused: bool = False) -> dict:
    """One shape: microseconds and GB/s of the int8 kernel, our bf16 kernel and cuDNN SDPA (bf16), and the
    int8 kernel's max abs difference from the bf16 kernel on the dequantized cache."""
    q, k8, v8, ks, vs, kb, vb = make_cache(b, sk, hq, hkv, d)
    used = torch.full((b,), sk, dtype=torch.int32, device="cuda") if seqused else None
    fl = dict(scale=d ** -0.5, causal=False)
    group = hq // hkv
    n_int8 = splits or decode_int8kv.num_splits(b, hkv, 1, group, sk, d, decode._num_sms(torch.cuda.current_device()))
    decode_int8kv.warmup(torch.bfloat16, d, group, 1, "cuda", causal=False, seqused_k=seqused)
    decode.warmup(torch.bfloat16, d, group, 1, "cuda", causal=False, seqused_k=seqused)
    fns = {"int8kv": lambda: decode_int8kv.forward(q, k8, v8, ks, vs, used, splits=n_int8, **fl),
           "bf16": lambda: decode.forward(q, kb, vb, used, **fl)}
    if sdpa_cudnn.unsupported_reason(q, kb, vb, **fl) is None:
        fns["cudnn"] = lambda: sdpa_cudnn.forward(q, kb, vb, **fl)
    bytes_ = {"int8kv": 2 * k8.numel() + 2 * ks.numel() * 4, "bf16": 4 * kb.numel(), "cudnn": 4 * kb.numel()}
    r = {"b": b, "sk": sk, "hq": hq, "hkv": hkv, "d": d, "splits": n_int8}
    for name, fn in fns.items():
        try:
            ms = gpu_ms(fn, cuda_graph=True)
        except Exception as e:  # keep the other rows (e.g. cuDNN refusing a shape)
            if name != "cudnn":
                raise
            r["cudnn_error"] = f"{type(e).__name__}: {str(e)[:100]}"
            continue
        r[f"{name}_us"] = ms * 1e3
        r[f"{name}_gbps"] = bytes_[name] / (ms * 1e-3) / 1e9
    r["max_abs_diff_vs_bf16"] = (fns["int8kv"]()[0].float() - fns["bf16"]()[0].float()).abs().max().item()
    del q, k8, v8, ks, vs, kb, vb
    torch.cuda.empty_cache()
    return r


def line(r) -> str:
    others = "  ".join(f"{n} {r[n + '_us']:8.1f} us {r[n + '_gbps']:6.0f} GB/s" for n in ("bf16", "cudnn") if n + "_us" in r)
    if "cudnn_error" in r:
        others += f"  cudnn failed ({r['cudnn_error']})"
    speedup = r["bf16_us"] / r["int8kv_us"]
    return (f"b{r['b']:<3} sk{r['sk']:<7} hq{r['hq']} hkv{r['hkv']} d{r['d']:<4} int8kv {r['int8kv_us']:8.1f} us "
            f"{r['int8kv_gbps']:6.0f} GB/s (splits {r['splits']:<3})  {others}  int8/bf16 speedup {speedup:.2f}x  "
            f"max|diff| vs bf16 {r['max_abs_diff_vs_bf16']:.2e}")


def sweep(head_dim=None, min_ctas=(0,)):
    """The int8 kernel alone: split counts around the heuristic's x shared-memory budgets (ring depth; 220 KB
    leaves one CTA per SM) x register caps (`min_ctas`: CTAs a SM the registers must allow, 0 uncapped): the data
    to re-derive `decode_int8kv.SPLIT_CTAS_PER_SM` and the default budget. `head_dim` keeps the shapes of that head dim
    only."""
    sms = decode._num_sms(torch.cuda.current_device())
    for b, sk, d in SWEEP_SHAPES:
        if head_dim not in (None, d):
            continue
        q, k8, v8, ks, vs, kb, vb = make_cache(b, sk, 32, 8, d)
        del kb, vb
        n1 = decode.num_splits(b, 8, 1, 4, sk, d, sms)
        n2, target = decode_int8kv.num_splits(b, 8, 1, 4, sk, d, sms), decode_int8kv.ctas_per_sm(d)
        candidates = sorted({max(1, min(decode.MAX_SPLITS, int(n * f))) for n in (n1, n2) for f in (0.5, 0.75, 1, 1.5, 2)})
        kv_bytes = 2 * k8.numel() + 2 * ks.numel() * 4
        results = []
        for cap in min_ctas:
            for smem_kb in (56, 72, 100, 160, 220):
                os.environ[decode.SMEM_KB_ENV] = str(smem_kb)
                os.environ[switches.DECODE_MIN_CTAS] = str(cap)
                switches.reset()
                more_ctas = {max(1, n2 * cap // target)} if cap else set()  # the rule's count then
                for n in sorted(set(candidates) | more_ctas):
                    ms = gpu_ms(lambda: decode_int8kv.forward(q, k8, v8, ks, vs, scale=d ** -0.5, splits=n),
                                cuda_graph=True)
                    results.append((ms, cap, smem_kb, decode_int8kv.stages_for(d), n))
        os.environ.pop(decode.SMEM_KB_ENV)
        os.environ.pop(switches.DECODE_MIN_CTAS)
        switches.reset()
        best = min(results)
        print(f"b{b} sk{sk} d{d}: best {best[0] * 1e3:.1f} us ({kv_bytes / best[0] / 1e6:.0f} GB/s) min CTAs {best[1]} "
              f"smem {best[2]} KB stages {best[3]} splits {best[4]}  (heuristic: splits {n2}; one CTA per SM would be "
              f"{n1})")
        for ms, cap, smem_kb, stages, n in sorted(results, key=lambda x: x[1:]):
            print(f"   min CTAs {cap} smem {smem_kb:3} KB stages {stages} splits {n:3}{' (heuristic)' if n == n2 else ''}"
                  f"  {ms * 1e3:8.1f} us  {kv_bytes / ms / 1e6:.0f} GB/s")
        del q, k8, v8, ks, vs
        torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--b", type=int)
    parser.add_argument("--sk", type=int)
    parser.add_argument("--d", type=int)
    parser.add_argument("--hq", type=int, default=32)
    parser.add_argument("--hkv", type=int, default=8)
    parser.add_argument("--splits", type=int)
    parser.add_argument("--seqused", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--min-ctas", default="0", help="sweep: comma list of register caps (CTAs a SM; 0 uncapped)")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    if args.sweep:
        sweep(args.d, tuple(int(c) for c in args.min_ctas.split(",")))
        return
    shapes = [(b, sk, d) for b, sk, d in SHAPES if (args.b or b) == b and (args.sk or sk) == sk and (args.d or d) == d]
    if args.b and args.sk and not shapes:
        shapes = [(args.b, args.sk, args.d or 128)]
    for b, sk, d in shapes:
        print(line(compare(b, sk, args.hq, args.hkv, d, splits=args.splits, seqused=args.seqused)), flush=True)


if __name__ == "__main__":
    main()
