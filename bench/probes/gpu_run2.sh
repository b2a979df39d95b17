. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
mkdir -p $OUT/hf
{
  (CUDA_LAUNCH_BLOCKING=1 LD_PRELOAD=$CUDNN_NEW python3 bench/probes/diag21_cases.py s0 s1 > $OUT/c927_a.txt 2>&1) &
  (CUDA_LAUNCH_BLOCKING=1 LD_PRELOAD=$CUDNN_NEW python3 bench/probes/diag21_cases.py s2 ss plain > $OUT/c927_b.txt 2>&1) &
  (python3 bench/probes/diag21_cases.py s0 s1 s2 ss plain > $OUT/c919.txt 2>&1) &
  for v in te_all fx_te_inner fx_named fx_direct; do
    (timeout 400 python3 bench/probes/diag20_hf.py $v > $OUT/hf/$v.log 2>&1; echo "rc=$?" >> $OUT/hf/$v.log) &
  done
  (TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0 timeout 400 python3 bench/probes/diag20_hf.py te > $OUT/hf/te_static0.log 2>&1; echo "rc=$?" >> $OUT/hf/te_static0.log) &
  (TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0 timeout 400 python3 bench/probes/diag20_hf.py te_all > $OUT/hf/te_all_static0.log 2>&1; echo "rc=$?" >> $OUT/hf/te_all_static0.log) &
  (timeout 560 python3 -m te_compile.testing.fuzz --device cuda --cases 400 --seed 2003 --jobs 4 --json $OUT/f919_2003.jsonl 2>/dev/null | tail -n 30 > $OUT/f919_2003.log) &
  wait
}
cd $OUT && tar czf hf.tgz hf && rm -rf hf fuzz-shards-*
for f in $OUT/c9*.txt; do echo "== $f"; cat $f; done; tail -n 1 $OUT/f919_2003.log
