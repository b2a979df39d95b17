. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
mkdir -p /tmp/hf
{
  for v in te_only_report te_only_rewrite te_only_copy; do
    (timeout 400 python3 bench/probes/diag20_hf.py $v > /tmp/hf/$v.log 2>&1; echo "rc=$?" >> /tmp/hf/$v.log) &
  done
  (timeout 575 python3 -m pytest -q -m cuda tests -p no:cacheprovider > /tmp/suite919.txt 2>&1) &
  (LD_PRELOAD=$CUDNN_NEW timeout 570 python3 -m te_compile.testing.fuzz --device cuda --cases 450 --seed 2007 --jobs 4 --json $OUT/f927_2007.jsonl 2>/dev/null | tail -n 40 > /tmp/f927_2007.log) &
  (TE_COMPILE_UNCHECKED_CUDNN=serve LD_PRELOAD=$CUDNN_NEW timeout 570 python3 -m te_compile.testing.fuzz --device cuda --cases 250 --seed 2008 --jobs 3 --json $OUT/f927_2008_ungated.jsonl 2>/dev/null | tail -n 60 > /tmp/f927_2008.log) &
  wait
}
for f in /tmp/hf/*.log; do echo "== $f"; grep -a "HF \|auto-compiled\|rc=\|Segmentation\|Fatal" $f | head -4; done > $OUT/hf.txt
{ grep -a "passed\|failed\|FAILED\|Error" /tmp/suite919.txt | grep -v "nanobind" | tail -n 30; tail -n 1 /tmp/f927_2007.log; tail -n 1 /tmp/f927_2008.log; } > $OUT/summary.txt
rm -rf $OUT/fuzz-shards-*
cat $OUT/hf.txt $OUT/summary.txt
