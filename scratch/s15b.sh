# Session 15, GPU call B (after install): issue 15's integer NVFP4 GEMV, first run: tests, timings, ncu.
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
git log --oneline -1 >>$L
run timeout 150 $P -n 12 tests/test_gpu_w4a16.py -k int_gemv
run timeout 110 python3 tests/bench_w4a16.py --m 1 --gemv on,int \
    --shapes 8192x8192,2048x8192,8192x2048,14336x4096,4096x14336,4096x4096,1024x4096,2048x2048,512x2048,128256x4096
run timeout 90 python3 tests/bench_w4a16.py --m 2,4 --gemv off,on,int --shapes 8192x8192,2048x8192,8192x2048,4096x14336
run timeout 60 python3 tests/bench_w4a16.py --m 1 --gemv int,int:8x1,int:4x1,int:4x2,int:2x1 --shapes 8192x8192,2048x8192,8192x2048
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
run timeout 80 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
  python3 docs/scripts/ncu_w4a16.py 8192 8192
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice" $L | cut -c1-600 | tail -c 11500
