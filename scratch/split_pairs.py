"""Issue 16: the int8-KV decode kernel's split rule (2 CTAs a SM: b1 x 32k -> 33 splits) against one CTA a SM
(16), timed in alternating rounds (CUDA-graph medians), so that the spread between passes hits both counts alike."""
import statistics, sys
import torch
from fa4_inductor.bench import gpu_ms
from fa4_inductor.kernels import decode, decode_int8kv
sys.path.insert(0, "tests")
from bench_decode_int8kv import make_cache

ROUNDS = 4
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
sms = decode._num_sms(torch.cuda.current_device())
for b, sk, d in [(1, 4096, 128), (1, 32768, 128), (1, 131072, 128), (1, 32768, 64), (2, 32768, 128),
                 (4, 32768, 128), (8, 32768, 128), (8, 32768, 64), (8, 4096, 128)]:
    q, k8, v8, ks, vs, kb, vb = make_cache(b, sk, 32, 8, d)
    del kb, vb
    decode_int8kv.warmup(torch.bfloat16, d, 4, 1, "cuda", causal=False, seqused_k=False)
    two = decode_int8kv.num_splits(b, 8, 1, 4, sk, d, sms)
    one = decode.num_splits(b, 8, 1, 4, sk, d, sms)
    counts = sorted({two, one, max(1, (two + one) // 2)})
    times = {n: [] for n in counts}
    for _ in range(ROUNDS):
        for n in counts:
            times[n].append(gpu_ms(lambda: decode_int8kv.forward(q, k8, v8, ks, vs, None, splits=n,
                                                                 scale=d ** -0.5, causal=False), cuda_graph=True) * 1e3)
    cells = "  ".join(f"{n:3d}{'*' if n == two else ' '}: {statistics.median(t):6.1f} us ({min(t):5.1f}-{max(t):5.1f})"
                      for n, t in times.items())
    print(f"b{b} sk{sk} d{d}  {cells}", flush=True)
    del q, k8, v8, ks, vs
    torch.cuda.empty_cache()
