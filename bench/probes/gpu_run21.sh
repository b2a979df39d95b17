# The flex sweep at 2x16x4096x128 after tuning: default policy (measured decisions) vs serve="always" vs plain
# torch.compile, with the A/A column; then the same sweep again in a second process on the measurement cache
# (nothing measured). CASES="a,b" limits the variants. $1 = 919 (carry .whl .cj1; stashes part 1 for the next call) or 927 (carry .whl .cj2, after
# a 919 call on the same warm machine; TE_COMPILE_UNCHECKED_CUDNN=serve so 9.27 runs the emitted graphs too).
V=${1:-919}
if [ $V = 919 ]; then bash .cj1/stash.sh; . .whl/setup.sh; P=""
else . .whl/setup.sh && . .cj2/use.sh || exit 1; P="$CUDNN_NEW"; export TE_COMPILE_UNCHECKED_CUDNN=serve; fi
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
export TE_COMPILE_CACHE_DIR=$OUT/cache-$V
for run in 1 2; do
  LD_PRELOAD=$P timeout ${2:-300} python3 bench/sweep.py --part flex ${CASES:+--cases "$CASES"} --tune --always --control --rounds 2 --iters 20 \
    --json $OUT/tuned-flex-$V-run$run.json 2>&1 | grep -av "nanobind\|leaked" > $OUT/tuned-flex-$V-run$run.txt
  grep -a "^flex\|geomean\|oracle\|measured while" $OUT/tuned-flex-$V-run$run.txt | cut -c1-330
  [ $run = 1 ] && [ ${3:-1} = 1 ] && break
done
