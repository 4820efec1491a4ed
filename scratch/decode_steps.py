"""Session 17: the tiny Llama's (h256 x 2) batch-8 decode step, step by step, each backend: is the sweep's 0.56x row
a few slow steps (re-records, collections) or every step?  python3 scratch/decode_steps.py [seq ...]"""
import statistics
import sys
import time

import torch

from fa4_inductor.bench import models, sweep, timing

device = "cuda" if torch.cuda.is_available() else "cpu"
seqs = [int(s) for s in sys.argv[1:]] or [128, 512]
sm = sweep.SweepModel("llama", tuple(models.llama_shape(256, 2).items()), decode=True)
torch.manual_seed(0)
model = sm.build(device, torch.bfloat16)
for name, backend in sweep.BACKENDS.items():
    torch._dynamo.reset()
    step_fn = models.compile_model(sweep.decode_step(model), backend, mode="reduce-overhead" if device == "cuda" else "default", dynamic=True,
                                   fullgraph=True)
    for seq in seqs:
        case = sweep.Case("decode", 8, seq, False)
        for run in range(3):
            times = []
            real = timing.per_step_ms

            def per_step(step, steps, warm=3):
                def timed(i):
                    timing.sync()
                    t = time.perf_counter()
                    step(i)
                    timing.sync()
                    times.append((time.perf_counter() - t) * 1e3)
                return real(timed, steps, warm)
            timing.per_step_ms = per_step
            try:
                ms, _ = sweep.decode_ms(step_fn, model, sm, case, 32, device)
            finally:
                timing.per_step_ms = real
            steady = times[3:]
            print(f"{name:8s} b8 s{seq:5d} run {run}: {ms:.3f} ms/step (synced steps: median {statistics.median(steady):.3f}, "
                  f"max {max(steady):.3f}; warm {', '.join(f'{t:.1f}' for t in times[:3])})", flush=True)
