"""The GEMMs of a Llama-shaped training step, one by one, on cuBLAS (what Inductor calls for `F.linear` and its
backward): for each projection the forward (x @ W^T), the input gradient (dy @ W) and the weight gradient
(dy^T @ x), timed as CUDA-graph replays (`bench.gpu_ms`, median), with TFLOP/s. Then the same for the projections that
read the same x fused by concatenating their weights (q / k / v -> one [3072, 2048] weight, gate / up -> one
[16384, 2048]): what a step would save if the sibling linears of a training graph ran as one GEMM.

    python3 docs/scripts/train_gemms.py [tokens] [hidden,intermediate,q_heads,kv_heads,head_dim,layers,vocab]

Defaults: 4096 tokens, Llama-3.2-1B (2048, 8192, 32, 8, 64, 16, 128256).
"""
import sys

import torch

from fa4_inductor.bench import gpu_ms


def graph_us(fn) -> float:
    return gpu_ms(fn, cuda_graph=True) * 1e3


def linear_us(tokens: int, n: int, k: int) -> tuple[float, float, float]:
    """(forward, input gradient, weight gradient) microseconds of a [n, k] bf16 linear over `tokens` rows."""
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    return (graph_us(lambda: torch.mm(x, w.t())), graph_us(lambda: torch.mm(dy, w)),
            graph_us(lambda: torch.mm(dy.t(), x)))


def main():
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    shape = sys.argv[2] if len(sys.argv) > 2 else "2048,8192,32,8,64,16,128256"
    hidden, inter, hq, hkv, d, layers, vocab = map(int, shape.split(","))
    projections = {"q": (hq * d, hidden), "k": (hkv * d, hidden), "v": (hkv * d, hidden), "o": (hidden, hq * d),
                   "gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter),
                   "lm_head": (vocab, hidden), "qkv": ((hq + 2 * hkv) * d, hidden), "gate_up": (2 * inter, hidden)}
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, {tokens} tokens, hidden {hidden}, "
          f"intermediate {inter}, heads {hq}/{hkv} x {d}, {layers} layers, vocab {vocab}")
    print("| projection | N x K | forward us | dX us | dW us | all three us | TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    step = {}
    for name, (n, k) in projections.items():
        times = linear_us(tokens, n, k)
        step[name] = sum(times)
        flop = 3 * 2 * tokens * n * k
        print(f"| {name} | {n} x {k} | {times[0]:.1f} | {times[1]:.1f} | {times[2]:.1f} | {step[name]:.1f} | "
              f"{flop / step[name] / 1e6:.0f} |")
    separate = layers * sum(step[p] for p in ("q", "k", "v", "o", "gate", "up", "down")) + step["lm_head"]
    fused = layers * (step["qkv"] + step["o"] + step["gate_up"] + step["down"]) + step["lm_head"]
    print(f"a step's GEMMs: {separate / 1e3:.2f} ms as separate projections; {fused / 1e3:.2f} ms with q/k/v and "
          f"gate/up fused (q/k/v {layers * (step['q'] + step['k'] + step['v'] - step['qkv']) / 1e3:+.2f} ms, "
          f"gate/up {layers * (step['gate'] + step['up'] - step['gate_up']) / 1e3:+.2f} ms saved)")


if __name__ == "__main__":
    main()
