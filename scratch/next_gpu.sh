# Session 15's unrun GPU work, in priority order (calls of ~9 minutes after staging; split where marked).
# Output goes to $OUT/log.txt (a call returns only its last 12 KB).
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
# 1. The GPU tiers the new `sdpa_small` route (small unmasked attentions on cuDNN SDPA) reaches and that session 15 did
#    not rerun after its causal fix: the whole FA4 file, decode, padding, int8 KV, the quantized families' model tests.
run timeout 200 $P -n 12 tests/test_gpu_fa4.py tests/test_gpu_decode.py tests/test_gpu_int8kv.py
run timeout 200 $P -n 12 tests/test_gpu_quant.py tests/test_gpu_nvfp4.py
# 2. issue 12: the tiny Llama's decode rows (0.44-0.73x in session 15 run 3) and where its step goes
run timeout 150 python3 docs/scripts/decode_diag.py 1 512
run timeout 200 env TORCH_LOGS=cudagraphs,recompiles python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, batches=(1,), seqlens=(512,), time_budget_s=150): print(t.markdown())"
# ---- call 2 ----
# 3. issue 14: int8 weight-only rows through the op's new quack route (1024 / 4096 rows over 4096-row weights)
run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8 --quant-rows 1024,4096 --quant-no-e2e --quant-no-prefill
# 4. issue 14: the prefill rows left (nvfp4:plain's compile ran past 150 s in session 14)
run timeout 330 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-e2e --quant-prefill-runs nvfp4:plain,int8:ours,nvfp4:ours
# ---- call 3 ----
# 5. issue 12: the rest of the size sweep, one model a call (`bench --suite sweep --sweep-models 2048x16`, then bert, ...)
run timeout 500 python3 -m fa4_inductor bench --suite sweep --sweep-models 2048x16
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice" $L | cut -c1-600 | tail -c 11000
