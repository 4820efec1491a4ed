"""Issue 12's training step past its GEMMs: what fusing the gated MLP's activation into its GEMMs' epilogues would save.

One Llama MLP layer, `down(silu(gate(x)) * up(x))`, forward and backward at the training step's size, ms (median,
L2 flushed between runs, `bench.gpu_ms`):
- "inductor": the layer under default torch.compile, separate gate / up weights (cuBLAS GEMMs, Triton SiLU and its
  backward), as the training step runs it now;
- "inductor, gate_up": the same with one concatenated [2I, H] weight (one GEMM for gate and up);
- "quack, gate_up": quack's gated MLP (`quack.mlp.mlp_func`, activation swiglu, concat layout): SiLU x up in the
  gate / up GEMM's epilogue forward, and its backward in the down GEMM's dX epilogue (`gemm_dgated`);
- "quack, cat each step": the same over the separate weights, concatenated every step (what a rewrite of a model with
  separate gate / up parameters would pay).
Each row's output and gradients are compared with the first row's (max error relative to the largest value). The
step has `layers` such MLPs: the last column is what each row would take or save there.

    python3 docs/scripts/mlp_fusion.py [tokens hidden intermediate layers]    # default 4096 2048 8192 16
"""
import contextvars
import sys
import types

import torch
import torch.nn.functional as F

from fa4_inductor.bench import gpu_ms


def _key_context_vars():
    """quack 0.6.5 keys each GEMM epilogue by the values its function reaches, and CuTe DSL 4.8.1 puts a ContextVar of
    source-location transforms among them, and the C methods its location code calls (`code.co_positions`), which
    quack has no key for (sessions 37 and 39: importing its epilogue library raised TypeError). The variable holds
    debug locations and the methods are CPython's, not math: key them by name."""
    from quack.gemm_runtime import identity

    keyed = identity.semantic_value_key
    c_methods = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                 types.GetSetDescriptorType, types.MemberDescriptorType)

    def semantic_value_key(value, seen):
        if isinstance(value, contextvars.ContextVar):
            return ("contextvar", value.name)
        if isinstance(value, c_methods):
            return ("c method", value.__objclass__.__qualname__, value.__name__)
        return keyed(value, seen)

    identity.semantic_value_key = semantic_value_key


def main():
    tokens, hidden, inter, layers = (int(a) for a in sys.argv[1:5]) if len(sys.argv) > 4 else (4096, 2048, 8192, 16)
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(tokens, hidden, device=dev, dtype=dt, requires_grad=True)
    w_gate = (torch.randn(inter, hidden, device=dev, dtype=dt) / hidden ** 0.5).requires_grad_()
    w_up = (torch.randn(inter, hidden, device=dev, dtype=dt) / hidden ** 0.5).requires_grad_()
    w_down = (torch.randn(hidden, inter, device=dev, dtype=dt) / inter ** 0.5).requires_grad_()
    w_gate_up = torch.cat([w_gate, w_up]).detach().requires_grad_()
    dy = torch.randn(tokens, hidden, device=dev, dtype=dt)

    def separate(x, wg, wu, wd):
        return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)

    def concatenated(x, wgu, wd):
        g, u = F.linear(x, wgu).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, wd)

    rows = {"inductor": (torch.compile(separate), (x, w_gate, w_up, w_down)),
            "inductor, gate_up": (torch.compile(concatenated), (x, w_gate_up, w_down))}
    try:
        _key_context_vars()
        from quack.mlp import mlp_func

        rows["quack, gate_up"] = (lambda x, wgu, wd: mlp_func(x, wgu, wd, "swiglu", concat_layout=True),
                                  (x, w_gate_up, w_down))
        rows["quack, cat each step"] = (
            lambda x, wg, wu, wd: mlp_func(x, torch.cat([wg, wu]), wd, "swiglu", concat_layout=True),
            (x, w_gate, w_up, w_down))
    except ImportError as e:
        print(f"quack not importable ({e}): its rows are left out")

    def step(fn, args):
        for a in args:
            a.grad = None
        out = fn(*args)
        out.backward(dy)
        return out

    def results(fn, args):
        out = step(fn, args)
        grads = [a.grad for a in args]
        if len(args) == 3:  # [gate; up] as one weight: split its gradient to compare with the separate ones
            grads = [grads[0], *grads[1].chunk(2), grads[2]]
        return [out.detach().float()] + [g.float() for g in grads]

    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, {tokens} tokens, hidden {hidden}, "
          f"intermediate {inter}, {layers} layers")
    print("| MLP | forward + backward ms | error vs the first row (out, dx, dgate, dup, ddown) | the step's "
          f"{layers} layers, ms against the first |")
    print("|---|---|---|---|")
    first = first_ms = None
    for name, (fn, args) in rows.items():
        got = results(fn, args)
        ms = gpu_ms(lambda: step(fn, args))
        first, first_ms = (got, ms) if first is None else (first, first_ms)
        errors = ", ".join(f"{(g - r).abs().max().item() / r.abs().max().item():.1e}" for g, r in zip(got, first))
        print(f"| {name} | {ms:.3f} | {errors} | {layers * (ms - first_ms):+.2f} |")


if __name__ == "__main__":
    main()
