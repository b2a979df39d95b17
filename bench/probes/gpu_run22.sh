# $1 = 919 (carry .whl .cj1: stash part 1, replay + more 9.19 fuzzing) or 927 (carry .whl .cj2, right after)
V=${1:-919}
if [ $V = 919 ]; then bash .cj1/stash.sh; . .whl/setup.sh; P=""
else . .whl/setup.sh && . .cj2/use.sh || exit 1; P="$CUDNN_NEW"; fi
export PYTHONPATH=$PWD:$PYTHONPATH
F="nanobind\|leaked\|_warn_once\|UserWarning"
if [ $V = 919 ]; then
  (cd /tmp && timeout ${2:-240} python3 -m te_compile.testing.fuzz --device cuda --cases 400 --seed 4103 --jobs 2 --no-peers \
    --json /tmp/f4103.jsonl > /tmp/f4103.log 2>&1) &
fi
LD_PRELOAD=$P timeout 200 python3 bench/probes/replay_seeds.py bench/probes/diag_learned_bias_case.json 8 2>&1 | grep -v "$F" | grep -a "wrong\|pass\|kept\|fuzz:\|err" | cut -c1-300
wait
if [ $V = 919 ]; then mkdir -p $OUT/f4103 && cp -r /tmp/f4103* /tmp/fuzz-shards-4103-* $OUT/f4103/ 2>/dev/null; tail -3 /tmp/f4103.log
  cat /tmp/fuzz-shards-4103-*/*.jsonl /tmp/f4103.jsonl 2>/dev/null | python3 -c "
import sys, json, collections
c = collections.Counter()
for line in sys.stdin:
    try: c[json.loads(line).get('outcome', '?')] += 1
    except Exception: pass
print(sum(c.values()), 'cases', dict(c))"; fi
