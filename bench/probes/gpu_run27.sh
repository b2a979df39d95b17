# after .cj1/stash.sh; carry .whl .cj2. The rest of the B shard (HF, learned-bias training, distributed) on both
# versions, the 9.19 fuzzer at seed $1 in parallel, $2 seconds
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
T=${2:-300}; S=${1:-5105}
B="tests/test_cuda_hf.py tests/test_cuda_learned_bias_training.py tests/test_distributed.py"
mkdir -p /tmp/fz
suite() { local n=$1 files=$2; shift 2
  env "$@" timeout $T python3 -m pytest -v -m cuda $files -p no:cacheprovider > /tmp/s_$n.txt 2>&1; echo "rc=$?" >> /tmp/s_$n.txt; }
suite 919c "$B" & suite 927c "$B" LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve &
(cd /tmp/fz && timeout $((T-15)) python3 -m te_compile.testing.fuzz --device cuda --cases 300 --seed $S --jobs 2 --json /tmp/fz/f919.jsonl > /tmp/fz/f919.log 2>&1) &
wait
for n in 919c 927c; do grep -av "nanobind\|leaked" /tmp/s_$n.txt > $OUT/suite_$n.txt; echo "== $n"; grep -aE "PASSED|FAILED|SKIPPED|ERROR|passed|failed|rc=" $OUT/suite_$n.txt | cut -c1-200 | tail -12; done
cd /tmp/fz && tar czf $OUT/fuzz.tgz . 2>/dev/null
cat /tmp/fz/f919.jsonl /tmp/fz/fuzz-shards-$S-*/* 2>/dev/null | python3 -c "
import sys, json, collections
c = collections.Counter(); fb = 0
for line in sys.stdin:
    try: r = json.loads(line)
    except Exception: continue
    c[r.get('outcome', '?')] += 1; fb += bool(r.get('reference_fallback_calls'))
print('f919 seed $S:', sum(c.values()), 'cases', dict(c), 'with fallback calls', fb)"; grep -a "^fuzz\|WRONG\|CRASH" /tmp/fz/f919.log | tail -4
