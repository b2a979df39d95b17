# One call, cuDNN 9.19 (carry .whl): the fixes for the GPU fuzzer's wrong answers and the whole-model check.
# 1. in parallel, for $1 seconds: bench/probes/diag_wrong.py (the wrong cases and variants, each in its own
#    process), the cuda fuzz classes and tuning tests, and the fuzzer at seed $2;
# 2. then on a quiet GPU: Hugging Face flex models at 1x4096 with --tune (the whole-model check in the tune),
#    models $3 (default "llama qwen3"), until $4 seconds of the call have passed.
. .whl/setup.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
T=${1:-170}; S=${2:-13001}
mkdir -p /tmp/fz
(timeout $T python3 bench/probes/diag_wrong.py --jobs 5 2>&1 | grep -av "nanobind\|leaked" > $OUT/diag_wrong.txt) &
(timeout $T python3 -m pytest -q -m cuda tests/test_cuda_fuzz_classes.py tests/test_cuda_tuning.py -p no:cacheprovider > $OUT/classes.txt 2>&1) &
(cd /tmp/fz && timeout $T python3 -m te_compile.testing.fuzz --device cuda --cases 400 --seed $S --jobs 2 --json /tmp/fz/f$S.jsonl > /tmp/fz/f$S.log 2>&1) &
wait
cat $OUT/diag_wrong.txt
grep -a "passed\|failed\|^FAILED" $OUT/classes.txt | cut -c1-200 | tail -6
cd /tmp/fz && tar czf $OUT/fuzz.tgz . 2>/dev/null; cd - > /dev/null
f=/tmp/fz/f$S.jsonl; [ -s $f ] || f="/tmp/fz/fuzz-shards-$S-*/*.jsonl"
cat $f 2>/dev/null | python3 -c "
import sys, json, collections
c = collections.Counter()
for line in sys.stdin:
    try: c[json.loads(line).get('outcome', '?')] += 1
    except Exception: pass
print('fuzz seed $S:', sum(c.values()), 'cases', dict(c))"
left=$((${4:-560} - SECONDS))
SHAPES="1x4096" timeout $left bash bench/probes/gpu_run33.sh 919 $((left - 5)) tune "${3:-llama qwen3}"
