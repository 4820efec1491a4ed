# Session 16, GPU call E: the host-path trim verified (tests, the tiny Llama's rows), the host cost of each small-attention
# path and of a CUDA graph's replay, and where nvfp4:plain's prefill compile spends its time (a stack dump at 50 s).
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 150 $P -n 12 tests/test_gpu_fa4.py tests/test_gpu_decode.py
run timeout 50 python3 docs/scripts/small_attention_host.py
run timeout 130 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=(), bert=False, seqlens=(128, 2048), time_budget_s=95): print(t.markdown())"
run timeout 60 python3 -c "import faulthandler, sys; faulthandler.dump_traceback_later(50, exit=True)
sys.argv = ['fa4_inductor', 'bench', '--suite', 'quant', '--quant-formats', 'none', '--quant-no-e2e', '--quant-prefill-runs', 'nvfp4:plain']
import runpy; runpy.run_module('fa4_inductor', run_name='__main__')"
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load\|^  *[0-9]*  *[0-9.]*  *[0-9.]*  *[0-9.]*  *[0-9.]* /" $L | cut -c1-300 | tail -c 11500
