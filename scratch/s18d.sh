. scratch/s18_common.sh
git log --oneline -1 >>$L
run timeout 100 $P -n 12 tests/test_gpu_fa4.py tests/test_gpu_decode.py tests/test_gpu_int8kv.py
run timeout 60 $P -n 8 tests/test_gpu_quant.py -k "int8_int8"
# int8 x int8 at 1 and 16 rows on int8_linear's mixed-input kernels (session 18 run 2: 19-36 us on padded _int_mm)
run timeout 100 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 1,16 --quant-no-e2e --quant-no-prefill
# the tiny Llama's decode rows with small_decode (SDPA kept as written), both modes
run timeout 110 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, seqlens=(128, 2048), decode_mode='default', time_budget_s=90): print(t.markdown())"
run timeout 110 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, seqlens=(128, 8192), time_budget_s=90): print(t.markdown())"
show
