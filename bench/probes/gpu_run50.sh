# cuDNN 9.19 (carry .whl): the flex sweep at a grouped-query shape ($1, B,H,L,D,Hkv; default 1,32,8192,128,8) after
# tuning (default policy vs serve="always" vs plain torch.compile, A/A column), then a second process on the same
# measurement cache over three of its cases: it must measure nothing. $2: seconds in all.
. .whl/setup.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH TE_COMPILE_CACHE_DIR=/tmp/tc-cache
nvidia-smi -L > $OUT/card.txt
SH=${1:-1,32,8192,128,8}
T=${2:-540}
F="nanobind\|leaked\|_warn_once"
timeout $((T - 110 - SECONDS)) python3 bench/sweep.py --part flex --shape $SH --tune --always --control --rounds 2 --iters 20 \
  --json $OUT/tuned-flex-919-${SH//,/x}.json 2>&1 | grep -av "$F" > $OUT/tuned-flex-919.txt
grep -a "^flex\|geomean\|oracle\|measured while\|A/A" $OUT/tuned-flex-919.txt | cut -c1-330
echo "== second process, same cache"
timeout $((T - SECONDS)) python3 bench/sweep.py --part flex --shape $SH --cases "none,causal,softcap" --tune --always \
  --rounds 2 --iters 20 --json $OUT/tuned-flex-919-${SH//,/x}-cached.json 2>&1 | grep -av "$F" > $OUT/cached.txt
grep -a "^flex\|geomean\|oracle\|measured while\|measured" $OUT/cached.txt | cut -c1-330
ls /tmp/tc-cache > $OUT/cache-files.txt 2>&1
