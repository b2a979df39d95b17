# cuDNN 9.19 (carry .whl): the two new fuzz-class tests on cuDNN, then the flex sweep at another shape ($1, B,H,L,D;
# default 4,16,512,64) after tuning: default policy vs serve="always" vs plain torch.compile, A/A column; $2 seconds.
. .whl/setup.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH TE_COMPILE_CACHE_DIR=$OUT/cache
nvidia-smi -L > $OUT/card.txt
timeout 120 python3 -m pytest -q -m cuda tests/test_cuda_fuzz_classes.py -k "singular_derivative or super_exp" -p no:cacheprovider 2>&1 | grep -aE "passed|failed|^FAILED" | tail -3
SH=${1:-4,16,512,64}
timeout $((${2:-500} - SECONDS)) python3 bench/sweep.py --part flex --shape $SH --tune --always --control --rounds 2 --iters 20 \
  --json $OUT/tuned-flex-919-${SH//,/x}.json 2>&1 | grep -av "nanobind\|leaked" > $OUT/tuned-flex-919.txt
grep -a "^flex\|geomean\|oracle\|measured while" $OUT/tuned-flex-919.txt | cut -c1-330
