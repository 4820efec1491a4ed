"""Session 23 (for the next device run): packed sequences (explicit position_ids restarting every 512 tokens, no
attention_mask: HF builds a block-diagonal causal mask from them), Llama-1B shape, sdpa code, 1 x 8192 tokens:
inference forward and a training step (labels), default compile against ours with and without `run_time_masks`
(FA4 varlen over the packed sequences); loss / logits against uncompiled.
    python scratch/packed.py [sdpa|eager]   (session 29: eager code's packed training reaches the op)"""
import sys

import torch
import fa4_inductor
from fa4_inductor.bench import models, timing

impl = sys.argv[1] if len(sys.argv) > 1 else "sdpa"
model = models.llama(impl, "cuda", torch.bfloat16)
tokens = torch.randint(1, model.config.vocab_size, (1, 8192), device="cuda")
positions = torch.arange(8192, device="cuda").remainder(512)[None]
backends = {"default": "inductor", "ours": "fa4_inductor", "ours, run_time_masks": fa4_inductor.backend(run_time_masks=True)}
with torch.no_grad():
    ref = model(tokens, position_ids=positions, use_cache=False, logits_to_keep=1).logits.float()
for name, backend in backends.items():
    torch._dynamo.reset()
    compiled = models.compile_model(model, backend)
    model.eval()
    with torch.no_grad():
        run = lambda: compiled(tokens, position_ids=positions, use_cache=False, logits_to_keep=1)
        err = (run().logits.float() - ref).abs().max().item()
        ms = timing.median_wall_ms(run, repeats=7)
    print(f"{impl} packed 16 x 512 in 1 x 8192, forward | {name} | {ms:.2f} ms | last logits vs uncompiled {err:.3g}", flush=True)
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        compiled(tokens, position_ids=positions, use_cache=False, labels=tokens).loss.backward()

    try:
        ms = timing.median_wall_ms(step, repeats=5)
        print(f"{impl} packed 16 x 512 in 1 x 8192, training step | {name} | {ms:.2f} ms | peak "
              f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    except torch.OutOfMemoryError:  # default compile of eager code keeps [32, 8192, 8192] scores a layer
        print(f"{impl} packed 16 x 512 in 1 x 8192, training step | {name} | out of memory "
              f"({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)", flush=True)
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model.eval()
