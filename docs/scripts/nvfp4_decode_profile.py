"""GPU kernels per decode step of the Llama-1B-shaped model with torchao NVFP4 weights under our backend
(and bf16 under ours for comparison): what makes NVFP4 decode slower than bf16."""
import collections, sys
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile
from torchao.quantization import quantize_
from fa4_inductor.bench import models, quant
from fa4_inductor.bench.llama_e2e import decode_tokens_per_s
import fa4_inductor

STEPS = 24
for weights in ("nvfp4", "bf16"):
    torch.manual_seed(0)
    model = models.llama("sdpa", "cuda", torch.bfloat16)
    if weights == "nvfp4":
        quantize_(model, quant._nvfp4_weight_only_config(),
                  filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
    torch._dynamo.reset()
    backend = quant.ours_backend()
    with fa4_inductor.report.collecting() as records:
        rate, _ = decode_tokens_per_s(model, backend, 512, 8, "cuda")
    ops = collections.Counter(str(r).split(":")[0][:80] for r in records)
    print(f"==== {weights}: warm {1e3/rate:.3f} ms/token; records: {ops.most_common(8)}")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        rate, _ = decode_tokens_per_s(model, backend, 512, STEPS, "cuda")
    print(f"{weights}: {1e3/rate:.3f} ms/token (profiled)")
    per = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name[:90]][0] += 1
            per[e.name[:90]][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])[:25]
    total = sum(v[1] for v in per.values())
    print(f"total GPU us over {STEPS} steps + prefill: {total:.0f}")
    for name, (n, us) in rows:
        print(f"  {us/STEPS:8.1f} us/step  {n/STEPS:6.1f} calls/step  {name}")
    del model
