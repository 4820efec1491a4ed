set -x
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
timeout 280 $P -n 12 --durations=8 tests/test_gpu_w4a16.py tests/test_gpu_quant.py tests/test_gpu_nvfp4.py 2>&1 | tail -30
timeout 100 python3 tests/bench_w4a16.py --m 1,8,16 --shapes 8192x8192,8192x2048,2048x8192,4096x14336,14336x4096,2048x2048 --int8-scales bfloat16
timeout 150 python3 -c "from fa4_inductor import bench; [print(t.markdown()) for t in bench.train_suite(losses=('logits mean',))]"
