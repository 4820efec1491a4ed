# Session 15, GPU call D: the integer GEMV with two pieces in flight (tests, shapes, end to end), int8 routes to 4096 rows.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 120 $P -n 12 tests/test_gpu_w4a16.py -k int_gemv
run timeout 100 $P -n 8 tests/test_gpu_quant.py -k "wide_weights or routes_and_numerics"
run timeout 200 python3 tests/bench_w4a16.py --m 1 --gemv on,int,int:4x1,int:4x2,int:2x2,int:1x2,int:8x1 \
    --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336,4096x4096,1024x4096,2048x2048,512x2048,128256x4096
run timeout 90 env FA4_INDUCTOR_W4A16_INT_GEMV=1 python3 -m fa4_inductor bench --suite quant --quant-formats none \
    --quant-no-prefill --quant-e2e-runs nvfp4:plain --quant-prompt 4096
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice" $L | cut -c1-600 | tail -c 11500
