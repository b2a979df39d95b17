# class 3: the generate test with HF's own compile off; does te_compile's backend see the decode step when HF compiles it?
. .whl/setup.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
mkdir -p /tmp/hf
(timeout 500 python3 -m pytest -q -m cuda tests/test_cuda_generate.py -p no:cacheprovider -rA > /tmp/suite.txt 2>&1) &
(timeout 300 python3 bench/probes/diag20_hf3.py te_hf > /tmp/hf/te_hf.log 2>&1; echo "rc=$?" >> /tmp/hf/te_hf.log) &
wait
grep -a "HF \|rc=\|\[backend" /tmp/hf/te_hf.log > $OUT/hf.txt
grep -a "passed\|failed\|FAILED\|ERROR\|^sdpa/\|^flex_attention/\|Error\|assert" /tmp/suite.txt | grep -v nanobind | cut -c1-400 | tail -n 60 > $OUT/suite.txt
cat $OUT/hf.txt $OUT/suite.txt
