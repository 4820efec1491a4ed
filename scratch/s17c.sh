# Session 17, GPU call C: the tiny Llama's b8 decode step by step and its sweep rows with the collector paused (issue 12)
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 150 python3 scratch/decode_steps.py 128 512 8192
run timeout 210 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, batches=(8,), time_budget_s=190): print(t.markdown())"
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-400 | tail -c 11500
