. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
mkdir -p $OUT/hf
{
  (EMIT="distinct_operands=0" LD_PRELOAD=$CUDNN_NEW python3 bench/probes/diag21_cases.py x_ > $OUT/c927_off.txt 2>&1) &
  (LD_PRELOAD=$CUDNN_NEW python3 bench/probes/diag21_cases.py x_ > $OUT/c927_on.txt 2>&1) &
  (python3 bench/probes/diag21_cases.py x_ > $OUT/c919_on.txt 2>&1) &
  for v in te_nochecker te_preimport te_norewrite_nocopy fx_cudnn; do
    (timeout 400 python3 bench/probes/diag20_hf.py $v > $OUT/hf/$v.log 2>&1; echo "rc=$?" >> $OUT/hf/$v.log) &
  done
  (timeout 560 python3 -m te_compile.testing.fuzz --device cuda --cases 450 --seed 2004 --jobs 4 --json $OUT/f919_2004.jsonl 2>/dev/null | tail -n 30 > $OUT/f919_2004.log) &
  (LD_PRELOAD=$CUDNN_NEW timeout 560 python3 -m te_compile.testing.fuzz --device cuda --cases 300 --seed 2005 --jobs 3 --json $OUT/f927_2005.jsonl 2>/dev/null | tail -n 60 > $OUT/f927_2005.log) &
  wait
}
cd $OUT && tar czf hf.tgz hf && rm -rf hf fuzz-shards-*
for f in $OUT/c9*.txt; do echo "== $f"; cut -c1-230 $f; done; for f in $OUT/hf.tgz; do :; done; tail -n 1 $OUT/f9*.log
