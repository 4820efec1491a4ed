"""Host cost of one small attention call on each path the op could take (issue 12: tiny models are host-bound).
Run from the repo root on a GPU: `python3 docs/scripts/small_attention_host.py`.

Per shape (the size sweep's hidden-256 Llama: 4 query heads over 1 KV head, head dim 64, causal, bf16):
- back-to-back calls, host us a call (`timing.host_us_per_call`: what a host-bound graph pays), for cuDNN / flash /
  efficient SDPA called as aten ops (what default compile's wrapper calls), `fa4::attention_forward` on its
  `sdpa_small` route and with FA4_INDUCTOR_SMALL_ON_FA4=1 (FA4), and eager `F.scaled_dot_product_attention`;
- decode steps (one query over a 512-key cache) captured in a CUDA graph, two layers' worth: host us a replay of
  our split-KV decode kernel (+ combine) against cuDNN SDPA's, the one cost a reduce-overhead step pays per graph."""
import os

import torch
import torch.nn.functional as F

import fa4_inductor  # noqa: F401  (registers fa4::)
from fa4_inductor.bench.attention_op import _hf_qkv
from fa4_inductor.bench.timing import host_us_per_call
from fa4_inductor.kernels import switches

aten, fa4 = torch.ops.aten, torch.ops.fa4


def paths(q, k, v, scale):
    """name -> a no-argument call of that path."""
    group = q.shape[1] // k.shape[1]
    kr, vr = (t.repeat_interleave(group, 1) for t in (k, v))
    return {
        "aten cuDNN SDPA (GQA native)": lambda: aten._scaled_dot_product_cudnn_attention.default(
            q, k, v, None, True, 0.0, True, False, scale=scale),
        "aten flash SDPA (K/V repeated)": lambda: aten._scaled_dot_product_flash_attention.default(
            q, kr, vr, 0.0, True, False, scale=scale),
        "aten efficient SDPA (K/V repeated)": lambda: aten._scaled_dot_product_efficient_attention.default(
            q, kr, vr, None, True, 0.0, True, scale=scale),
        "fa4::attention_forward": lambda: fa4.attention_forward.default(q, k, v, None, None, scale=scale, causal=True),
        "eager F.sdpa(enable_gqa)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                                           enable_gqa=True),
    }


def host_table():
    print("| b x s | path | host us a call |\n|---|---|---|")
    for b, s in ((1, 128), (1, 2048), (8, 128), (8, 2048)):
        q, k, v = _hf_qkv(b, s, s, 4, 1, 64, torch.bfloat16, "cuda")
        for name, call in paths(q, k, v, 0.125).items():
            try:
                print(f"| {b} x {s} | {name} | {host_us_per_call(call):.1f} |", flush=True)
            except Exception as e:  # a path that cannot run this shape
                print(f"| {b} x {s} | {name} | failed: {type(e).__name__}: {str(e)[:120]} |", flush=True)
        os.environ[switches.SMALL_ON_FA4] = "1"
        switches.reset()
        call = paths(q, k, v, 0.125)["fa4::attention_forward"]
        print(f"| {b} x {s} | fa4::attention_forward, FA4_INDUCTOR_SMALL_ON_FA4=1 | {host_us_per_call(call):.1f} |")
        del os.environ[switches.SMALL_ON_FA4]
        switches.reset()


def replay_table(layers=2, cache=512):
    """Host us a replay of a CUDA graph holding `layers` decode attentions, per kernel."""
    q = torch.randn(1, 1, 4, 64, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    k, v = (torch.randn(1, cache, 1, 64, dtype=torch.bfloat16, device="cuda").transpose(1, 2) for _ in range(2))
    used = torch.full((1,), cache - 7, dtype=torch.int32, device="cuda")
    steps = {
        "our split-KV decode kernel (seqused_k)": lambda: fa4.attention_forward.default(
            q, k, v, used, None, scale=0.125, causal=True),
        "cuDNN SDPA (whole cache)": lambda: aten._scaled_dot_product_cudnn_attention.default(
            q, k, v, None, True, 0.0, False, False, scale=0.125),
    }
    print(f"\n| CUDA graph of {layers} decode attentions | host us a replay | us a replay, 100 back to back |")
    print("|---|---|---|")
    for name, step in steps.items():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(layers):
                step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        torch.cuda.synchronize()
        start.record()
        for _ in range(100):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        print(f"| {name} | {host_us_per_call(graph.replay):.1f} | {start.elapsed_time(end) * 10:.1f} |", flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        host_table()
        replay_table()
