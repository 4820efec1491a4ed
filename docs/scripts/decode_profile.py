"""Where a compiled decode step of the Llama-1B-shaped model goes on the GPU, under our backend: wall ms per step
against the summed kernel time per step (a gap means host-bound steps, e.g. skipped CUDA graphs), the CUDA-graph
skips Inductor counted, and the kernels that take the most time.

    python docs/scripts/decode_profile.py nvfp4    # batch 1, 4k prompt: torchao NVFP4, plain-tensor NVFP4, bf16 weights
    python docs/scripts/decode_profile.py nvfp4 plain,bf16   # only those (`torchao`, `plain`, `bf16`)
    python docs/scripts/decode_profile.py nvfp4 plain sibling_linears=0   # a backend option changed
    python docs/scripts/decode_profile.py nvfp4 plain attribute=1   # also each kernel's launching op (no CUDA graphs)
    python docs/scripts/decode_profile.py nvfp4 plain lm_head=1     # lm_head quantized too (torchao's default filter)
    python docs/scripts/decode_profile.py int8kv   # batch 8 x 32k cache: Int8StaticCache against StaticCache
    python docs/scripts/decode_profile.py fp8      # torchao fp8 x fp8 (per row) under ours and under default compile
    python docs/scripts/decode_profile.py fp8 plain    # the same codes as plain buffers (`fp8.from_torchao`), ours
    python docs/scripts/decode_profile.py fp8 ours,default host=1   # also the host's functions over the timed steps
    python docs/scripts/decode_profile.py quant nvfp4 ours,default  # torchao weights of a format, as `fp8` does
"""
import cProfile
import io
import pstats
import sys
import time

import torch
import torch.nn as nn
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

from fa4_inductor.bench import int8_kv, models, quant
from fa4_inductor.hf import cache_keyword

STEPS = 8  # profiled steps
WALL_STEPS = 64  # timed steps (8 left a spread of ~0.06 ms/step between runs)
OPTIONS = {}  # backend options from the command line (name=0 / name=1)
ATTRIBUTE = []  # attribute=1: a step compiled without CUDA graphs, each kernel under the CPU op that launched it
LM_HEAD = []  # lm_head=1: quantize lm_head too (untying it from the embedding), as torchao's default filter does
HOST = []  # host=1: the Python functions that take the host's time over WALL_STEPS steps (cProfile, by own time)


def step_fn(model, cache, batch, filled):
    kwargs = {cache_keyword(model): cache}

    def step(token, position):
        return model(token, position_ids=position, **kwargs, use_cache=True).logits[:, -1]

    token = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    position = torch.full((batch, 1), filled, device="cuda")
    return step, token, position


def report(label, model, cache, batch, filled, backend=None):
    torch._dynamo.reset()
    counters.clear()
    step, token, position = step_fn(model, cache, batch, filled)
    with torch.no_grad():
        step(token, position)  # an eager step first: a StaticCache allocates its tensors on first use
    compiled = torch.compile(step, backend=backend or quant.ours_backend(**OPTIONS), mode="reduce-overhead",
                             fullgraph=True)
    with torch.no_grad():
        for _ in range(4):
            compiled(token.clone(), position.clone())
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(WALL_STEPS):
            compiled(token.clone(), position.clone())
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / WALL_STEPS * 1e3
        host = cProfile.Profile() if HOST else None
        if host:
            host.enable()
            for _ in range(WALL_STEPS):
                compiled(token.clone(), position.clone())
            torch.cuda.synchronize()
            host.disable()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                compiled(token.clone(), position.clone())
            torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda e: -e.device_time_total)
    busy = sum(e.device_time_total for e in rows) / STEPS / 1e3
    # a kernel launched under PDL (the decode combine, the split-K reduce) waits on the GPU from its launch, early
    # in the kernel before it, so the sum counts that overlap twice and can exceed the wall time
    print(f"==== {label}: {wall:.3f} ms/step wall, {busy:.3f} ms/step of kernels (summed); "
          f"cudagraph skips {counters['inductor']['cudagraph_skips']}")
    for e in rows[:18]:
        print(f"  {e.device_time_total / STEPS:8.1f} us/step {e.count / STEPS:6.1f}/step  {e.key[:110]}")
    if host:
        text = io.StringIO()
        pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(25)
        print(f"  host, {WALL_STEPS} steps (cProfile's own overhead included):\n{text.getvalue()}")
    if ATTRIBUTE:
        attribute(step, token, position)


