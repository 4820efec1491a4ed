# Session 16's unrun GPU work, in priority order (calls of ~9 minutes after staging; split where marked).
# Output goes to $OUT/log.txt (a call returns only its last 12 KB).
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
# 1. issue 12: the tiny Llama's rows with the sweep's alternating rounds (commit 9b9eb52; session 16 run 4's rows flipped
#    between runs because one backend was timed after the other), prefill and decode
run timeout 400 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, time_budget_s=360): print(t.markdown())"
# ---- call 2 ----
# 2. issue 14: where nvfp4:plain's prefill compile spends its time (it ran past 150 and 290 s; session 16 run 4 caught
#    it once in Inductor's Triton codegen at 50 s): stacks every 60 s
run timeout 330 python3 -c "import faulthandler, sys; faulthandler.dump_traceback_later(60, repeat=True)
sys.argv = ['fa4_inductor', 'bench', '--suite', 'quant', '--quant-formats', 'none', '--quant-no-e2e', '--quant-prefill-runs', 'nvfp4:plain']
import runpy; runpy.run_module('fa4_inductor', run_name='__main__')"
# 2b. the same compile with coordinate descent tuning off after torchao's quantize_ turned it on (the suspect: CD tuning
#     compiles and times variants of each large dequantize kernel)
run timeout 330 python3 -c "import time, torch
from fa4_inductor.bench import quant
real = quant._llama_for
def llama_for(*a, **k):
    out = real(*a, **k); torch._inductor.config.coordinate_descent_tuning = False; return out
quant._llama_for = llama_for
start = time.time(); print(quant.prefill_table(runs=['nvfp4:plain']).markdown(), time.time() - start, 's')"
# 3. issue 14: int8 x int8 rows (each row is printed as it is measured since session 16)
run timeout 240 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 64,256,4096 --quant-no-e2e --quant-no-prefill
# ---- call 3 ----
# 4. issue 12: the rest of the size sweep, one model a call (`--sweep-models 2048x16`, then bert, ...)
run timeout 500 python3 -m fa4_inductor bench --suite sweep --sweep-models 2048x16
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-600 | tail -c 11000
