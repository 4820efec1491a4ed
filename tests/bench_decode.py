"""Decode benchmark of issue 5 on a GPU: our split-KV kernel vs SDPA (enable_gqa) vs FA4.

    python tests/bench_decode.py                 # the issue's shapes (hq32 hkv8 d128 bf16)
    python tests/bench_decode.py --b 1 --sk 32768 --splits 48 --no-graphs

Times are medians over CUDA-graph replays (decode runs under graphs); TB/s counts K and V bytes.
Targets (issue 5, H200): b1 sk32k >= 3.5 TB/s, b8 sk32k >= 4.2, b1 sk4k >= 1.5.
"""

import argparse

import torch

from fa4_inductor.kernels.decode import bench_decode

SHAPES = [(1, 32768), (8, 32768), (1, 4096), (64, 32768), (1, 1024), (4, 8192), (16, 16384)]


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
    args = parser.parse_args()
    shapes = [(args.b, args.sk)] if args.b and args.sk else SHAPES
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  hq{args.hq} hkv{args.hkv} d{args.d} "
          f"q_len {args.q_len} {args.dtype}")
    for b, sk in shapes:
        r = bench_decode(b, sk, args.hq, args.hkv, args.d, q_len=args.q_len, dtype=getattr(torch, args.dtype),
                         causal=not args.no_causal, seqused=args.seqused, splits=args.splits,
                         graphs=not args.no_graphs)
        others = "  ".join(f"{k[:-3]} {r[k] * 1e3:7.1f} us {r[k[:-3] + '_tbps']:.2f} TB/s"
                           for k in r if k.endswith("_ms") and k != "decode_ms")
        diff = r.get("max_abs_diff_vs_sdpa", float("nan"))
        print(f"b{b:<3} sk{sk:<6} splits {r['splits']:<3} decode {r['decode_ms'] * 1e3:7.1f} us "
              f"{r['decode_tbps']:.2f} TB/s   {others}   max|diff| vs sdpa {diff:.2e}")


if __name__ == "__main__":
    main()
