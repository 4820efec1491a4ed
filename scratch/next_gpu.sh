# Session 14's unrun GPU work, in priority order (two calls of ~9 minutes after staging; split where marked).
# Output goes to $OUT/log.txt (a call returns only its last 12 KB).
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >$L
# 1. issue 15: the integer one-row NVFP4 GEMV (kernels/cute/nvfp4_int_gemv.py), never run yet
run timeout 150 $P -n 12 tests/test_gpu_w4a16.py -k int_gemv
run timeout 120 python3 tests/bench_w4a16.py --m 1 --gemv on,int \
    --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336,4096x4096,1024x4096,2048x2048,512x2048,128256x4096
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
run timeout 90 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
  python3 docs/scripts/ncu_w4a16.py 8192 8192
run timeout 80 python3 tests/bench_w4a16.py --m 1 --gemv int,int:8x1,int:4x1,int:4x2,int:2x1 --shapes 8192x8192,2048x8192,8192x2048
#    at 2..4 rows against the tensor-core kernel (off) and the fp32 GEMV (on)
run timeout 120 python3 tests/bench_w4a16.py --m 2,4 --gemv off,on,int --shapes 8192x8192,2048x8192,8192x2048,4096x14336
# ---- call 2 (the first is ~560 s of timeouts) ----
#    the end-to-end decode with it (issue 15's 0.9 ms/token; 1.091 with the fp32 GEMV, session 13)
run timeout 170 env FA4_INDUCTOR_W4A16_INT_GEMV=1 python3 -m fa4_inductor bench --suite quant --quant-formats none \
    --quant-no-prefill --quant-e2e-runs nvfp4:plain --quant-prompt 4096
#    if it wins: route one-row NVFP4 calls to it by default (w4a16_decode.nvfp4_matmul, gemv=None)
# 2. issue 14: why a torchao module under ours is slower where lowering changes nothing (output code of both compiles)
run timeout 120 python3 docs/scripts/compare_compiles.py int8_int8 8192 2048 256
cp $OUT/default.py $OUT/i8i8_default.py; cp $OUT/ours.py $OUT/i8i8_ours.py
run timeout 120 python3 docs/scripts/compare_compiles.py int8 4096 4096 1
# ---- call 3 ----
# 3. issue 14: the prefill rows left (nvfp4:plain's compile ran past 150 s in session 14)
run timeout 300 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-e2e --quant-prefill-runs nvfp4:plain,int8:ours,nvfp4:ours
# 4. issue 14: Llama-8B int8 rows at 64 / 1024 / 4096 and int8_int8 rows
run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8 --quant-rows 64,1024,4096 --quant-no-e2e --quant-no-prefill
run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8_int8 --quant-rows 1,16,256 --quant-no-e2e --quant-no-prefill
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice" $L | cut -c1-600 | tail -c 11000
