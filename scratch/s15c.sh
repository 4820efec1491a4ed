# Session 15, GPU call C: NVFP4 decode end to end with the integer GEMV and without (issue 15's 0.9 ms/token);
# issue 14: why a torchao module under ours is slower where lowering changes nothing; Llama-8B int8 rows left.
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 120 env FA4_INDUCTOR_W4A16_INT_GEMV=1 python3 -m fa4_inductor bench --suite quant --quant-formats none \
    --quant-no-prefill --quant-e2e-runs nvfp4:plain --quant-prompt 4096
run timeout 110 python3 -m fa4_inductor bench --suite quant --quant-formats none \
    --quant-no-prefill --quant-e2e-runs nvfp4:plain --quant-prompt 4096
run timeout 110 python3 docs/scripts/compare_compiles.py int8_int8 8192 2048 256
cp $OUT/default.py $OUT/i8i8_default.py; cp $OUT/ours.py $OUT/i8i8_ours.py
run timeout 90 python3 docs/scripts/compare_compiles.py int8 4096 4096 1
run timeout 110 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8 --quant-rows 64,1024,4096 --quant-no-e2e --quant-no-prefill
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice" $L | cut -c1-600 | tail -c 11500
