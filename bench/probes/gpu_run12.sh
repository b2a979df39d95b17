# after .cj1/stash.sh in the call before; carry .whl .cj2 idrun
# fuzzer serve="always": HEAD on 9.19 and 9.27 (gated), and the refactor identity pair on 9.19:
# idrun/before = the commit before the refactor, idrun/after = HEAD without the derivative change; made here with
#   echo /idrun/ >> .git/info/exclude; git worktree add --detach idrun/before 64032c9
#   git worktree add --detach idrun/after 3155c01 && (cd idrun/after && git revert --no-edit 719926b)
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
fz() { # dir seed log json [env...]
  local d=$1 s=$2 j=$3; shift 3
  (cd $d && env PYTHONPATH=$PWD:$PYTHONPATH "$@" timeout 560 python3 -c "import te_compile,sys; print(te_compile.__file__, file=sys.stderr)" 2>>$OUT/which.txt;
   env PYTHONPATH=$PWD:$PYTHONPATH "$@" timeout 555 python3 -m te_compile.testing.fuzz --device cuda --cases 520 --seed $s --jobs 4 --json /tmp/fz/$j.jsonl 2>/dev/null | tail -n 25 > /tmp/fz/$j.log) &
}
mkdir -p /tmp/fz
if [ "$1" != identity ]; then
fz . 3101 head919
fz . 3102 head927 LD_PRELOAD=$CUDNN_NEW
else
fz . 3104 ungated927 LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve
fi
fz idrun/before 3103 before919
fz idrun/after 3103 after919
wait
rm -rf /tmp/fz/fuzz-shards-*; cp /tmp/fz/*.jsonl /tmp/fz/*.log $OUT/
for j in head919 head927 ungated927 before919 after919; do echo "== $j"; wc -l < $OUT/$j.jsonl; grep -a "pass\|wrong\|crash\|seed" $OUT/$j.log | tail -6; done
python3 bench/fuzz_identity.py $OUT/before919.jsonl $OUT/after919.jsonl --common | tail -5
cat $OUT/which.txt
