# Session 17, GPU call E: the crossover deciding symbolic sizes under a guard and dropping proven-causal masks
# (the tiny Llama's prefill rows, the demo). ~230 s of device time were left.
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
run timeout 140 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=(), bert=False, seqlens=(128, 512, 2048), time_budget_s=110): print(t.markdown())"
run timeout 50 python3 -m fa4_inductor demo
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-400 | tail -c 11500
