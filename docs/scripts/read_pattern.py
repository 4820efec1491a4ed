"""How fast HBM serves a weight read in the access pattern of our W4A16 decode GEMM against longer runs per row, with no
decode at all: a Triton kernel sums an int8 [N, K] matrix, each program over BN rows, BK contiguous bytes of each
row per step. Our register path reads, per warp step, 16 rows x 2 chunks of 32 bytes (64 contiguous bytes a row);
if the narrow runs alone cap the read near 2 TB/s, the kernel's limit is its layout, not its decode (issue 15).

    python3 docs/scripts/read_pattern.py [N] [K]      # default 8192 x 8192 (64 MiB, L2 flushed between runs)
"""
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def row_sums(w_ptr, out_ptr, K, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, BK), dtype=tl.int32)
    for k in range(0, K, BK):
        acc += tl.load(w_ptr + rows[:, None] * K + (k + tl.arange(0, BK))[None, :]).to(tl.int32)
    tl.store(out_ptr + rows, tl.sum(acc, axis=1))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    expected = w.sum(dim=1, dtype=torch.int32)
    print(f"int8 [{n}, {k}] row sums, {n * k / 2**20:.0f} MiB; TB/s of the matrix")
    print("| rows a program | bytes a row a step | warps | us | TB/s |")
    print("|---|---|---|---|---|")
    for bn, bk, warps in ((16, 64, 2), (16, 64, 4), (16, 128, 4), (16, 256, 4), (16, 512, 8), (8, 1024, 8),
                          (2, 2048, 4), (1, 4096, 4), (32, 64, 4), (64, 64, 8)):
        if n % bn or k % bk:
            continue
        out = torch.empty(n, dtype=torch.int32, device="cuda")

        def run():
            row_sums[(n // bn,)](w, out, k, BN=bn, BK=bk, num_warps=warps)
        run()
        assert torch.equal(out, expected), (bn, bk)
        us = do_bench(run, warmup=10, rep=50, return_mode="median") * 1e3
        print(f"| {bn} | {bk} | {warps} | {us:.1f} | {n * k / us / 1e6:.2f} |", flush=True)


if __name__ == "__main__":
    main()
