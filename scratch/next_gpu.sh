# Session 12's unrun GPU work, in priority order (each line time-boxed; one call of ~9 minutes after staging).
set -x
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
timeout 150 $P -n 12 tests/test_gpu_w4a16.py -k gemv 2>&1 | tail -8          # the CUDA-core GEMV, never run yet
PYTHONUNBUFFERED=1 timeout 120 python3 tests/bench_w4a16.py --m 1,4 --gemv off,on --shapes 8192x8192,8192x2048,2048x8192,2048x2048,512x2048
PYTHONUNBUFFERED=1 timeout 40 python3 docs/scripts/read_pattern.py 8192 8192
PYTHONUNBUFFERED=1 timeout 150 python3 docs/scripts/train_profile.py sdpa 4096 fa4_inductor False,True
PYTHONUNBUFFERED=1 timeout 120 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-e2e-runs nvfp4:plain --quant-prompt 4096
