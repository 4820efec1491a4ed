. scratch/s18_common.sh
run timeout 60 $P -n 8 tests/test_gpu_int8kv.py tests/test_gpu_decode.py -k "llama or generate"
run timeout 100 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, seqlens=(2048,), decode_mode='default', time_budget_s=85): print(t.markdown())"
show
