P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
timeout 70 $P -n 8 tests/test_gpu_quant.py -k "one_row or torchao_int8_weight_only or gpt_fast_int8" 2>&1 | tail -6
PYTHONUNBUFFERED=1 timeout 190 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-e2e-runs int8:plain --quant-prompt 4096 2>&1 | grep -E "quant e2e|\|" | tail -8
