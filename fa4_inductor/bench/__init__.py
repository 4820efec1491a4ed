"""`python -m fa4_inductor bench`: the GPU benchmarks behind `docs/benchmarks.md`.

Suites (`--suite`, comma-separated; all but `crossover`, `int8kv`, `families` and `sweep` by default):
- `op`: prefill attention, `fa4::attention` against FA4 called directly (`flash_attn_func`) and SDPA
  (cuDNN and flash backends), 16k tokens per batch over sequence lengths 1k..16k, head dims 64 / 128,
  causal and not; TFLOP/s from GPU time (`triton.testing.do_bench`, median).
- `overhead`: host cost per call of a tiny attention (the GPU is idle, so launches are the limit):
  FA4 directly, our adapter (`kernels/fa4.forward`), the `fa4::attention` op, and a compiled SDPA
  call under our backend and under default `torch.compile`.
- `crossover` (only when named): causal attention through `fa4::attention` against SDPA, head dims
  32 / 64 / 128, b1 / b8, 128..8k tokens: back-to-back microseconds (host included) and CUDA-graph GPU
  time, with the GFLOP `lowering/crossover.py` compares (the data its thresholds come from).
- `decode`: one query token against a KV cache (GQA), `fa4::attention` (whichever kernel it picks)
  against SDPA `enable_gqa` and FA4 directly; GPU time under a CUDA graph, as TB/s of K/V read.
- `e2e`: a Llama-1B-shaped HF transformers model (hidden 2048, 16 layers, 32 query / 8 KV heads,
  bf16, random weights) with `attn_implementation` "eager" and "sdpa": prefill latency at 2k / 8k
  tokens, and decode tokens/s with a static cache under `mode="reduce-overhead"`, default
  `torch.compile` against `backend=fa4_inductor`.
- `generate`: the same model through HF's own `generate(cache_implementation="static")`, which
  compiles the decode step itself (`CompileConfig(backend=...)`, its default `reduce-overhead`
  mode): a left-padded batch of 4, time to first token (prefill with the padding mask) and decode
  tokens/s, default `torch.compile` against our backend.
- `padded`: the same model on a left-padded batch of 4 x 2048 (0/100/700/1500 pad tokens, the
  `attention_mask` generate passes; its prefill also into a static cache, with the 4-D mask generate builds),
  a right-padded one (the same pads at the end: fine-tuning batches) and
  that batch without a mask: prefill and a training step
  (`use_cache=False`, labels, backward), default `torch.compile` against ours.
- `train`: the same model's training step at batch 1 x 4096 tokens (`use_cache=False`, HF's labels
  loss or the logits' mean, backward), eager and sdpa attention code: ms and peak memory, default `torch.compile` against ours.
- `quant` (only when named): quantized linears (`quant.py`): per weight format (int8 weight-only, int8 x int8,
  nvfp4 once its op exists) a GEMM table over Llama-1B / Llama-8B projection shapes and M = 1..4096, our op
  (and each of its CUDA routes forced) against bf16 cuBLAS, default `torch.compile` of the same torchao
  module, that module under our backend and quack called directly (CUDA-graph medians); then Llama-1B-shaped
  int8 / NVFP4 weight-only static-cache decode and a 2048-token prefill with each model's logits error against
  bf16, ours against default compile and bf16. `--quant-models`, `--quant-formats`, `--quant-rows`,
  `--quant-no-e2e`, `--quant-e2e-runs`, `--quant-no-prefill`, `--quant-prefill-runs` cut it into runs of a few
  minutes.
- `int8kv` (only when named, ~4 compiles of the 16-layer model): static-cache decode at batch 8 x 32k keys (head
  dim 64) from a bfloat16 `StaticCache` against `fa4_inductor.Int8StaticCache`, default torch.compile against
  ours: ms per step, the K/V bytes a step reads, logits against the bfloat16 cache (`int8_kv.py`).
- `families` (only when named; ~2 min a family on the H200): HF decoders other than Llama at their released
  shapes with 4 layers (Qwen3, Mistral with a window, Gemma 2's eager code with its softcap, Gemma 3, Phi-3's head
  dim 96, Pythia's partial rotary, GPT-2 small, OLMo 2): prefill, left-padded prefill, a training step and
  static-cache decode, default `torch.compile` against ours (`families.py`); `--families` picks some.
- `sweep` (only when named; its first H200 run spent its 450 s budget on the first model): Llama-shaped models from hidden 256 x 2 layers to
  2048 x 16 and a BERT-base encoder, prefill and static-cache decode, sequence lengths 128..8192,
  batch 1 and 8, padded and not; each row ours against default `torch.compile`, flagged below 0.98x
  (`sweep.py` says how it keeps the compile count down).

Results print as markdown tables; `--out FILE` writes them (with the date, GPU, versions and the
command) and `--plot FILE.png` draws the op suite. Suite functions take a `device` so the CPU test
suite can run them on tiny shapes; numbers only mean something on a GPU.

Modules: `timing.py` (GPU, wall-clock and host-per-call timing, also used by the demo), `tables.py`
(`Table`, environment, plot, failure cells), `models.py` (HF model builders, `compile_model`), one
module per suite family (`attention_op.py`: op / overhead / decode; `llama_e2e.py`: e2e / generate;
`padded.py`; `training.py`; `sweep.py`; `families.py`; `int8_kv.py`), and here the suite registry and the command line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from dataclasses import asdict

import torch

from . import attention_op, families, int8_kv, llama_e2e, models, padded, quant, sweep, tables, timing, training
from .attention_op import attention_impls, backward_suite, crossover_suite, decode_kernel_comparison, decode_suite, op_suite, overhead_suite
from .families import families_suite
from .int8_kv import int8_kv_suite
from .llama_e2e import decode_tokens_per_s, e2e_suite, generate_suite, generate_times, prefill_ms
from .models import LLAMA_1B, compile_model, padded_batch, llama
from .padded import padded_ms, padded_suite
from .quant import quant_suite
from .sweep import sweep_suite
from .tables import Table, environment, plot
from .timing import gpu_ms, host_us_per_call, median_wall_ms
from .training import train_suite

# `--suite` name -> function returning a Table or yielding Tables.
SUITE_FUNCTIONS = {"op": op_suite, "backward": backward_suite, "overhead": overhead_suite, "crossover": crossover_suite, "decode": decode_suite, "e2e": e2e_suite,
                   "generate": generate_suite, "padded": padded_suite, "train": train_suite, "sweep": sweep_suite,
                   "families": families_suite, "quant": quant_suite, "int8kv": int8_kv_suite}
SUITES = tuple(SUITE_FUNCTIONS)
DEFAULT_SUITES = ("op", "overhead", "decode", "e2e", "generate", "padded", "train")  # the others when named

__all__ = ["DEFAULT_SUITES", "LLAMA_1B", "SUITES", "SUITE_FUNCTIONS", "Table", "attention_impls", "attention_op", "backward_suite",
           "compile_model", "crossover_suite", "sweep_selection", "decode_kernel_comparison", "decode_suite", "decode_tokens_per_s", "e2e_suite",
           "environment", "families", "families_suite", "generate_suite", "generate_times", "gpu_ms", "host_us_per_call", "int8_kv", "int8_kv_suite",
           "padded_batch",
           "llama", "llama_e2e", "main", "median_wall_ms", "models", "op_suite", "overhead_suite", "padded",
           "padded_ms", "padded_suite", "plot", "prefill_ms", "quant", "quant_selection", "quant_suite", "sweep", "sweep_suite", "tables", "timing",
           "train_suite", "training"]


def _comma_list(value: str) -> tuple[str, ...]:
    """A comma-separated option's non-empty items, stripped."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


