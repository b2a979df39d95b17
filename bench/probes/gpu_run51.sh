# cuDNN 9.19 (carry .whl): the cost model's own decisions on the GPU, no measurement cache (an empty one), with the
# shipped calibration for the running GPU: the flex sweep's default column against serve="always" and torch.compile
# (A/A column) at $1 (space-separated B,H,L,D[,Hkv] shapes; default two: a host-bound one and a long one), then
# `te-compile calibrate --check` on the files it wrote (the replay's verdicts on this run's rows). $2: seconds.
. .whl/setup.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH TE_COMPILE_CACHE_DIR=/tmp/empty-cache-$$
nvidia-smi -L > $OUT/card.txt
T=${2:-540}
for SH in ${1:-8,16,1024,64 1,16,8192,128}; do
  left=$((T - 40 - SECONDS)); [ $left -gt 60 ] || break
  timeout $left python3 bench/sweep.py --part flex --shape $SH --always --control --rounds 3 --iters 20 \
    --json $OUT/model-flex-919-${SH//,/x}.json 2>&1 | grep -av "nanobind\|leaked\|_warn_once" > $OUT/model-${SH//,/x}.txt
  grep -a "^flex\|oracle\|paired\|A/A" $OUT/model-${SH//,/x}.txt | cut -c1-300
done
python3 -m te_compile calibrate $OUT/model-flex-919-*.json --check 2>&1 | grep -a "^==\|rows:\|serves a\|keeps a"
