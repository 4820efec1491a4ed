# Session 14, GPU call B: Llama-8B NVFP4 rows, CTA shapes of 4 warps, GEMV shapes, ncu on the int8-KV kernel.
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >$L
run timeout 100 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats nvfp4 --quant-rows 1,16,256 --quant-no-e2e --quant-no-prefill
run timeout 100 python3 tests/bench_w4a16.py --m 1,8 --cta auto,1x1x4,1x2x2,2x1x4,2x2x2 --shapes 8192x8192,2048x8192,8192x2048
run timeout 80 python3 tests/bench_w4a16.py --m 1 --gemv off,4x1,4x2,4x4,2x2,2x4 --shapes 8192x8192,8192x2048
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
run timeout 90 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  --section InstructionStats python3 docs/scripts/ncu_decode_int8kv.py 1 32768 128
run timeout 100 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 1,16,256,4096 --quant-no-e2e --quant-no-prefill
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn" $L | cut -c1-600 | tail -c 11000
