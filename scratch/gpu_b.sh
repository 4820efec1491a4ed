# Session 13, GPU call B: the GEMV routing test, NVFP4 decode with the GEMV, the quant prefill table, Llama-8B int8 rows.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >$L
run timeout 60 $P -n 4 tests/test_gpu_w4a16.py -k "gemv_from_the_environment or gemv_cuda_graph"
run timeout 140 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-prefill --quant-e2e-runs nvfp4:plain --quant-prompt 4096
run timeout 250 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-e2e --quant-prefill-runs bf16:default,bf16:ours,int8:plain,nvfp4:plain,int8:default,nvfp4:default
run timeout 110 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8 --quant-rows 1,16,256 --quant-no-e2e --quant-no-prefill
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn" $L | cut -c1-600 | tail -c 11000
