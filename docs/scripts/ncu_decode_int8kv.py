"""Hardware counters of our int8-KV split-KV decode kernel and of the bf16 one on the same cache (issue 16: b1 x 32k
at 2.3 TB/s, where the target needs ~3.3).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section InstructionStats python3 docs/scripts/ncu_decode_int8kv.py [B SK D]

One query token, hq32 / hkv8, head dim D (default b1 x 32768 x 128), no mask: each kernel compiled and run once
outside the profiled range, then once inside it, so ncu reports the int8 kernel, its combine, the bf16 kernel and
its combine.
"""

import sys

import torch
from ncu_range import profile_calls

from fa4_inductor.kernels import decode, decode_int8kv

sys.path.insert(0, "tests")
from bench_decode_int8kv import make_cache  # noqa: E402

b, sk, d = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (1, 32768, 128)
hq, hkv = 32, 8
q, k8, v8, ks, vs, kb, vb = make_cache(b, sk, hq, hkv, d)
flags = dict(scale=d ** -0.5, causal=False)
decode_int8kv.warmup(torch.bfloat16, d, hq // hkv, 1, "cuda", causal=False, seqused_k=False)
decode.warmup(torch.bfloat16, d, hq // hkv, 1, "cuda", causal=False, seqused_k=False)
calls = [("int8kv", lambda: decode_int8kv.forward(q, k8, v8, ks, vs, None, **flags)),
         ("bf16", lambda: decode.forward(q, kb, vb, None, **flags))]
profile_calls(calls, f"profiled b{b} x {sk} d{d}")
