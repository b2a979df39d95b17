# after .cj1/stash.sh in the call before; carry .whl .cj2. $1 fuzz seed (9.19), $2 seconds
# the B shard of the cuda suite on both versions, 9.19 fuzzer in parallel, the learned-bias diag on both versions
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
T=${2:-420}; S=${1:-5103}
B="tests/test_cuda_generate.py tests/test_cuda_fuzz_classes.py tests/test_cuda_hf.py tests/test_cuda_learned_bias_training.py tests/test_distributed.py"
mkdir -p /tmp/fz
suite() { local n=$1 files=$2; shift 2
  env "$@" timeout $T python3 -m pytest -q -m cuda $files -p no:cacheprovider -o faulthandler_timeout=300 > /tmp/s_$n.txt 2>&1; echo "rc=$?" >> /tmp/s_$n.txt; }
suite 919b "$B" & suite 927b "$B" LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve &
(cd /tmp/fz && timeout $((T-20)) python3 -m te_compile.testing.fuzz --device cuda --cases 500 --seed $S --jobs 2 --json /tmp/fz/f919.jsonl > /tmp/fz/f919.log 2>&1) &
(timeout 200 python3 bench/probes/diag_learned_bias.py 2 > $OUT/diag919.txt 2>&1; LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve timeout 200 python3 bench/probes/diag_learned_bias.py 2 > $OUT/diag927.txt 2>&1) &
wait
grep -a "^seed\|FALLBACK" $OUT/diag919.txt $OUT/diag927.txt | cut -c1-300
for n in 919b 927b; do grep -av "nanobind\|leaked" /tmp/s_$n.txt > $OUT/suite_$n.txt; echo "== $n"; grep -aE "passed|failed|rc=" $OUT/suite_$n.txt | tail -3; grep -a "^FAILED\|^ERROR\|Timeout" $OUT/suite_$n.txt | cut -c1-300 | head; done
cd /tmp/fz && tar czf $OUT/fuzz.tgz . 2>/dev/null
cat /tmp/fz/f919.jsonl /tmp/fz/fuzz-shards-$S-*/* 2>/dev/null | python3 -c "
import sys, json, collections
c = collections.Counter(); fb = 0
for line in sys.stdin:
    try: r = json.loads(line)
    except Exception: continue
    c[r.get('outcome', '?')] += 1; fb += bool(r.get('reference_fallback_calls'))
print('f919 seed $S:', sum(c.values()), 'cases', dict(c), 'with fallback calls', fb)"; grep -a "^fuzz\|WRONG\|CRASH" /tmp/fz/f919.log | tail -4
