"""Each kernel's GPU time in one split-KV decode call (issue 16: what the b1 calls' ~10 us beyond their bytes is):
the main kernel and the combine, int8-KV and bf16, by torch.profiler over 50 calls (no CUDA graph), and the
call's CUDA-graph median (`bench.gpu_ms`, where the combine's programmatic launch overlaps the main kernel's tail), and
that of the main kernel alone (the combine not launched): the difference is what the combine adds to a split call.

    python docs/scripts/decode_kernel_times.py                  # b1 x 4k / 32k, d128 and d64
    python docs/scripts/decode_kernel_times.py 1 32768 128 16,33,66   # one shape, these split counts too (both kernels)
"""

import contextlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from fa4_inductor.bench import gpu_ms
from fa4_inductor.kernels import decode, decode_int8kv

sys.path.insert(0, "tests")
from bench_decode_int8kv import make_cache  # noqa: E402

CALLS = 50


def kernel_times(fn) -> list[tuple[str, float]]:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / CALLS) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])


@contextlib.contextmanager
def combine_skipped():
    """Calls launch their main kernel only (outputs wrong: for timing what the combine adds to a call in a graph)."""
    real = decode.compiled

    def compiled(key):
        return (lambda *args: None) if key.kernel == "combine" else real(key)

    decode.compiled = compiled
    try:
        yield
    finally:
        decode.compiled = real


def shape(b: int, sk: int, d: int, splits=()):
    q, k8, v8, ks, vs, kb, vb = make_cache(b, sk, 32, 8, d)
    flags = dict(scale=d ** -0.5, causal=False)
    decode_int8kv.warmup(torch.bfloat16, d, 4, 1, "cuda", causal=False, seqused_k=False)
    decode.warmup(torch.bfloat16, d, 4, 1, "cuda", causal=False, seqused_k=False)
    sms = decode._num_sms(torch.cuda.current_device())
    rules = {"int8kv": decode_int8kv.num_splits(b, 8, 1, 4, sk, d, sms), "bf16": decode.num_splits(b, 8, 1, 4, sk, d, sms)}
    calls = {"int8kv": lambda n: decode_int8kv.forward(q, k8, v8, ks, vs, None, splits=n, **flags),
             "bf16": lambda n: decode.forward(q, kb, vb, None, splits=n, **flags)}
    for kernel, call in calls.items():
        for n in sorted({rules[kernel], *splits}):
            label = f"{kernel} splits {n}{' (rule)' if n == rules[kernel] else ''}"
            rows = kernel_times(lambda: call(n))
            graph_us = gpu_ms(lambda: call(n), cuda_graph=True) * 1e3
            with combine_skipped():
                main_us = gpu_ms(lambda: call(n), cuda_graph=True) * 1e3 if n > 1 else graph_us
            parts = "  ".join(f"{t:6.1f} us {name[:60]}" for name, t in rows[:3])
            print(f"b{b} sk{sk} d{d} {label:24} graph {graph_us:6.1f} us (main kernel alone {main_us:6.1f}), kernels "
                  f"{sum(t for _, t in rows):6.1f} us | {parts}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 3:
        extra = tuple(int(s) for s in sys.argv[4].split(",")) if len(sys.argv) > 4 else ()
        shape(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), extra)
    else:
        for d in (128, 64):
            for sk in (4096, 32768):
                shape(1, sk, d)
