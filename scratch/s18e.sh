. scratch/s18_common.sh
# Llama-1B shape, b1 x 2048 decode without CUDA graphs: the op (over small_decode's line)
run timeout 150 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((2048, 16),), decode_sizes=((2048, 16),), bert=False, seqlens=(2048,), batches=(1,), decode_mode='default', time_budget_s=120): print(t.markdown())"
show
