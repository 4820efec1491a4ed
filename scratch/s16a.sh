# Session 16, GPU call A: the GPU tiers not rerun after session 15's sdpa_small fix.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 220 $P -n 12 tests/test_gpu_fa4.py tests/test_gpu_decode.py tests/test_gpu_int8kv.py
run timeout 220 $P -n 12 tests/test_gpu_quant.py tests/test_gpu_nvfp4.py
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice" $L | cut -c1-500 | tail -c 11500
