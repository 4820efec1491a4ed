# Session 18's unrun GPU work, in priority order, split into calls of <= ~9 minutes (the first after .gpu/b's install).
# Output goes to $OUT/log.txt. Have the next call ready: the machine goes back 30 s after a call, and a fresh one needs
# .gpu/a and .gpu/b again. Run one part a call:  bash scratch/next_gpu.sh 1   (then 2, 3, ...)
P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$?" >>$L; }
case "$1" in
1)  # GPU tiers after session 18's small_decode rule (static and symbolic caches), graph_work, int8 x int8 on the
    # mixed-input kernels with one-kernel scaling (the FA4/decode/int8-KV tier was cut at 100 s in run 4: give it 170)
    run timeout 170 $P -n 12 tests/test_gpu_fa4.py tests/test_gpu_decode.py tests/test_gpu_int8kv.py
    run timeout 120 $P -n 12 tests/test_gpu_quant.py tests/test_gpu_nvfp4.py
    # issue 14: int8 x int8 at 1 and 16 rows after the one-kernel scaling (session 18 run 4, before it: 12-21 us)
    run timeout 150 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 1,16 --quant-no-e2e --quant-no-prefill ;;
2)  # issue 14's last table: int8 x int8 on Llama-8B's shapes (~20 rows); then issue 14 can be resolved
    run timeout 240 python3 -m fa4_inductor bench --suite quant --quant-models llama-8b --quant-formats int8_int8 --quant-rows 1,16,64,256,4096 --quant-no-e2e --quant-no-prefill
    # issue 12: the tiny Llama's decode rows with small_decode without CUDA graphs (session 18 run 3: 0.84-0.89x on the
    # op); time_budget_s well under the timeout: the table prints only at the end
    run timeout 250 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, seqlens=(128, 2048), decode_mode='default', time_budget_s=220): print(t.markdown())" ;;
3)  # the tiny Llama's whole sweep with CUDA-graph decode (run 3: decode 0.94-1.01x on the op), then the Llama-1B
    # shape's decode without CUDA graphs (over small_decode's line: the op; is it >= 0.98x default?)
    run timeout 300 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=False, time_budget_s=270): print(t.markdown())"
    run timeout 220 python3 -c "from fa4_inductor import bench
for t in bench.sweep_suite(llama_sizes=((2048, 16),), decode_sizes=((2048, 16),), bert=False, seqlens=(2048,), batches=(1, 8), decode_mode='default', time_budget_s=190): print(t.markdown())" ;;
*)  # issue 12: the rest of the size sweep, one model a call (MODELS=2048x16, then bert, 512x4, 1024x2, 2048x4, 256x16),
    # or all at once on a machine with several GPUs
    MODELS=${MODELS:-2048x16} bash scratch/sweep_all.sh ;;
esac
grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-600 | tail -c 11000
