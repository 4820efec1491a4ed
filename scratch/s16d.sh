# Session 16, GPU call D: the int8 x int8 Llama-8B table.
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
run timeout 280 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8_int8 --quant-rows 1,16,256,4096 --quant-no-e2e --quant-no-prefill
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-400 | tail -c 11500
