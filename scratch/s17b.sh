# Session 17, GPU call B: the tiny Llama's sweep rows with alternating rounds (issue 12), nvfp4:plain's prefill compile
# with coordinate descent tuning off after torchao's quantize_ (issue 14), stacks every 80 s.
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 300 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, time_budget_s=270): print(t.markdown())"
run timeout 220 python3 -c "import faulthandler, time, torch; faulthandler.dump_traceback_later(80, repeat=True)
from fa4_inductor.bench import quant
real = quant._llama_for
def llama_for(*a, **k):
    out = real(*a, **k); print('cd tuning was', torch._inductor.config.coordinate_descent_tuning, flush=True); torch._inductor.config.coordinate_descent_tuning = False; return out
quant._llama_for = llama_for
start = time.time(); print(quant.prefill_table(runs=['nvfp4:plain']).markdown(), time.time() - start, 's')"
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-400 | tail -c 11500
