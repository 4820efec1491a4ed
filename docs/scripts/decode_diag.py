"""Why a tiny Llama is slower under our backend (sweep row h256 x2; docs/benchmarks.md, session 6 run 5,
sessions 7 and 15). Run from the repo root: `python3 docs/scripts/decode_diag.py [batch] [prompt] [phase]`,
phase "decode" (default: static-cache steps under reduce-overhead) or "prefill" (the sweep's `dynamic=True`
forward, `use_cache=False`).

Per backend: ms per step (or forward), best of 3 measurements; where the host time goes (cProfile, the
functions with the most cumulative time); which ops run on the CPU side per call, by count, and the GPU
kernels per call with their total time (torch.profiler)."""
import cProfile
import io
import pstats
import sys

import torch
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

import fa4_inductor
from fa4_inductor.bench import models, sweep, timing
from fa4_inductor.bench.sweep import Case, decode_ms, decode_step, prefill_call, sweep_inputs

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 512
phase = sys.argv[3] if len(sys.argv) > 3 else "decode"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the script
sm = sweep.sweep_models(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False)[0]
model = models.llama("sdpa", DEVICE, torch.bfloat16, **models.llama_shape(256, 2))
case = Case(phase, batch, prompt, False)
STEPS = 16
CALLS = STEPS + sweep.WARM_DECODE_STEPS if phase == "decode" else 20


def measured(name):
    """(ms a call, a function running CALLS calls) for one backend, compiled as the sweep compiles it."""
    backend = "inductor" if name == "default" else fa4_inductor.fa4_inductor
    if phase == "decode":
        step = torch.compile(decode_step(model), backend=backend, mode="reduce-overhead" if DEVICE == "cuda" else None,
                             dynamic=True)
        decode_ms(step, model, sm, case, STEPS, DEVICE)
        return min(decode_ms(step, model, sm, case, STEPS, DEVICE)[0] for _ in range(3)), \
            lambda: decode_ms(step, model, sm, case, STEPS, DEVICE)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    call, _ = prefill_call(compiled, sm, *sweep_inputs(sm, model.config.vocab_size, case, DEVICE))

    def calls():
        for _ in range(CALLS):
            call()
        timing.sync()
    return min(timing.median_wall_ms(call, repeats=30) for _ in range(3)), calls


with torch.no_grad():
    for name in ("default", "ours"):
        torch._dynamo.reset()
        counters.clear()
        with fa4_inductor.report.collecting() as records:
            ms, run_calls = measured(name)
        print(f"\n===== {name}: {ms:.3f} ms a {phase} call (b{batch}, prompt {prompt})", flush=True)
        print("inductor counters:", dict(counters["inductor"]))
        print("graph breaks / recompiles:", dict(counters["graph_break"]), dict(counters["recompiles"]))
        for r in records:
            print("  record:", str(r)[:240])
        prof = cProfile.Profile()
        prof.enable()
        run_calls()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
        print(f"cProfile of {CALLS} calls:\n", text.getvalue()[:9000])
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            run_calls()
        events = p.key_averages()
        cpu = sorted((e for e in events if e.count >= CALLS), key=lambda e: -e.count)[:30]
        print("CPU-side ops seen at least once per call (count per call, self CPU us per call):")
        for e in cpu:
            print(f"  {e.count / CALLS:6.1f}  {e.self_cpu_time_total / CALLS:8.1f}  {e.key[:90]}")
        gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        print(f"GPU kernels: {sum(e.self_device_time_total for e in gpu) / CALLS:.1f} us per call in all; the largest "
              "(count per call, us per call):")
        for e in sorted(gpu, key=lambda e: -e.self_device_time_total)[:25]:
            print(f"  {e.count / CALLS:6.1f}  {e.self_device_time_total / CALLS:8.1f}  {e.key[:90]}")
