"""Why decode of a tiny Llama is slower under our backend (sweep row h256 x2, b1; docs/benchmarks.md,
session 6, run 5). Run from the repo root: `python3 docs/scripts/decode_diag.py`."""
import torch
from torch._dynamo.utils import counters
import fa4_inductor
from fa4_inductor.bench import models, sweep
from fa4_inductor.bench.sweep import decode_step, decode_ms, Case

sm = sweep.sweep_models(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False)[0]
model = models.llama("sdpa", "cuda", torch.bfloat16, **models.llama_shape(256, 2))
case = Case("decode", 1, 512, False)
for name in ("default", "ours"):
    torch._dynamo.reset(); counters.clear()
    backend = "inductor" if name == "default" else fa4_inductor.fa4_inductor
    step = torch.compile(decode_step(model), backend=backend, mode="reduce-overhead", dynamic=True)
    with fa4_inductor.report.collecting() as records:
        ms, _ = decode_ms(step, model, sm, case, 16, "cuda")
        ms, _ = decode_ms(step, model, sm, case, 32, "cuda")
    print(f"{name}: {ms:.3f} ms/step", flush=True)
    print("  inductor counters:", {k: v for k, v in counters["inductor"].items() if "cudagraph" in k})
    for r in records:
        print("  ", str(r)[:300])
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        decode_ms(step, model, sm, case, 8, "cuda")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=70)[:5000])
