# Session 16, GPU call C: issue 14's prefill rows left (nvfp4:plain, int8:ours, nvfp4:ours), the int8 x int8 Llama-1B table.
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 330 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-e2e --quant-prefill-runs nvfp4:plain,int8:ours,nvfp4:ours
run timeout 200 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 1,16,256,4096 --quant-no-e2e --quant-no-prefill
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-400 | tail -c 11500
