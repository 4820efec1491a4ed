# Session 13, GPU call A: the GEMV's tests and routing, ncu on the W4A16 kernels, end-to-end decode with the GEMV.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >$L
run timeout 130 $P -n 12 tests/test_gpu_w4a16.py -k gemv
run timeout 100 python3 tests/bench_w4a16.py --m 1,2 --gemv off,on --shapes 8192x8192,4096x4096,1024x4096,14336x4096,4096x14336
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run timeout 90 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section InstructionStats python3 docs/scripts/ncu_w4a16.py 8192 8192
run timeout 170 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-e2e-runs nvfp4:plain,int8:plain --quant-prompt 4096
run timeout 90 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8_int8 --quant-rows 1,16,256,4096 --quant-no-e2e
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args" $L | cut -c1-400 | tail -c 11500
