"""A training step around frozen quantized weights (QLoRA-style fine-tuning: every linear but lm_head quantized by
torchao and frozen, the norms, the embedding and lm_head trained), Llama-1B shape: ms a step and the step's peak
memory, default torch.compile against ours with and without `recompute_dequantized_weights`
(lowering/joint_graph.py), and the loss of each against eager's.

    python docs/scripts/quant_train.py [int8|nvfp4|fp8] [tokens]      # default: int8 2048
    python docs/scripts/quant_train.py int8 64 cpu                     # a smoke run: hidden 256 x 2 layers on the CPU
    python docs/scripts/quant_train.py nvfp4 2048 cuda default,off,on  # some of eager, default, off, on, all

"on" is the backend's default (int8 and fp8 recomputed, NVFP4 saved since session 55), "all" recomputes every format.

Compiling the step takes minutes a backend (H100 machine: ~200 s with cold caches, ~90 s served from Inductor's
caches). To fill the caches at once, run one process a backend with QUANT_TRAIN_WARM=1 (compile, one step, no
timing) side by side, then time them all in one process. QUANT_TRAIN_PROFILE=1 adds each step's costliest
kernels, QUANT_TRAIN_PROFILE=2 the host's costliest calls too. Never time processes side by side: another's steps run on
the same GPU (session 54: 39.1 against 30.2 ms/step for the same int8 step).

Without the joint stage a compiled step holds each quantized weight dequantized to bf16 from its forward to its
backward (2 bytes a weight, ~2.4 GB at this shape), where eager holds none.
"""
import os
import sys
import time

import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor.bench import models, quant

STEPS = 5


def build(fmt: str, device: str):
    from torchao.quantization import quantize_

    torch.manual_seed(0)
    small = models.llama_shape(256, 2) if device == "cpu" else {}
    model = models.llama("sdpa", device, torch.bfloat16, **small)
    quantize_(model, quant.E2E_CONFIGS[fmt](),
              filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and "lm_head" not in fqn)
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not model.lm_head:
            module.requires_grad_(False)
    return model.train()


def run(label: str, model, step_model, ids) -> float:
    def step():
        model.zero_grad(set_to_none=True)
        loss = step_model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach()

    cuda = ids.is_cuda
    loss = step()
    if os.environ.get("QUANT_TRAIN_WARM"):
        print(f"{label:48s} compiled (QUANT_TRAIN_WARM: not timed)", flush=True)
        return loss.item()
    step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / STEPS * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    print(f"{label:48s} {ms:8.2f} ms/step  peak {peak:6.2f} GiB  loss {loss.item():.5f}", flush=True)
    profile = os.environ.get("QUANT_TRAIN_PROFILE")
    if cuda and profile:  # the step's 12 costliest kernels; with "2", also the host's costliest calls (CUDA API ones)
        activities = [torch.profiler.ProfilerActivity.CUDA] + ([torch.profiler.ProfilerActivity.CPU] if profile == "2"
                                                              else [])
        with torch.profiler.profile(activities=activities) as prof:
            step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
        if profile == "2":
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=70))
    return loss.item()


def main():
    fmt = sys.argv[1] if len(sys.argv) > 1 else "int8"
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    which = sys.argv[4].split(",") if len(sys.argv) > 4 else ["eager", "default", "off", "on"]
    model = build(fmt, device)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), device=device)
    print(f"{fmt} weights, Llama-1B shape, {tokens} tokens, frozen quantized linears, `labels=` loss")
    if "eager" in which:
        run("eager", model, model, ids)
    for key, label, backend in (("default", "default torch.compile", "inductor"),
                                ("off", "fa4_inductor, recompute_dequantized_weights=False",
                                 fa4_inductor.backend(recompute_dequantized_weights=False)),
                                ("on", "fa4_inductor", fa4_inductor.backend()),
                                ("all", "fa4_inductor, recompute_dequantized_weights=True",
                                 fa4_inductor.backend(recompute_dequantized_weights=True))):
        if key not in which:
            continue
        torch._dynamo.reset()
        run(label, model, torch.compile(model, backend=backend), ids)


if __name__ == "__main__":
    main()