def sweep_selection(models: str | None) -> dict:
    """`sweep_suite` arguments for `--sweep-models` ("256x2,bert": Llama hidden 256 x 2 layers and BERT)."""
    if not models:
        return {}
    names = _comma_list(models)
    llama = tuple(tuple(int(x) for x in m.split("x")) for m in names if m != "bert")
    return dict(llama_sizes=llama, decode_sizes=tuple(size for size in sweep.DECODE_SIZES if size in llama),
                bert="bert" in names)


def families_selection(chosen: str | None) -> list[dict]:
    """`families_suite` calls for `--families` ("gemma2:prefill+train,gpt2": Gemma 2's prefill and training rows,
    every GPT-2 row), one call per family so each keeps its own cases."""
    if not chosen:
        return [{}]
    calls = []
    for item in _comma_list(chosen):
        name, _, cases = item.partition(":")
        unknown = {name} - set(families.FAMILIES) | set(cases.split("+") if cases else ()) - set(families.CASES)
        if unknown:
            raise SystemExit(f"--families: unknown {sorted(unknown)}")
        calls.append(dict(families=(name,), **({"cases": tuple(cases.split("+"))} if cases else {})))
    return calls


def quant_selection(args) -> dict:
    """`quant_suite` arguments from `--quant-models llama-1b --quant-formats int8 --quant-rows 1,16
    --quant-no-e2e`."""
    selection = {}
    if args.quant_models:
        selection["models"] = _comma_list(args.quant_models)
    if args.quant_formats:
        selection["formats"] = _comma_list(args.quant_formats)
    if args.quant_rows:
        selection["rows"] = tuple(map(int, _comma_list(args.quant_rows)))
    if args.quant_no_e2e:
        selection["e2e"] = False
    if args.quant_prompt:
        selection["e2e_prompt"] = args.quant_prompt
    if getattr(args, "quant_e2e_runs", None):
        selection["e2e_runs"] = _comma_list(args.quant_e2e_runs)
    if getattr(args, "quant_no_prefill", False):
        selection["prefill"] = False
    if getattr(args, "quant_prefill_runs", None):
        selection["prefill_runs"] = _comma_list(args.quant_prefill_runs)
    return selection


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fa4_inductor bench", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default=",".join(DEFAULT_SUITES),
                        help=f"comma-separated, from {SUITES} (default: all but crossover, sweep, families, quant and int8kv)")
    parser.add_argument("--sweep-models", help="the sweep's models, e.g. '256x2,2048x16,bert' (hidden x layers "
                                               "for Llama; default: all), so the sweep can be split across runs")
    parser.add_argument("--families", help=f"the families suite's models, from {tuple(families.FAMILIES)}; "
                                           "optionally :cases after each, e.g. 'gemma2:prefill+train,gpt2' (cases "
                                           f"from {families.CASES}; default: all)")
    parser.add_argument("--quant-models", help=f"the quant suite's models, from {tuple(quant.SHAPES)} (default: all)")
    parser.add_argument("--quant-formats", help=f"the quant suite's formats, from {tuple(quant.FORMATS)} (default: all)")
    parser.add_argument("--quant-rows", help=f"the quant suite's M values (default: {','.join(map(str, quant.ROWS))})")
    parser.add_argument("--quant-no-e2e", action="store_true", help="the quant suite without its end-to-end decode")
    parser.add_argument("--quant-e2e-runs", help="the end-to-end decode's runs only, e.g. 'bf16:default,nvfp4:plain' "
                                                 "(weights:backend, backend default, ours or plain; default: all); "
                                                 "'--quant-formats none' skips the GEMM tables")
    parser.add_argument("--quant-no-prefill", action="store_true",
                        help="the quant suite without its 2048-token prefill and logits-error table")
    parser.add_argument("--quant-prefill-runs", help="the prefill table's runs only (as --quant-e2e-runs)")
    parser.add_argument("--quant-prompt", type=int, help="the quant suite's end-to-end prompt length (default 512)")
    parser.add_argument("--out", help="write the tables (markdown) here")
    parser.add_argument("--json", help="write the raw tables as JSON here")
    parser.add_argument("--plot", help="write the op suite's plot (PNG) here")
    args = parser.parse_args(argv)
    suites = [s for s in args.suite.split(",") if s]
    unknown = set(suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}")
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU", file=sys.stderr)
        return 2
    importlib.import_module("fa4_inductor.kernels")  # registers the fa4:: ops

    env = environment()
    command = "python -m fa4_inductor bench " + " ".join(argv if argv is not None else sys.argv[1:])
    print(json.dumps(env))
    produced_tables: list[Table] = []
    for suite in suites:
        started = time.perf_counter()
        calls = (families_selection(args.families) if suite == "families" else
                 [sweep_selection(args.sweep_models) if suite == "sweep" else quant_selection(args) if suite == "quant"
                  else {}])
        produced = [SUITE_FUNCTIONS[suite](**kwargs) for kwargs in calls]
        for table in (t for p in produced for t in ([p] if isinstance(p, Table) else p)):
            produced_tables.append(table)
            print(table.markdown(), flush=True)
            if args.plot and suite == "op":
                plot(table, args.plot)
        print(f"[{suite} took {time.perf_counter() - started:.0f} s]", flush=True)
    header = (f"## {env['date']}: `{command}`\n\n" + ", ".join(f"{k} {v}" for k, v in env.items() if k != "date") + "\n\n")
    if args.out:
        with open(args.out, "w") as f:
            f.write(header + "\n".join(t.markdown() for t in produced_tables))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "command": command, "tables": [asdict(t) for t in produced_tables]}, f,
                      indent=1)
    return 0
