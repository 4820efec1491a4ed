#!/usr/bin/env bash
# One pass over everything that needs the H200, in the order that matters, each step time-boxed so a
# hang cannot eat the session's GPU time. Run from the repo root after `. /opt/fa4-env.sh`; logs and
# tables go to $OUT (or ./h200-out). Record what it prints in docs/benchmarks.md.
#   tests/h200_check.sh [tests|bench|generate|all]   (default all; one call each fits the 10-minute limit)
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
export PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1
what=${1:-all}
PYTEST=(python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -rf -W ignore)

if [[ $what == tests || $what == all ]]; then
  timeout 300 "${PYTEST[@]}" -n 4 --timeout 150 tests/test_gpu_decode.py 2>&1 | tee "$OUT/gpu_decode.log" | tail -15
  timeout 150 "${PYTEST[@]}" -n 8 --timeout 120 tests/test_gpu_fa4.py 2>&1 | tee "$OUT/gpu_fa4.log" | tail -8
  timeout 120 python3 tests/bench_decode.py 2>&1 | tee "$OUT/bench_decode.log" | tail -10
fi

if [[ $what == bench || $what == all ]]; then
  timeout 560 python3 -m fa4_inductor bench --suite overhead,op,decode,e2e \
      --out "$OUT/bench.md" --json "$OUT/bench.json" --plot "$OUT/bench_op.png" 2>&1 | tee "$OUT/bench.log" | grep '|'
fi

if [[ $what == generate || $what == all ]]; then
  timeout 400 python3 -m fa4_inductor bench --suite generate \
      --out "$OUT/bench_generate.md" --json "$OUT/bench_generate.json" 2>&1 | tee "$OUT/bench_generate.log" | grep '|'
fi
