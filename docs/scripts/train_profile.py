"""Where a compiled training step of the Llama-1B-shaped model goes on the GPU (issue 12's <= 55 ms target): wall ms
per step against the summed kernel time, and the kernel time by kind (FA4 attention forward / backward, cuBLAS and
CUTLASS GEMMs, Triton kernels of Inductor, the rest), the kernels that take the most time, then the GPU's idle
time between kernels and its longest gaps (the step's 3.5 ms of wall beyond its kernels, session 12).

    python docs/scripts/train_profile.py [eager|sdpa] [tokens] [backends] [use_cache values]
                                          # default: sdpa 4096 fa4_inductor,inductor False

A backend is "fa4_inductor" or "inductor" (default compile), optionally with our options and a compile mode:
"fa4_inductor:rotary_tables=0@reduce-overhead". With TRAIN_PROFILE_KERNELS=<folder>, every kernel of the step
(ms a step, launches a step, name) goes to <folder>/<backend>_<code>.txt.

The step is the train suite's "logits mean" step: `model(ids, use_cache=False).logits.mean().backward()`, and the
same with `use_cache=True` when asked (issue 12's 53.7 ms was measured that way).

TRAIN_PROFILE_ATEN_EMBEDDING_BACKWARD=1 drops Inductor's decomposition of the embedding's backward (a float32
[vocab, hidden] of zeros, index_put with accumulation, a cast: ~1 GB written and read again at Llama's 128256 x 2048,
0.58 ms a step in session 32), so that ATen's CUDA kernel runs it (zeros in bf16, the rows summed apart).
"""
import collections
import os
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from fa4_inductor.bench import models

TIMED = 10  # steps timed: wall clock over all of them, and each step's GPU time between CUDA events
KINDS = (("attention", ("flash", "fmha", "attention")), ("gemm", ("gemm", "nvjet", "sm90_xmma", "cutlass", "cublas")),
         ("triton", ("triton",)))


def kind(name: str) -> str:
    lowered = name.lower()
    return next((k for k, keys in KINDS if any(key in lowered for key in keys)), "other")


def idle_gaps(prof, steps: int, shown: int = 12, floor_us: float = 5.0) -> None:
    """The GPU's idle time between kernels (gaps of at least `floor_us`) a step, and the longest gaps with the
    kernels either side: where the step waits on the host."""
    kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    gaps, end, last = [], None, None
    for e in kernels:
        if end is not None and e.time_range.start - end >= floor_us:
            gaps.append((e.time_range.start - end, last, e.name, e.time_range.start - kernels[0].time_range.start))
        if end is None or e.time_range.end > end:
            end, last = e.time_range.end, e.name
    print(f"   idle {sum(g[0] for g in gaps) / steps / 1e3:.2f} ms/step in {len(gaps) / steps:.0f} gaps of >= "
          f"{floor_us:g} us; the longest:")
    for gap, before, after, at in sorted(gaps, key=lambda g: -g[0])[:shown]:
        print(f"   {gap:9.1f} us at {at / 1e3:7.2f} ms  after {before[:50]}  before {after[:50]}")


def main():
    attention = sys.argv[1] if len(sys.argv) > 1 else "sdpa"
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    backends = sys.argv[3].split(",") if len(sys.argv) > 3 else ("fa4_inductor", "inductor")
    caches = [v == "True" for v in sys.argv[4].split(",")] if len(sys.argv) > 4 else [False]
    if os.environ.get("TRAIN_PROFILE_ATEN_EMBEDDING_BACKWARD") == "1":
        from torch._inductor import decomposition

        decomposition.decompositions.pop(torch.ops.aten.embedding_dense_backward.default, None)
    for backend, use_cache in ((b, c) for b in backends for c in caches):
        torch.manual_seed(0)
        torch._dynamo.reset()
        model = models.llama(attention, "cuda", torch.bfloat16).train()
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), device="cuda")
        compiled = compile_as(model, backend)

        def step():
            model.zero_grad(set_to_none=True)
            compiled(ids, use_cache=use_cache).logits.mean().backward()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED + 1)]
        start = time.perf_counter()
        marks[0].record()
        for i in range(TIMED):
            step()
            marks[i + 1].record()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / TIMED * 1e3
        gpu = sorted(a.elapsed_time(b) for a, b in zip(marks, marks[1:]))[TIMED // 2]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                step()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.self_device_time_total > 0]  # kernels (ops: 0 of their own)
        total = sum(e.self_device_time_total for e in events) / 2 / 1e3
        by_kind = collections.Counter()
        for e in events:
            by_kind[kind(e.key)] += e.self_device_time_total / 2 / 1e3
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / 2 / 1e3
        print(f"== {backend}, {attention} code, {tokens} tokens, use_cache={use_cache}: wall {wall:.1f} ms/step "
              f"(mean of {TIMED}), GPU {gpu:.1f} ms/step (median), kernels {total:.1f} ms/step, profiled span "
              f"{span:.1f} ms/step, {len(kernels) / 2:.0f} launches/step")
        if os.environ.get("TRAIN_PROFILE_KERNELS"):
            path = os.path.join(os.environ["TRAIN_PROFILE_KERNELS"], f"{backend}_{attention}.txt".replace("/", "_"))
            with open(path, "w") as f:
                for e in sorted(events, key=lambda e: -e.self_device_time_total):
                    f.write(f"{e.self_device_time_total / 2 / 1e3:8.3f} ms {e.count / 2:6.0f}x  {e.key}\n")
        print("   " + ", ".join(f"{k} {v:.1f} ms" for k, v in by_kind.most_common()))
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:14]:
            print(f"   {e.self_device_time_total / 2 / 1e3:7.2f} ms  {e.count // 2:5d}x  {e.key[:110]}")
        idle_gaps(prof, 2)
        del model, compiled


def compile_as(model, spec: str):
    """`model` compiled as `spec` says (module docstring)."""
    import fa4_inductor

    spec, _, mode = spec.partition("@")
    name, _, options = spec.partition(":")
    kwargs = {"mode": mode} if mode else {}
    if name != "fa4_inductor":
        return torch.compile(model, **kwargs)
    flags = dict(o.split("=") for o in options.split(",") if o)
    return torch.compile(model, backend=fa4_inductor.backend(**{k: v == "1" for k, v in flags.items()}), **kwargs)


if __name__ == "__main__":
    main()
