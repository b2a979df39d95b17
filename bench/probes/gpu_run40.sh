# cuDNN 9.27 with the raw score behind one identity (EmitOptions.score_identity): the full check that would make 9.27
# a checked version. After .cj1/stash.sh in the call before; carry .whl .cj2. The cuda suite (two shards) and the
# fuzzer at two new seeds with the emitted graphs served (TE_COMPILE_UNCHECKED_CUDNN=serve), all in parallel on one
# GPU until the time is up.   $1 = first seed (the second is $1+2), $2 = seconds, $3 = 927 (default) or 919 (torch's
# own cuDNN: carry .whl only, nothing preloaded; bench/probes/gpu_run42.sh)
V=${3:-927}
. .whl/setup.sh || exit 1
[ $V = 927 ] && { . .cj2/use.sh || exit 1; }
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
S=${1:-8102}
T=${2:-520}
A="tests/test_cuda.py tests/test_cuda_flex.py tests/test_cuda_graphs.py tests/test_cuda_tuning.py"
B="tests/test_cuda_generate.py tests/test_cuda_fuzz_classes.py tests/test_cuda_hf.py tests/test_cuda_learned_bias_training.py tests/test_distributed.py"
[ $V = 927 ] && export LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve
mkdir -p /tmp/fz
for n in a b; do F=$A; [ $n = b ] && F=$B
  (timeout $T python3 -m pytest -q -m cuda $F -p no:cacheprovider -o faulthandler_timeout=300 > /tmp/s_$V$n.txt 2>&1; echo "rc=$?" >> /tmp/s_$V$n.txt) &
done
for s in $S $((S+2)); do
  (cd /tmp/fz && timeout $T python3 -m te_compile.testing.fuzz --device cuda --cases 500 --seed $s --jobs 2 --json /tmp/fz/f$s.jsonl > /tmp/fz/f$s.log 2>&1) &
done
wait
unset LD_PRELOAD
for n in a b; do grep -av "nanobind\|leaked" /tmp/s_$V$n.txt > $OUT/suite_$V$n.txt; echo "== $V$n"; grep -aE "passed|failed|rc=" $OUT/suite_$V$n.txt | tail -3; grep -a "^FAILED\|^ERROR\|Timeout" $OUT/suite_$V$n.txt | cut -c1-200 | head; done
cd /tmp/fz && tar czf $OUT/fuzz.tgz . 2>/dev/null
for s in $S $((S+2)); do echo "== $V seed $s"; f=/tmp/fz/f$s.jsonl; [ -s $f ] || f="/tmp/fz/fuzz-shards-$s-*/*.jsonl"
  cat $f 2>/dev/null | python3 -c "
import sys, json, collections
c = collections.Counter()
for line in sys.stdin:
    try: c[json.loads(line).get('outcome', '?')] += 1
    except Exception: pass
print(sum(c.values()), 'cases', dict(c))"; grep -a "CRASH\|WRONG" /tmp/fz/f$s.log | cut -c1-300 | head -4; done
