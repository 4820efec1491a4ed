# Session 27: the decode kernels of 3bc9a4c against this tree's, a few rows of tests/bench_decode_int8kv.py each, the old
# first (same process order for both). The device has no git: before the call, here,
#   mkdir -p scratch/old_decode && for f in decode_attention decode_attention_int8kv decode_combine; do
#     git show 3bc9a4c:kernels/cute/$f.py > scratch/old_decode/$f.py; done
# (untracked, carried with the tree; delete them after).
L=$OUT/log.txt
rows="1 32768 128;8 32768 128;64 4096 64;64 32768 64;8 32768 64"
mkdir -p /tmp/new_decode && cp kernels/cute/decode_attention.py kernels/cute/decode_attention_int8kv.py kernels/cute/decode_combine.py /tmp/new_decode/
for which in old new; do
  if [ $which = old ]; then cp scratch/old_decode/*.py kernels/cute/; else cp /tmp/new_decode/*.py kernels/cute/; fi
  echo "+ $which kernels" >>$L
  IFS=';'; for r in $rows; do IFS=' '; set -- $r
    timeout 100 python3 tests/bench_decode_int8kv.py --b $1 --sk $2 --d $3 2>&1 | grep "^b" >>$L
  done; IFS=' '
done
cp /tmp/new_decode/*.py kernels/cute/
