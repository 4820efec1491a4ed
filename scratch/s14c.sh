# Session 14, GPU call C: NVFP4 routes at 9..256 rows (W4A16_MAX_M 16, quack from 16M weights), the rest of the prefill table.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >$L
run timeout 120 $P -n 12 tests/test_gpu_nvfp4.py
run timeout 90 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats nvfp4 --quant-rows 12,16,32,256 --quant-no-e2e --quant-no-prefill
run timeout 70 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats nvfp4 --quant-rows 16,64,256 --quant-no-e2e --quant-no-prefill
run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-e2e --quant-prefill-runs int8:plain,nvfp4:plain,nvfp4:default
run timeout 90 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 256 --quant-no-e2e --quant-no-prefill
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice" $L | cut -c1-600 | tail -c 11000
