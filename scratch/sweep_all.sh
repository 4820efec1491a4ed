# The whole size sweep (issue 12), one model per process, the processes spread over every GPU of the machine (one GPU:
# one after the other, ~500 s a model: split it over calls with MODELS=...). Each model's table: $OUT/sweep_<model>.md.
# Processes on one host share its CPUs: host-bound rows (small models) are timed while others compile; the
# alternating rounds put that noise on both backends alike, but recheck a small-model row below 0.98x on its own.
# Run after .gpu/b/install.sh and `. /opt/fa4-env.sh`, e.g. on nvidia-h200-x8:  bash scratch/sweep_all.sh
MODELS=${MODELS:-"256x2 2048x16 bert 512x4 1024x2 2048x4 256x16"}
LIMIT=${LIMIT:-540}
NGPU=$(nvidia-smi -L | wc -l)
i=0
for model in $MODELS; do
  gpu=$((i % NGPU))
  ( CUDA_VISIBLE_DEVICES=$gpu PYTHONUNBUFFERED=1 timeout $LIMIT python3 -m fa4_inductor bench --suite sweep \
      --sweep-models $model > $OUT/sweep_$model.md 2> $OUT/sweep_$model.err; echo "rc=$?" >> $OUT/sweep_$model.md ) &
  i=$((i + 1))
  if [ $((i % NGPU)) -eq 0 ]; then wait; fi
done
wait
# A run cut by LIMIT has no table: its rows as they were measured are the `[row]` lines of the .err file.
for model in $MODELS; do echo "== $model"; grep -E "^\| |^rc=|took" $OUT/sweep_$model.md | tail -40
  grep -q "^| model" $OUT/sweep_$model.md || grep "\[row\]" $OUT/sweep_$model.err; done | tail -c 11000
