# Session 15, GPU call E: small attentions on cuDNN SDPA (tests, the tiny Llama's prefill rows), the integer GEMV as the
# one-row default (tests, NVFP4 decode end to end), the tiny decode step's diagnosis.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 150 $P -n 12 tests/test_gpu_fa4.py
run timeout 70 $P -n 12 tests/test_gpu_w4a16.py -k "int_gemv or gemv_from_the_environment"
run timeout 150 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=(), bert=False, time_budget_s=130): print(t.markdown())"
run timeout 60 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill --quant-e2e-runs nvfp4:plain --quant-prompt 4096
run timeout 70 python3 docs/scripts/decode_diag.py 1 512
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice" $L | cut -c1-500 | tail -c 11500
