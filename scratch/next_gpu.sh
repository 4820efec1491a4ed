# Session 13's unverified changes and unrun GPU work, in priority order (one call of ~9 minutes after staging).
# Output goes to $OUT/log.txt (a call returns only its last 12 KB).
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
# 1. QUACK_MAX_ROWS 64 -> 256 (session 13 run 3's Llama-8B rows): the op's quack route at 65..256 rows, never run yet
run timeout 150 $P -n 8 tests/test_gpu_quant.py -k "routes_and_numerics or quack_first_call"
# 2. the whole W4A16 tier with the GEMV on by default for one row
run timeout 150 $P -n 12 tests/test_gpu_w4a16.py tests/test_gpu_nvfp4.py
# 3. the quant prefill table (one compile a run now, float64 reference)
run timeout 200 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-no-e2e \
    --quant-prefill-runs bf16:default,bf16:ours,int8:plain,nvfp4:plain
# 4. Llama-8B NVFP4 rows (then int8_int8 on both models, and int8 / nvfp4 at M = 64, 1024, 4096)
run timeout 100 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats nvfp4 --quant-rows 1,16,256 --quant-no-e2e --quant-no-prefill
# 5. issue 15: occupancy, the limit ncu found (session 13 run 2): CTA shapes of fewer warps let more CTAs share a SM
#    (narrow NVFP4 at 142 registers: 8 warps a SM in 8-warp CTAs, 12 in 4-warp ones)
run timeout 100 python3 tests/bench_w4a16.py --m 1,8 --cta auto,1x1x4,1x2x2,2x1x4,2x2x2 --shapes 8192x8192,2048x8192,8192x2048
#    and the GEMV's own shape where it lost or tied at M = 1 (NVFP4 8192 x 8192, 8192 x 2048)
run timeout 80 python3 tests/bench_w4a16.py --m 1 --gemv off,4x1,4x2,4x4,2x2,2x4 --shapes 8192x8192,8192x2048
# 6. issue 16: what holds the int8-KV kernel at b1 x 32k
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
run timeout 90 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  --section InstructionStats python3 docs/scripts/ncu_decode_int8kv.py 1 32768 128
tail -c 11000 $L
