"""Why decode of a tiny Llama is slower under our backend (sweep row h256 x2, b1; docs/benchmarks.md,
session 6, run 5; session 7). Run from the repo root: `python3 docs/scripts/decode_diag.py [batch] [prompt]`.

Per backend: ms per step; where the host time of a step goes (cProfile of steady-state steps, the
functions with the most cumulative time); which ops run outside CUDA graphs (torch.profiler CPU ops
per step, by count) and the GPU kernels per step with their total time."""
import cProfile
import io
import pstats
import sys

import torch
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

import fa4_inductor
from fa4_inductor.bench import models, sweep
from fa4_inductor.bench.sweep import Case, decode_ms, decode_step

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 512
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the script
sm = sweep.sweep_models(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False)[0]
model = models.llama("sdpa", DEVICE, torch.bfloat16, **models.llama_shape(256, 2))
case = Case("decode", batch, prompt, False)
STEPS = 16
for name in ("default", "ours"):
    torch._dynamo.reset()
    counters.clear()
    backend = "inductor" if name == "default" else fa4_inductor.fa4_inductor
    step = torch.compile(decode_step(model), backend=backend, mode="reduce-overhead" if DEVICE == "cuda" else None, dynamic=True)
    with fa4_inductor.report.collecting() as records:
        decode_ms(step, model, sm, case, STEPS, DEVICE)
    ms = min(decode_ms(step, model, sm, case, STEPS, DEVICE)[0] for _ in range(3))
    print(f"\n===== {name}: {ms:.3f} ms/step (b{batch}, prompt {prompt})", flush=True)
    print("inductor counters:", dict(counters["inductor"]))
    print("graph breaks / recompiles:", dict(counters["graph_break"]), dict(counters["recompiles"]))
    for r in records:
        print("  record:", str(r)[:240])
    prof = cProfile.Profile()
    prof.enable()
    decode_ms(step, model, sm, case, STEPS, DEVICE)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    print(f"cProfile of {STEPS + sweep.WARM_DECODE_STEPS} steps (+ the prefill):\n", text.getvalue()[:9000])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        decode_ms(step, model, sm, case, STEPS, DEVICE)
    events = p.key_averages()
    steps = STEPS + sweep.WARM_DECODE_STEPS
    cpu = sorted((e for e in events if e.count >= steps), key=lambda e: -e.count)[:30]
    print("CPU-side ops seen at least once per step (count per step, self CPU us per step):")
    for e in cpu:
        print(f"  {e.count / steps:6.1f}  {e.self_cpu_time_total / steps:8.1f}  {e.key[:90]}")
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu = sorted(gpu, key=lambda e: -e.self_device_time_total)[:25]
    print("GPU kernels (count per step, us per step):")
    for e in gpu:
        print(f"  {e.count / steps:6.1f}  {e.self_device_time_total / steps:8.1f}  {e.key[:90]}")
