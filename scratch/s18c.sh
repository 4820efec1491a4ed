. scratch/s18_common.sh
run timeout 540 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8_int8 --quant-rows 1,16,64,256,4096 --quant-no-e2e --quant-no-prefill
show
