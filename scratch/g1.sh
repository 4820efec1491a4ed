set -x
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
timeout 200 $P -n 12 --durations=5 tests/test_gpu_quant.py tests/test_gpu_nvfp4.py tests/test_gpu_w4a16.py 2>&1 | tail -25
PYTHONUNBUFFERED=1 timeout 340 python3 docs/scripts/one_row_gemv.py 2>&1 | grep -v Warning | tee $OUT/gemv.md | tail -40
