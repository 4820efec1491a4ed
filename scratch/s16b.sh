# Session 16, GPU call B: where the tiny Llama's time goes (decode b1, prefill b8 / b1 at 2048), int8 rows via the op.
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
run timeout 130 python3 docs/scripts/decode_diag.py 1 512 decode
run timeout 130 python3 docs/scripts/decode_diag.py 8 2048 prefill
run timeout 100 python3 docs/scripts/decode_diag.py 1 2048 prefill
run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8 --quant-rows 1024,4096 --quant-no-e2e --quant-no-prefill
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-400 | tail -c 11500
