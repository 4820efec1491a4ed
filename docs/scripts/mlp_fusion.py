"""Issue 12's training step past its GEMMs: what fusing the gated MLP's activation into its GEMMs' epilogues would save.

One Llama MLP layer, `down(silu(gate(x)) * up(x))`, forward and backward at the training step's size, ms (median,
L2 flushed between runs, `bench.gpu_ms`):
- "inductor": the layer under default torch.compile, separate gate / up weights (cuBLAS GEMMs, Triton SiLU and its
  backward), as the training step runs it now;
- "inductor, gate_up": the same with one concatenated [2I, H] weight (one GEMM for gate and up);
- "quack untuned / tuned, gate_up": quack's gated MLP (`quack.mlp.mlp_func`, activation swiglu, concat layout):
  SiLU x up in the gate / up GEMM's epilogue forward, and its backward in the down GEMM's dX epilogue (`gemm_dgated`);
  untuned takes quack's default and heuristic configs, tuned autotunes each GEMM on its first call;
- "quack ..., cat each step": the same over the separate weights, concatenated every step (what a rewrite of a model
  with separate gate / up parameters would pay).
Each row's output and gradients are compared with the first row's (max error relative to the largest value). The
step has `layers` such MLPs: the last column is what each row would take or save there.

    python3 docs/scripts/mlp_fusion.py [tokens hidden intermediate layers]    # default 4096 2048 8192 16
"""
import os
import sys

import torch
import torch.nn.functional as F

from fa4_inductor.bench import gpu_ms


def _installed_code_is_extern():
    """quack keys each GEMM epilogue by the source of every function it reaches, except installed code, which it keys
    by name; it takes a file for installed when its path has a site-packages or dist-packages folder. The GPU machine
    installs the packages with `pip --target /opt/fa4-site`, so quack read CuTe DSL's own functions and stopped at
    values it has no key for (sessions 37 and 39: a ContextVar, then `code.co_positions`). Count every file beside
    quack's package (the same install root) as installed, as site-packages would be."""
    import quack
    from quack.gemm_runtime import identity

    root = os.path.dirname(os.path.dirname(os.path.abspath(quack.__file__))) + os.sep
    is_extern = identity._is_extern_function

    def extern(fn):
        module = getattr(fn, "__module__", None) or ""
        code = getattr(fn, "__code__", None)
        beside_quack = (code is not None and os.path.abspath(code.co_filename).startswith(root)
                        and module != "quack" and not module.startswith("quack."))
        return is_extern(fn) or beside_quack

    identity._is_extern_function = extern


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
        _installed_code_is_extern()
        from quack.mlp import mlp_func

        # untuned first (quack's default and heuristic configs, no autotuning): the tuned row compiles every config of
        # each of its GEMMs on the first call, which can outlast the GPU call's timeout
        for tuned in (False, True):
            tag = "tuned" if tuned else "untuned"
            rows[f"quack {tag}, gate_up"] = (
                lambda x, wgu, wd, tuned=tuned: mlp_func(x, wgu, wd, "swiglu", tuned=tuned, concat_layout=True),
                (x, w_gate_up, w_down))
            rows[f"quack {tag}, cat each step"] = (
                lambda x, wg, wu, wd, tuned=tuned: mlp_func(x, torch.cat([wg, wu]), wd, "swiglu", tuned=tuned,
                                                            concat_layout=True),
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
        try:
            got = results(fn, args)
            ms = gpu_ms(lambda: step(fn, args))
        except Exception as e:  # one failing row (a quack compile) leaves the others
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:300]} | | |")
            continue
        first, first_ms = (got, ms) if first is None else (first, first_ms)
        errors = ", ".join(f"{(g - r).abs().max().item() / r.abs().max().item():.1e}" for g, r in zip(got, first))
        print(f"| {name} | {ms:.3f} | {errors} | {layers * (ms - first_ms):+.2f} |")


if __name__ == "__main__":
    main()
