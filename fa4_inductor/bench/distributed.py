"""The Llama-1B-shaped HF model on two GPUs (NCCL), default torch.compile against ours:

    torchrun --nproc-per-node 2 -m fa4_inductor.bench.distributed [--suite tp-prefill,tp-decode,fsdp]
             [--attention sdpa,eager] [--dtensor] [--small | --tiny] [--decode-mode MODE] [--check]
             [--out FILE]

- `tp-prefill`: tensor parallel over both GPUs (q/k/v and gate/up `ColwiseParallel`, o and down
  `RowwiseParallel`, as HF's TP plans: each rank's attention takes its 16 query / 4 KV heads), batch 1,
  8k tokens, last-token logits: ms, fa4 attention calls per rank, logits against default torch.compile.
- `tp-decode`: the same model decoding with a static cache (HF sizes each rank's cache from its own KV heads),
  the one-token step under `mode="reduce-overhead"` (CUDA graphs around NCCL's all-reduces): tokens/s.
- `fsdp`: an FSDP2 training step (forward with labels, backward) at 4k tokens, each rank on its own batch
  (`--fsdp-layouts`): the parameters sharded at the root, the model compiled (one graph: attention rewritten);
  per decoder layer, each layer compiled (torchtitan's way: HF's mask code runs eagerly and skips the mask for
  sdpa code, so the layers' attention is causal and rewritten); `layers`: per decoder layer, the model
  compiled (FSDP2's hooks break the graph at each layer and HF's mask arrives as a graph input: attention
  stays as written, the same as default compile). ms, fa4 ops in the forward / backward graphs, loss and
  gradients against default torch.compile.

`--tiny` runs a 2-layer, hidden-64 model in float32 over gloo where there is no GPU (a smoke test of this
script). `--dtensor` keeps the attention projections' outputs as DTensors (`use_local_output=False`), so the op
runs on DTensors through `kernels/sharding.py`'s rules (prefill without a KV cache; not with `tp-decode`).
`--small` is a 4-layer, hidden-512 model at 1k tokens (the GPU tests run it); `--check` makes a wrong count or a
mismatch an error (exit status 1). Rank 0 prints markdown tables (`tables.Table`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import sys

import torch
import torch.distributed as dist

from .. import publishing
from . import llama_e2e, models, timing
from .models import BACKENDS, llama
from .tables import Table, attempt, environment, or_failed, speedup

SUITES = ("tp-prefill", "tp-decode", "fsdp")
SMALL = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=32000)
LOGITS_TOLERANCE = 5e-2  # relative to the largest logit: bf16 through every layer, in another summation order
LOSS_TOLERANCE = 5e-2  # absolute, on a loss near ln(vocab)
GRADIENT_TOLERANCE = 1e-1  # |ours - default| / |default| per parameter shard: bf16 backward; a wrong gradient is ~1
ATTENTION_FAMILIES = ("sdpa", "handwritten")
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=512)
DEVICE, DTYPE = "cuda", torch.bfloat16


class Mismatch(AssertionError):
    """`--check`: a count or a comparison that is not what it should be."""


def _setup() -> None:
    """NCCL over the local GPUs; gloo on a CPU (`--tiny`, a smoke test of this script, float32)."""
    global DEVICE, DTYPE
    if torch.cuda.is_available():
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        dist.init_process_group("gloo")
        DEVICE, DTYPE = "cpu", torch.float32


def _mesh():
    from torch.distributed.tensor import init_device_mesh

    return init_device_mesh(DEVICE, (dist.get_world_size(),))


def _dtype_name() -> str:
    return str(DTYPE).removeprefix("torch.")


def _gathered(value) -> list:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _attention_calls(records) -> int:
    return sum(r.rewritten and r.family in ATTENTION_FAMILIES for r in records)


def tp_model(attention: str, overrides: dict, dtensor: bool):
    """The model (the same random weights on every rank), its layers split over the ranks."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = llama(attention, DEVICE, DTYPE, **overrides)
    mesh = _mesh()
    plan = {f"self_attn.{p}": ColwiseParallel(use_local_output=not dtensor) for p in ("q_proj", "k_proj", "v_proj")}
    plan.update({"self_attn.o_proj": RowwiseParallel(), "mlp.gate_proj": ColwiseParallel(),
                 "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()})
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)
    return model


def _replicating(dtensor: bool):
    """DTensor attention inputs meet plain tensors (rotary tables, masks): treat those as replicated."""
    if not dtensor:
        return contextlib.nullcontext()
    from torch.distributed.tensor.experimental import implicit_replication

    return implicit_replication()


def tp_prefill(model, backend: str, tokens, dtensor: bool) -> tuple[float, torch.Tensor, int]:
    """(median ms, last-token logits, attention calls rewritten on this rank) of the compiled prefill (with
    HF's DynamicCache as `generate` runs it; without a cache on DTensors, which a cache of plain tensors
    cannot take)."""
    compiled = models.compile_model(model, backend)
    kwargs = dict(logits_to_keep=1, use_cache=not dtensor)
    with torch.no_grad(), _replicating(dtensor), publishing.collecting() as records:
        logits = compiled(tokens, **kwargs).logits.float()
        ms = timing.median_wall_ms(lambda: compiled(tokens, **kwargs), repeats=7)
    return ms, logits, _attention_calls(records)


def tp_prefill_suite(attentions, overrides, seqlen: int, dtensor: bool, check: bool):
    table = Table(f"Llama-1B-shaped HF model, TP={dist.get_world_size()}, prefill (ms, lower is better)",
                  ["attention code", "tokens", *BACKENDS, "speedup", "fa4 calls per rank", "logits differ by (relative)"],
                  note=f"{_dtype_name()}, batch 1, last-token logits; q/k/v, gate/up ColwiseParallel, o/down "
                       "RowwiseParallel" + (", attention on DTensors, no KV cache" if dtensor else ", DynamicCache")
                       + "; median of 7 forwards.")
    for attention in attentions:
        model = tp_model(attention, overrides, dtensor)
        tokens = torch.randint(0, model.config.vocab_size, (1, seqlen), generator=torch.Generator().manual_seed(1))
        tokens = tokens.to(DEVICE)
        results = {}
        for name, backend in BACKENDS.items():
            torch._dynamo.reset()
            results[name] = attempt(f"tp prefill {attention} {name}",
                                    functools.partial(tp_prefill, model, backend, tokens, dtensor))
        (base, base_logits, _), (ours, logits, calls) = (results[n] or (None, None, None) for n in BACKENDS)
        difference = None
        if base_logits is not None and logits is not None:
            difference = ((logits - base_logits).abs().max() / base_logits.abs().max()).item()
        calls, differences = zip(*_gathered((calls, difference)))
        difference = None if None in differences else max(differences)
        table.rows.append([attention, seqlen, or_failed(base), or_failed(ours), speedup(base, ours),
                           "/".join(map(str, calls)), "n/a" if difference is None else f"{difference:.1e}"])
        if check:
            _expect(all(c == model.config.num_hidden_layers for c in calls), f"tp prefill {attention}: fa4 calls {calls}")
            _expect(difference is not None and difference < LOGITS_TOLERANCE,
                    f"tp prefill {attention}: logits differ by {difference}")
        del model
    return table


def tp_decode_suite(attentions, overrides, prompt: int, steps: int, mode: str, check: bool):
    table = Table(f"Llama-1B-shaped HF model, TP={dist.get_world_size()}, decode with a static cache "
                  "(tokens/s, higher is better)",
                  ["attention code", "prompt", *BACKENDS, "speedup", "fa4 calls per rank", "logits differ by (relative)"],
                  note=f"{_dtype_name()}, batch 1, greedy, the one-token step compiled with mode={mode!r}; {steps} "
                       "steps, first 3 excluded; logits of the first two steps.")
    for attention in attentions:
        model = tp_model(attention, overrides, dtensor=False)
        results, calls = {}, 0
        for name, backend in BACKENDS.items():
            torch._dynamo.reset()
            with publishing.collecting() as records:
                results[name] = attempt(f"tp decode {attention} {name}", functools.partial(
                    llama_e2e.decode_tokens_per_s, model, backend, prompt, steps, DEVICE,
                    mode=mode))
            if backend == "fa4_inductor":
                calls = _attention_calls(records)
        (base, base_logits), (ours, logits) = (results[n] or (None, None) for n in BACKENDS)
        difference = None
        if base_logits is not None and logits is not None:
            difference = ((logits[:2] - base_logits[:2]).abs().max() / base_logits[:2].abs().max()).item()
        calls, differences = zip(*_gathered((calls, difference)))
        difference = None if None in differences else max(differences)
        table.rows.append([attention, prompt, or_failed(base), or_failed(ours), speedup(base, ours, invert=True),
                           "/".join(map(str, calls)), "n/a" if difference is None else f"{difference:.1e}"])
        if check:  # the decode step's graph (prefill runs eagerly)
            _expect(all(c == model.config.num_hidden_layers for c in calls), f"tp decode {attention}: fa4 calls {calls}")
            _expect(difference is not None and difference < LOGITS_TOLERANCE,
                    f"tp decode {attention}: logits differ by {difference}")
        del model
    return table


class _GraphCounter(torch._inductor.custom_graph_pass.CustomGraphPass):
    """The fa4 ops of each graph Inductor compiles (a user pass: the backend runs it after its own)."""

    def __init__(self):
        self.forward = self.backward = 0

    def __call__(self, graph) -> None:
        ops = [n.target.name() for n in graph.nodes
               if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "fa4"]
        if "fa4::attention_backward" in ops:
            self.backward += ops.count("fa4::attention_backward")
        else:
            self.forward += ops.count("fa4::attention_forward")

    def uuid(self) -> str:
        return "fa4-bench-graph-counter"


FSDP_LAYOUTS = {
    "root": "root, model compiled",
    "layers": "per layer + root, model compiled",
    "layers-compiled": "per layer + root, layers compiled",
}


def fsdp_step(attention: str, overrides: dict, layout: str, backend: str, tokens) -> dict:
    """A compiled FSDP2 training step (`FSDP_LAYOUTS`): median ms, the loss, this rank's gradient shards, fa4 ops
    counted in the compiled graphs (graphs that every layer shares count once)."""
    from torch.distributed.fsdp import fully_shard

    import fa4_inductor

    torch.manual_seed(0)
    model = llama(attention, DEVICE, DTYPE, **overrides).train()
    mesh = _mesh()
    for layer in model.model.layers if layout != "root" else []:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch._dynamo.reset()
    counter = _GraphCounter()
    if backend == "fa4_inductor":  # the counter needs a compile that runs the post-grad passes: no cache hit
        compile_args = dict(backend=fa4_inductor.fa4_inductor,
                            options={"post_grad_custom_pre_pass": counter, "fx_graph_cache": False})
    else:
        compile_args = {}
    if layout == "layers-compiled":  # torchtitan's way: HF's mask code runs eagerly
        for layer in model.model.layers:
            layer.compile(**compile_args)
        compiled = model
    else:
        compiled = torch.compile(model, **compile_args)
    losses = []

    def step():
        model.zero_grad(set_to_none=True)
        loss = compiled(tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        losses.append(loss.detach())

    with torch._functorch.config.patch(enable_autograd_cache=False):
        ms = timing.median_wall_ms(step, repeats=5)
    grads = [p.grad.to_local().float().clone() for p in model.parameters()]
    result = dict(ms=ms, loss=losses[0].item(), grads=grads, forward=counter.forward, backward=counter.backward)
    return result


def fsdp_suite(attentions, overrides, seqlen: int, layouts, check: bool):
    table = Table(f"Llama-1B-shaped HF model, FSDP2 over {dist.get_world_size()} GPUs, a training step "
                  "(ms, lower is better)",
                  ["attention code", "fully_shard", "tokens per rank", *BACKENDS, "speedup",
                   "fa4 ops fwd/bwd per rank", "loss differs by", "gradients differ by (relative)"],
                  note=f"{_dtype_name()} parameters, batch 1 per rank (each rank its own tokens), "
                       "`model(ids, labels=ids, use_cache=False).loss.backward()`; median of 5 steps after a compile.")
    vocab = (overrides or {}).get("vocab_size", models.LLAMA_1B["vocab_size"])
    tokens = torch.randint(0, vocab, (1, seqlen), generator=torch.Generator().manual_seed(10 + dist.get_rank())).to(DEVICE)
    for attention in attentions:
        for layout in layouts:
            results = {name: attempt(f"fsdp {attention} {layout} {name}",
                                     functools.partial(fsdp_step, attention, overrides, layout, backend, tokens))
                       for name, backend in BACKENDS.items()}
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            base, ours = (results[n] for n in BACKENDS)
            local = dict(forward=ours and ours["forward"], backward=ours and ours["backward"], loss=None, grads=None)
            if base and ours:
                local["loss"] = abs(ours["loss"] - base["loss"])
                local["grads"] = max((((a - b).norm() / b.norm().clamp_min(1e-12)).item()
                                      for a, b in zip(ours["grads"], base["grads"]) if a.numel()), default=0.0)
            every = _gathered(local)  # every rank gathers, whatever failed where
            counts, backward = [r["forward"] for r in every], [r["backward"] for r in every]
            loss_difference = None if any(r["loss"] is None for r in every) else max(r["loss"] for r in every)
            grad_difference = None if any(r["grads"] is None for r in every) else max(r["grads"] for r in every)
            table.rows.append([attention, FSDP_LAYOUTS[layout], seqlen, or_failed(base and base["ms"]), or_failed(ours and ours["ms"]),
                               speedup(base and base["ms"], ours and ours["ms"]),
                               " ".join(f"{f}/{b}" for f, b in zip(counts, backward)),
                               "n/a" if loss_difference is None else f"{loss_difference:.1e}",
                               "n/a" if grad_difference is None else f"{grad_difference:.1e}"])
            if check:
                layers = (overrides or {}).get("num_hidden_layers", models.LLAMA_1B["num_hidden_layers"])
                # The whole model compiled: one graph with every layer. Per-layer units: one graph all layers share,
                # rewritten where HF's mask code ran eagerly and skipped the mask (sdpa code, layers compiled).
                expected = layers if layout == "root" else 1 if (layout, attention) == ("layers-compiled", "sdpa") else 0
                _expect(counts == backward == [expected] * dist.get_world_size(),
                        f"fsdp {attention} {layout}: fa4 ops forward {counts}, backward {backward}, want {expected}")
                _expect(loss_difference is not None and loss_difference < LOSS_TOLERANCE,
                        f"fsdp {attention} {layout}: loss differs by {loss_difference}")
                _expect(grad_difference is not None and grad_difference < GRADIENT_TOLERANCE,
                        f"fsdp {attention} {layout}: gradients differ by {grad_difference}")
    return table


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise Mismatch(message)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node 2 -m fa4_inductor.bench.distributed",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default=",".join(SUITES), help=f"comma-separated, from {SUITES}")
    parser.add_argument("--attention", default="sdpa", help="attention codes, comma-separated: sdpa, eager")
    parser.add_argument("--dtensor", action="store_true", help="attention on DTensors (use_local_output=False)")
    parser.add_argument("--small", action="store_true", help="4 layers, hidden 512, 1k tokens (a quick check)")
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 64, 64 tokens: a smoke test on CPUs")
    parser.add_argument("--decode-mode", default="reduce-overhead",
                        help="torch.compile mode of the decode step (default: reduce-overhead, CUDA graphs)")
    parser.add_argument("--fsdp-layouts", default="root,layers-compiled",
                        help=f"comma-separated, from {tuple(FSDP_LAYOUTS)}: fully_shard at the root with the model "
                             "compiled; per decoder layer too, the model compiled; per layer, each layer compiled")
    parser.add_argument("--check", action="store_true", help="exit 1 on a wrong fa4 count or a mismatch")
    parser.add_argument("--out", help="rank 0 writes the tables (markdown) here")
    args = parser.parse_args(argv)
    suites = [s for s in args.suite.split(",") if s]
    if set(suites) - set(SUITES):
        parser.error(f"unknown suites {sorted(set(suites) - set(SUITES))}")
    if args.dtensor and "tp-decode" in suites:
        parser.error("--dtensor: HF's static cache holds plain tensors, which DTensor keys cannot be written into")
    attentions = [a for a in args.attention.split(",") if a]
    layouts = [layout for layout in args.fsdp_layouts.split(",") if layout]
    if set(layouts) - set(FSDP_LAYOUTS):
        parser.error(f"unknown FSDP layouts {sorted(set(layouts) - set(FSDP_LAYOUTS))}")
    overrides = TINY if args.tiny else SMALL if args.small else {}
    prefill_tokens, prompt, train_tokens = (64, 16, 64) if args.tiny else (1024, 256, 1024) if args.small else \
        (8192, 2048, 4096)

    _setup()
    importlib.import_module("fa4_inductor.kernels")  # the ops and their sharding rules

    rank = dist.get_rank()
    tables, failed = [], None
    try:
        for suite in suites:
            if suite == "tp-prefill":
                tables.append(tp_prefill_suite(attentions, overrides, prefill_tokens, args.dtensor, args.check))
            elif suite == "tp-decode":
                mode = args.decode_mode if DEVICE == "cuda" else "default"
                tables.append(tp_decode_suite(attentions, overrides, prompt, 32, mode, args.check))
            else:
                tables.append(fsdp_suite(attentions, overrides, train_tokens, layouts, args.check))
            if rank == 0:
                print(tables[-1].markdown(), flush=True)
    except Mismatch as e:
        failed = e
    if rank == 0:
        command = ["torchrun --nproc-per-node", str(dist.get_world_size()), "-m fa4_inductor.bench.distributed",
                   *(argv if argv is not None else sys.argv[1:])]
        header = (f"## `{' '.join(command)}`\n\n"
                  + ", ".join(f"{k} {v}" for k, v in environment().items()) + "\n\n")
        if args.out:
            with open(args.out, "w") as f:
                f.write(header + "\n".join(t.markdown() for t in tables))
        if failed is not None:
            print(f"CHECK FAILED: {failed}", file=sys.stderr, flush=True)
    # a rank that tears gloo down while its peer still writes the tables aborts the peer ("terminate called without
    # an active exception")
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed is not None else 0


if __name__ == "__main__":
    sys.exit(main())
