P="python3 -m pytest -m gpu -q -p no:cacheprovider -p no:logging -W ignore -rf"
L=$OUT/log.txt
run() { echo "+ $*" >>$L; local t0=$SECONDS; PYTHONUNBUFFERED=1 "$@" >>$L 2>&1; echo "rc=$? (${SECONDS}-${t0} s)" | awk '{print}' >>$L; echo "elapsed $((SECONDS-t0)) s" >>$L; }
show() { grep -v "Warning\|warn(\|^  \"\"\"\|exe_args\|warnings.warn\|Extern Choice\|^USDT\|Failed to load" $L | cut -c1-600 | tail -c 11000; }
