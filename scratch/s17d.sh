# Session 17, GPU call D: nvfp4 prefill under default compile and ours in one process, then nvfp4:plain after them
# (session 16's cut and this session's crash came when it followed another compile); the int8 x int8 0.72x row's code
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
run timeout 60 python3 docs/scripts/compare_compiles.py int8_int8 512 2048 64
run timeout 220 python3 -c "import time; t = time.time()
from fa4_inductor.bench import quant
try: print(quant.prefill_table(runs=['nvfp4:default', 'nvfp4:ours', 'nvfp4:plain']).markdown())
finally: print(time.time() - t, 's')"
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-400 | tail -c 11500
