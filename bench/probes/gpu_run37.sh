# cuDNN 9.28 (full package) next to torch's 9.19, correctness: after the five .c28K stash calls; carry .whl .c286.
# The cuda suite (two shards) on each version and the fuzzer (serve="always") at a new seed on each version, all in
# parallel on one GPU until the time is up. 9.28 is unchecked, so TE_COMPILE_UNCHECKED_CUDNN=serve makes it run the
# emitted score_mod / mask_mod graphs too (that is what is being checked).   $1 = seed (9.19; 9.28 gets $1+1), $2 = s
. .whl/setup.sh && . .c286/use.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
S=${1:-7101}
T=${2:-540}
A="tests/test_cuda.py tests/test_cuda_flex.py tests/test_cuda_graphs.py tests/test_cuda_tuning.py"
B="tests/test_cuda_generate.py tests/test_cuda_fuzz_classes.py tests/test_cuda_hf.py tests/test_cuda_learned_bias_training.py tests/test_distributed.py"
mkdir -p /tmp/fz
suite() { # name files [env...]
  local n=$1 files=$2; shift 2
  env "$@" timeout $T python3 -m pytest -q -m cuda $files -p no:cacheprovider -o faulthandler_timeout=300 > /tmp/s_$n.txt 2>&1; echo "rc=$?" >> /tmp/s_$n.txt
}
fuzz() { # name seed [env...]
  local n=$1 s=$2; shift 2
  (cd /tmp/fz && env "$@" timeout $T python3 -m te_compile.testing.fuzz --device cuda --cases 700 --seed $s --jobs 2 --json /tmp/fz/$n.jsonl 2>/dev/null | tail -n 25 > /tmp/fz/$n.log)
}
N="LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve"
suite 919a "$A" & suite 919b "$B" &
suite 928a "$A" $N & suite 928b "$B" $N &
fuzz f919 $S & fuzz f928 $((S+1)) $N &
wait
for n in 919a 919b 928a 928b; do grep -av "nanobind\|leaked" /tmp/s_$n.txt > $OUT/suite_$n.txt; echo "== $n"; grep -aE "passed|failed|rc=" $OUT/suite_$n.txt | tail -3; grep -a "^FAILED\|^ERROR\|Timeout" $OUT/suite_$n.txt | cut -c1-200 | head; done
cd /tmp/fz && tar czf $OUT/fuzz.tgz . 2>/dev/null
for x in "f919 $S" "f928 $((S+1))"; do set -- $x; echo "== $1 seed $2"; f=/tmp/fz/$1.jsonl; [ -s $f ] || f="/tmp/fz/fuzz-shards-$2-*/*"
  cat $f 2>/dev/null | python3 -c "
import sys, json, collections
c = collections.Counter()
for line in sys.stdin:
    try: c[json.loads(line).get('outcome', '?')] += 1
    except Exception: pass
print(sum(c.values()), 'cases', dict(c))"; grep -a "^fuzz\|WRONG\|CRASH" /tmp/fz/$1.log | tail -4; done
