"""`python -m fa4_inductor demo | explain MODEL | bench [--suite ...]`.

MODEL is `module:function` (returning (model_or_fn, example_args)), or a transformers model built from
its config shrunk to a tiny size (random weights): `hf:llama` or `llama` (any model type: its default config, no
download), `hf:/path/to/checkpoint` or the path itself (its config.json), `hf:Qwen/Qwen3-0.6B` or the Hub id itself
(its config.json alone is downloaded).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        from .bench import main as bench

        return bench(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m fa4_inductor")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile a small Llama-style model, print the rewrites, check against eager")
    demo.add_argument("--seq-len", type=int, default=None, help="tokens per forward (default: 64 on CPU, 2048 on GPU)")
    sub.add_parser("bench", help="GPU benchmarks (see `python -m fa4_inductor bench --help`)")
    explain = sub.add_parser("explain", help="report the rewrites for a model, layer by layer")
    explain.add_argument("model", help=MODEL_HELP)
    explain.add_argument("--attn", default=None, choices=["eager", "sdpa"],
                         help="transformers attn_implementation for hf: models (default: sdpa, eager where the "
                              "model has no sdpa code)")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from .demo import run

        return run(args.seq_len)
    module, colon, function = args.model.partition(":")
    if module == "hf" or not colon:
        name = function if colon else module
        reason = transformers_name_reason(name)
        if reason:
            print(f"{args.model}: {reason}; MODEL is {MODEL_HELP}")
            return 2
        return explain_transformers(name, args.attn)
    import fa4_inductor

    fn, example_args = getattr(importlib.import_module(module), function)()
    report = fa4_inductor.explain(fn, *example_args)
    return 0 if not report.kept else 2


MODEL_HELP = ("MODULE:FUNCTION returning (model_or_fn, example_args), a transformers model type (llama), a local "
              "checkpoint path or a Hugging Face Hub id (Qwen/Qwen3-0.6B; hf: in front is optional)")


def transformers_name_reason(name: str) -> str | None:
    """Why `name` names no transformers model `explain` can build (None: a model type, a local path, or what can be
    a Hub id: owner/name)."""
    if os.path.exists(name):
        return None
    try:
        import transformers
    except ImportError:
        return "transformers is not installed"
    if name in transformers.CONFIG_MAPPING:
        return None
    owner, slash, repo = name.partition("/")
    if slash and owner and repo and "/" not in repo:
        return None
    return "not a transformers model type, an existing path or a Hub id (owner/name)"


def explain_transformers(name: str, attn_implementation: str) -> int:
    """Per-layer coverage of a tiny transformers model, for each phase (prefill, decode, padded input)."""
    import torch

    from . import hf
    from .backend import fa4_inductor
    from .report import Report, collecting

    try:
        unsupported = hf.unsupported(name, attn_implementation or "sdpa")
    except (OSError, ValueError) as e:  # a Hub id offline or unknown, a folder without a config.json
        print(f"{name}: its config could not be loaded ({type(e).__name__}: {str(e).splitlines()[0]})")
        return 2
    if unsupported and attn_implementation:
        print(f"{name}: {unsupported}")
        return 2
    attn_implementation = attn_implementation or ("eager" if unsupported else "sdpa")
    try:
        tiny = hf.build(name, attn_implementation)
    except Exception as e:  # a default config transformers itself cannot build at this size
        print(f"{name}: a tiny model could not be built from its default config ({type(e).__name__}: {e}); "
              "give the path of a checkpoint's config.json instead (hf:/path/to/checkpoint)")
        return 2
    language = " (its language model: token ids reach no other tower)" if tiny.language_model_of else ""
    print(f"{name} ({attn_implementation}): {type(tiny.model).__name__}{language}, "
          f"{tiny.attention_layers} attention layers per forward")
    compiled = torch.compile(tiny.forward, backend=fa4_inductor.rewrite_only)
    all_rewritten = True
    for phase, inputs in tiny.phases():
        try:
            with torch.no_grad(), collecting() as records:
                compiled(**inputs)
        except Exception as e:  # a model that takes more than token ids (Whisper's audio features)
            print(f"{name}: its {phase} could not run on token ids alone ({type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}); explain it with a MODULE:FUNCTION that returns the "
                  "model and its inputs")
            return 2
        report = Report(list(records))
        print(f"{phase}: {len(report.rewritten)}/{tiny.attention_layers} attention layers rewritten")
        for record in report.records:
            print(f"  {record}")
        all_rewritten &= not report.kept and len(report.rewritten) == tiny.attention_layers
    return 0 if all_rewritten else 2


if __name__ == "__main__":
    sys.exit(main())
