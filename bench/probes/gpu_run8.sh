# class 3 fix check: the cuda suite (with the generate combos) and the crash probe on te_compile, cold and warm cache
. .whl/setup.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
mkdir -p /tmp/hf
(timeout 560 python3 -m pytest -q -m cuda tests -p no:cacheprovider -rA > /tmp/suite.txt 2>&1) &
(export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_te; for r in cold warm; do
  timeout 250 python3 bench/probes/diag20_hf4.py te $r > /tmp/hf/te_$r.log 2>&1; echo "rc=$?" >> /tmp/hf/te_$r.log; done) &
wait
for f in /tmp/hf/*.log; do echo "== $f"; grep -a "HF \|rc=\|Segmentation fault\|stale before" $f | head -5; done > $OUT/hf.txt
grep -a "passed\|failed\|FAILED\|ERROR\|^sdpa/\|^flex_attention/\|/reduce-overhead\|/default" /tmp/suite.txt | grep -v nanobind | tail -n 60 > $OUT/suite.txt
cat $OUT/hf.txt $OUT/suite.txt
