"""Why `bench --suite quant` e2e reads ~1.25 ms/token where decode_profile reads ~0.82 (same model, same step)."""
import time
import torch, torch.nn as nn
from torch.profiler import ProfilerActivity, profile
from torch._dynamo.utils import counters
from transformers import StaticCache
from torchao.quantization import quantize_
from fa4_inductor.bench import models, quant, timing
from fa4_inductor import nvfp4 as plain_nvfp4
from fa4_inductor.hf import cache_keyword

prompt = 4096
torch.manual_seed(0)
model = models.llama("sdpa", "cuda", torch.bfloat16)
quantize_(model, quant._nvfp4_weight_only_config(), filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
plain_nvfp4.from_torchao(model)
cache = StaticCache(config=model.config, max_cache_len=prompt + 64 + 8)
def step(token, position):
    return model(token, position_ids=position, **{cache_keyword(model): cache}, use_cache=True).logits[:, -1]
compiled = torch.compile(step, backend=quant.ours_backend(), mode="reduce-overhead", fullgraph=True)
tokens = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0)).cuda()
with torch.no_grad():
    state = {}
    def prefill():
        cache.reset()
        logits = model(tokens, position_ids=torch.arange(prompt, device="cuda")[None], **{cache_keyword(model): cache}, use_cache=True).logits[:, -1]
        state.update(token=logits.argmax(-1), position=torch.tensor([[prompt]], device="cuda"))
    prefill()
    seen = []
    def bench_step(i):
        lg = compiled(state["token"][:, None].clone(), state["position"].clone())
        state["token"] = lg.argmax(-1); seen.append(lg.float()); state["position"] += 1
    def bench_step_nofloat(i):
        lg = compiled(state["token"][:, None].clone(), state["position"].clone())
        state["token"] = lg.argmax(-1); state["position"] += 1
    tok0, pos0 = state["token"][:, None].clone(), torch.tensor([[prompt]], device="cuda")
    def fixed_step(i):
        compiled(tok0.clone(), pos0.clone())
    def fixed_pos_moving(i):
        compiled(tok0.clone(), pos0 + i)
    def enqueue_only(fn):
        prefill(); torch.cuda.synchronize()
        for i in range(3): fn(i)
        torch.cuda.synchronize(); t = time.perf_counter()
        for i in range(3, 64): fn(i)
        host = (time.perf_counter() - t) * 1e3 / 61
        torch.cuda.synchronize(); wall = (time.perf_counter() - t) * 1e3 / 61
        return host, wall
    for name, fn in [("bench", bench_step), ("bench", bench_step), ("bench no float", bench_step_nofloat),
                     ("fixed", fixed_step), ("fixed token, moving position", fixed_pos_moving), ("bench", bench_step)]:
        prefill(); seen.clear()
        ms = timing.per_step_ms(fn, 64)
        host, wall = enqueue_only(fn); seen.clear()
        print(f"   enqueue {host:.3f} ms/step, wall {wall:.3f}")
        print(f"{name:32s} {ms:.3f} ms/step  skips {counters['inductor']['cudagraph_skips']}  recompiles {counters['stats'].get('unique_graphs')}", flush=True)
    prefill()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for i in range(8): bench_step(i)
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0]
    print("kernels/step ms", sum(e.device_time_total for e in rows) / 8 / 1e3)
    cpu = sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)[:25]
    for e in cpu: print(f"  cpu {e.cpu_time_total/8:9.1f} us/step  n {e.count/8:5.1f}  {e.key[:90]}")
