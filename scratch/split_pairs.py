"""Issue 16: a decode kernel's split count at one CTA a SM against two (and a count between), timed in alternating
rounds (CUDA-graph medians), so that the spread between passes hits every count alike. `*` marks the rule's count.

    python scratch/split_pairs.py            # the int8-KV kernel (session 43: one CTA a SM at head dim 128 since)
    python scratch/split_pairs.py bf16       # the bf16 kernel (its rule: one CTA a SM at every head dim)
"""
import statistics, sys
import torch
from fa4_inductor.bench import gpu_ms
from fa4_inductor.kernels import decode, decode_int8kv
sys.path.insert(0, "tests")
from bench_decode_int8kv import make_cache

ROUNDS = 4
KERNEL = sys.argv[1] if len(sys.argv) > 1 else "int8kv"
print(torch.cuda.get_device_name(), torch.__version__, KERNEL, flush=True)
sms = decode._num_sms(torch.cuda.current_device())
for b, sk, d in [(1, 4096, 128), (1, 32768, 128), (1, 131072, 128), (1, 32768, 64), (2, 32768, 128),
                 (4, 32768, 128), (8, 32768, 128), (8, 32768, 64), (8, 4096, 128)]:
    q, k8, v8, ks, vs, kb, vb = make_cache(b, sk, 32, 8, d)
    if KERNEL == "bf16":
        del k8, v8, ks, vs
        decode.warmup(torch.bfloat16, d, 4, 1, "cuda", causal=False, seqused_k=False)
        rule = decode.num_splits(b, 8, 1, 4, sk, d, sms)

        def call(n):
            return decode.forward(q, kb, vb, None, splits=n, scale=d ** -0.5, causal=False)
    else:
        del kb, vb
        decode_int8kv.warmup(torch.bfloat16, d, 4, 1, "cuda", causal=False, seqused_k=False)
        rule = decode_int8kv.num_splits(b, 8, 1, 4, sk, d, sms)

        def call(n):
            return decode_int8kv.forward(q, k8, v8, ks, vs, None, splits=n, scale=d ** -0.5, causal=False)
    one = decode.num_splits(b, 8, 1, 4, sk, d, sms)
    two = decode.num_splits(b, 8, 1, 4, sk, d, 2 * sms)
    counts = sorted({one, two, max(1, (one + two) // 2), rule})
    times = {n: [] for n in counts}
    for _ in range(ROUNDS):
        for n in counts:
            times[n].append(gpu_ms(lambda: call(n), cuda_graph=True) * 1e3)
    cells = "  ".join(f"{n:3d}{'*' if n == rule else ' '}: {statistics.median(t):6.1f} us ({min(t):5.1f}-{max(t):5.1f})"
                      for n, t in times.items())
    print(f"b{b} sk{sk} d{d}  {cells}", flush=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
