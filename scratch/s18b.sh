. scratch/s18_common.sh
run timeout 230 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, seqlens=(128, 2048), decode_mode='default', time_budget_s=200): print(t.markdown())"
run timeout 330 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, time_budget_s=300): print(t.markdown())"
show