def attribute(step, token, position):
    """Each kernel of a decode step under the innermost CPU op that launched it (CUDA graphs hide that: this
    compile has none), by GPU time a step."""
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=quant.ours_backend(**OPTIONS), fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            compiled(token.clone(), position.clone())
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                compiled(token.clone(), position.clone())
            torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        for kernel in getattr(e, "kernels", ()):
            key = (kernel.name[:70], e.name[:50])
            time_, count = totals.get(key, (0.0, 0))
            totals[key] = (time_ + kernel.duration, count + 1)
    print("  kernels by launching op (no CUDA graphs):")
    for (kernel, op), (time_, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:30]:
        print(f"  {time_ / STEPS:8.1f} us/step {count / STEPS:6.1f}/step  {kernel}  <-  {op}")


def nvfp4(kinds="torchao,plain,bf16", prompt=4096):
    """torchao `NVFP4WeightOnlyConfig` weights (tensor subclasses), the same codes as plain tensors in
    `fa4_inductor.nvfp4.NVFP4Linear` modules (`nvfp4.from_torchao`: no subclass to unwrap per call), and bf16."""
    from torchao.quantization import quantize_
    from transformers import StaticCache

    from fa4_inductor import nvfp4 as plain_nvfp4

    for weights in ("torchao nvfp4", "plain nvfp4", "bf16"):
        if weights.split()[0] not in kinds.split(","):
            continue
        torch.manual_seed(0)
        model = models.llama("sdpa", "cuda", torch.bfloat16)
        if weights != "bf16":
            quantize_(model, quant._nvfp4_weight_only_config(),
                      filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and (LM_HEAD or "lm_head" not in fqn))
        if weights == "plain nvfp4":
            plain_nvfp4.from_torchao(model)
        cache = StaticCache(config=model.config, max_cache_len=prompt + 64)
        report(f"{weights} weights{' (lm_head too)' if LM_HEAD and weights != 'bf16' else ''}, batch 1, position "
               f"{prompt}", model, cache, 1, prompt)
        del model, cache
        torch.cuda.empty_cache()


def torchao_runs(fmt, kinds="ours,default", prompt=4096):
    """torchao weights of `fmt` ("fp8": `Float8DynamicActivationFloat8WeightConfig` per row; "nvfp4", "int8": weight
    only), built as the quant bench's end-to-end runs build them ("ours", "default", "plain": `quant.e2e_runs`), under
    their backend (ours with this command's options)."""
    from transformers import StaticCache

    for kind in kinds.split(","):
        _, name, backend, model = quant._llama_for(f"{fmt}:{kind}", "cuda", torch.bfloat16)
        cache = StaticCache(config=model.config, max_cache_len=prompt + 64)
        report(f"{fmt} weights, {name}, batch 1, position {prompt}", model, cache, 1, prompt,
               backend if kind == "default" else None)
        del model, cache
        torch.cuda.empty_cache()


def int8kv(batch="8", capacity=32768):
    batch = int(batch)
    torch.manual_seed(0)
    model = models.llama("sdpa", "cuda", torch.bfloat16)
    for kind in int8_kv.CACHES:
        filled = capacity - 2 * (WALL_STEPS + STEPS)  # newer caches advance their own write index every step
        cache = int8_kv.filled_cache(model, kind, batch, capacity, filled, "cuda")
        report(f"{kind} cache, batch {batch} x {capacity}", model, cache, batch, filled)
        del cache
        torch.cuda.empty_cache()


if __name__ == "__main__":
    OPTIONS.update((a.split("=")[0], a.split("=")[1] == "1") for a in sys.argv[2:] if "=" in a)
    if OPTIONS.pop("attribute", False):
        ATTRIBUTE.append(True)
    if OPTIONS.pop("lm_head", False):
        LM_HEAD.append(True)
    if OPTIONS.pop("host", False):
        HOST.append(True)
    commands = {"nvfp4": nvfp4, "int8kv": int8kv, "fp8": lambda *a: torchao_runs("fp8", *a), "quant": torchao_runs}
    commands[sys.argv[1]](*(a for a in sys.argv[2:] if "=" not in a))
