"""Hardware counters of the split-KV decode kernels at batch 1 (issue 16: a b1 call's ~10 us beyond its bytes).

    ncu --clock-control none --profile-from-start off --set full -o $OUT/decode python3 docs/scripts/ncu_decode.py
    ncu --import $OUT/decode.ncu-rep --page source --print-source sass --csv > $OUT/decode_sass.csv

hq32 / hkv8, one query token, bf16 q: the int8-KV kernel at 4k and 32k keys (d128), the bf16 kernel at 32k, each at its
rule's split count (main kernel and combine), run once outside the profiled range (compiles), then once inside it.
"""

import sys

from ncu_range import profile_calls

from fa4_inductor.kernels import decode, decode_int8kv

sys.path.insert(0, "tests")
from bench_decode_int8kv import make_cache  # noqa: E402

calls = []
for sk in (4096, 32768):
    q, k8, v8, ks, vs, kb, vb = make_cache(1, sk, 32, 8, 128)
    calls.append((f"int8kv b1 x {sk}", lambda q=q, k8=k8, v8=v8, ks=ks, vs=vs: decode_int8kv.forward(
        q, k8, v8, ks, vs, None, scale=128 ** -0.5, causal=False)))
    if sk == 32768:
        calls.append((f"bf16 b1 x {sk}", lambda q=q, kb=kb, vb=vb: decode.forward(
            q, kb, vb, None, scale=128 ** -0.5, causal=False)))
profile_calls(calls, "profiled (main kernel, combine each)")
