# Session 14, GPU call A: QUACK_MAX_ROWS=256 through the op, the W4A16 tier with the GEMV default, the prefill table.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >$L
run timeout 140 $P -n 8 tests/test_gpu_quant.py -k "routes_and_numerics or quack_first_call"
run timeout 140 $P -n 12 tests/test_gpu_w4a16.py tests/test_gpu_nvfp4.py
run timeout 230 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-e2e \
    --quant-prefill-runs bf16:default,bf16:ours,int8:plain,nvfp4:plain,int8:default,nvfp4:default
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn" $L | cut -c1-600 | tail -c 11000
