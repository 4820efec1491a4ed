# Session 17's unrun GPU work, in priority order (calls of ~9 minutes after staging; split where marked).
# Output goes to $OUT/log.txt (a call returns only its last 12 KB). Have the next call ready: the machine goes back
# 30 s after a call, and a fresh one needs .gpu/a and .gpu/b again.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
# 1. the GPU tiers after session 17's crossover change (symbolic sizes decided under a guard, proven-causal masks
#    dropped from small SDPA calls) and its timing changes
run timeout 170 $P -n 12 tests/test_gpu_fa4.py tests/test_gpu_decode.py tests/test_gpu_int8kv.py
run timeout 120 $P -n 12 tests/test_gpu_quant.py tests/test_gpu_nvfp4.py
# 2. issue 12: the demo with alternating rounds (session 17 run 5: sdpa code 0.80x with the same attention as
#    default compile and identical output code on the CPU), the tiny Llama's decode rows with alternating runs
run timeout 60 python3 -m fa4_inductor demo
run timeout 330 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, time_budget_s=300): print(t.markdown())"
# 2b. the same decode rows without CUDA graphs (a user's `torch.compile(model)` decode step): the op's host path
#     (36-49 us a call against SDPA's ~23) is paid every step there, and lowering's crossover leaves decode-shaped
#     calls to the op (it was measured on self-attention, by FLOP, not on a cache read)
run timeout 200 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, seqlens=(128, 2048), decode_mode='default', time_budget_s=180): print(t.markdown())"
# ---- call 2 ----
# 3. issue 14: the int8 x int8 table, Llama-1B (each row printed as measured; ~20 s a row: two fresh compiles)
run timeout 500 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 1,16,64,256,4096 --quant-no-e2e --quant-no-prefill
# ---- call 3 ----
# 4. issue 12: the rest of the size sweep, one model a call (`--sweep-models 2048x16`, then bert, ...)
run timeout 500 python3 -m fa4_inductor bench --suite sweep --sweep-models 2048x16
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-600 | tail -c 11000
