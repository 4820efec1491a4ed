"""What reading an NVFP4 weight's bytes costs with no arithmetic at all (issue 15: 8192 x 8192 at one row in <= 11 us,
2048 x 8192 and 8192 x 2048 at >= 2.5x bf16): for each weight shape, the same number of bytes read by
- bf16 cuBLAS at one row of x (`F.linear` over a bf16 [N', K] of the NVFP4 weight's bytes: the vendor's GEMV);
- ATen's row sums of those bytes as int32 words;
- a Triton kernel that only streams them: a grid of G programs, each summing 16-byte vectors of a flat buffer in
  strides of BLOCK words (the best of a sweep over G and BLOCK).
Timed as `tests/bench_w4a16.py` times our kernels (copies over 2x the L2 in one CUDA graph, median per call), so the
rows compare with its NVFP4 column: how far our kernel is from the fastest read of its bytes.

    python3 docs/scripts/read_floor.py [[int8:]NxK ...]   # default 8192x8192 2048x8192 8192x2048 int8:8192x8192

A shape is an NVFP4 weight's unless prefixed `int8:` (issue 15's int8 row, <= 18 us at 8192 x 8192: int8 codes and a
float32 scale a row).
"""
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, "tests")
from bench_w4a16 import copies, graph_us  # noqa: E402


@triton.jit
def stream_sum(w_ptr, out_ptr, words, BLOCK: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(pid * BLOCK, words, programs * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + offsets, mask=offsets < words, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def weight_bytes(fmt: str, n: int, k: int) -> int:
    if fmt == "int8":
        return n * k + 4 * n  # int8 codes + a float32 scale a row
    return n * k // 2 + n * k // 16  # e2m1 codes + an e4m3 scale per 16


def parse_shape(spec: str) -> tuple[str, int, int]:
    fmt, _, dims = spec.rpartition(":")
    n, k = (int(v) for v in dims.split("x"))
    return fmt or "nvfp4", n, k


def main():
    shapes = [parse_shape(s) for s in sys.argv[1:] or ["8192x8192", "2048x8192", "8192x2048", "int8:8192x8192"]]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("| weight N x K | bytes (MB) | bf16 GEMV of those bytes (rows) us | ATen row sums us | Triton stream us "
          "(programs, block) | best TB/s |")
    print("|---|---|---|---|---|---|")
    for fmt, n, k in shapes:
        nbytes = weight_bytes(fmt, n, k)
        c = copies(nbytes)
        bf16_rows = max(64, round(nbytes / (2 * k) / 64) * 64)
        x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
        wbf = [torch.randn(bf16_rows, k, dtype=torch.bfloat16, device="cuda") for _ in range(c)]
        gemv = graph_us([lambda w=w: F.linear(x, w) for w in wbf])
        del wbf
        words = nbytes // 4
        flat = [torch.randint(-100, 100, (words,), dtype=torch.int32, device="cuda") for _ in range(c)]
        rows = [f.view(n, -1) if words % n == 0 else f.view(1, -1) for f in flat]
        aten = graph_us([lambda w=w: w.sum(dim=-1, dtype=torch.int32) for w in rows])
        best = None
        for programs in (sms, 2 * sms, 4 * sms, 8 * sms):
            for block in (1024, 2048, 4096):
                for warps in (4, 8):
                    out = torch.empty(programs, dtype=torch.int32, device="cuda")
                    calls = [lambda f=f: stream_sum[(programs,)](f, out, words, BLOCK=block, num_warps=warps)
                             for f in flat]
                    calls[0]()
                    assert out.sum(dtype=torch.int64).item() == flat[0].sum(dtype=torch.int64).item(), (programs, block)
                    us = graph_us(calls)
                    if best is None or us < best[0]:
                        best = (us, programs, block, warps)
        del flat, rows
        floor = min(gemv * nbytes / (bf16_rows * k * 2), aten, best[0])
        print(f"| {fmt} {n} x {k} | {nbytes / 1e6:.1f} | {gemv:.1f} ({bf16_rows}) | {aten:.1f} | {best[0]:.1f} "
              f"({best[1]}, {best[2]} x {best[3]} warps) | {nbytes / floor / 1e6:.2f} |", flush=True)


if __name__ == "__main__":
    main()
