"""`python -m fa4_inductor demo | explain module:function | bench [--suite ...]`."""

from __future__ import annotations

import argparse
import importlib
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
    explain = sub.add_parser("explain", help="report the rewrites for a model built by MODULE:FUNCTION")
    explain.add_argument("builder", help="MODULE:FUNCTION returning (model_or_fn, example_args)")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from .demo import run

        return run(args.seq_len)
    import fa4_inductor

    module, _, function = args.builder.partition(":")
    fn, example_args = getattr(importlib.import_module(module), function)()
    report = fa4_inductor.explain(fn, *example_args)
    return 0 if not report.kept else 2


if __name__ == "__main__":
    sys.exit(main())
