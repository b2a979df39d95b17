. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
mkdir -p /tmp/hf
{
  (LD_PRELOAD=$CUDNN_NEW python3 bench/probes/diag21_cases.py y0 y1 > /tmp/ya.txt 2>&1) &
  (LD_PRELOAD=$CUDNN_NEW python3 bench/probes/diag21_cases.py y2 y3 > /tmp/yb.txt 2>&1) &
  (EMIT="const_mode=scalar" LD_PRELOAD=$CUDNN_NEW python3 bench/probes/diag21_cases.py y0_base y1_base y2_base y3_base > /tmp/yc.txt 2>&1; EMIT="kv_guard=0 ninf_clamp=0" LD_PRELOAD=$CUDNN_NEW python3 bench/probes/diag21_cases.py y0_base y1_base y2_base y3_base > /tmp/yd.txt 2>&1) &
  for v in te_nochecker te_preimport te_norewrite_nocopy fx_cudnn; do
    (timeout 400 python3 bench/probes/diag20_hf.py $v > /tmp/hf/$v.log 2>&1; echo "rc=$?" >> /tmp/hf/$v.log) &
  done
  (timeout 570 python3 -m pytest -q -m cuda tests -p no:cacheprovider > /tmp/suite919.txt 2>&1) &
  (LD_PRELOAD=$CUDNN_NEW timeout 570 python3 -m pytest -q -m cuda tests -p no:cacheprovider > /tmp/suite927.txt 2>&1) &
  (timeout 560 python3 -m pytest -q -m cuda tests -p no:cacheprovider --co -q > /dev/null 2>&1; timeout 560 python3 -m te_compile.testing.fuzz --device cuda --cases 150 --seed 2006 --jobs 2 --json $OUT/f919_2006.jsonl 2>/dev/null | tail -n 30 > /tmp/f919_2006.log) &
  wait
}
for f in /tmp/hf/*.log; do echo "== $f"; grep -a "HF \|auto-compiled\|rc=\|Segmentation\|Fatal" $f | head -4; done > $OUT/hf.txt
cat /tmp/ya.txt /tmp/yb.txt > $OUT/y927.txt; echo "== const_mode=scalar" >> $OUT/y927.txt; cat /tmp/yc.txt >> $OUT/y927.txt; echo "== kv_guard=0 ninf_clamp=0" >> $OUT/y927.txt; cat /tmp/yd.txt >> $OUT/y927.txt
{ echo "== 9.19"; tail -n 40 /tmp/suite919.txt; echo "== 9.27"; tail -n 60 /tmp/suite927.txt; cat /tmp/f919_2006.log; } > $OUT/suites.txt
rm -rf $OUT/fuzz-shards-*
cut -c1-200 $OUT/y927.txt; cat $OUT/hf.txt; grep -a "passed\|failed" $OUT/suites.txt | tail -n 5; tail -n 1 /tmp/f919_2006.log
