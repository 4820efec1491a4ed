set -x
. /opt/fa4-env.sh || exit 1
PYTHONUNBUFFERED=1 timeout 170 python3 -c "from fa4_inductor import bench; [print(t.markdown()) for t in bench.train_suite(losses=('logits mean',))]" 2>&1 | grep -v Warn | tail -20
PYTHONUNBUFFERED=1 timeout 400 python3 -m fa4_inductor bench --suite quant --quant-formats none --quant-e2e-runs int8:ours,int8:default --quant-prompt 4096 --out $OUT/quant_e2e.md 2>&1 | grep -v Warn | tail -20
cat $OUT/quant_e2e.md
