. scratch/s18_common.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >>$L
run timeout 170 $P -n 12 tests/test_gpu_fa4.py tests/test_gpu_decode.py tests/test_gpu_int8kv.py
run timeout 120 $P -n 12 tests/test_gpu_quant.py tests/test_gpu_nvfp4.py
run timeout 70 python3 -m fa4_inductor demo
show
