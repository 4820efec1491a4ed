set -x
timeout 560 python3 -m fa4_inductor bench --suite quant --quant-models llama-1b --quant-formats int8,nvfp4 --quant-rows 1 --out $OUT/quant.md
cat $OUT/quant.md
