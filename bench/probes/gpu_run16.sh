# carry .whl. The GPU tuning test with stack dumps (faulthandler) if it stalls, next to a 9.19 fuzz run
# at a new seed (serve="always").
. .whl/setup.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
S=${1:-3201}
mkdir -p /tmp/fz
(timeout 230 python3 -m te_compile.testing.fuzz --device cuda --cases 400 --seed $S --jobs 3 --json /tmp/fz/f$S.jsonl 2>/dev/null | tail -n 25 > /tmp/fz/f$S.log) &
(TE_COMPILE_LOG=INFO timeout 220 python3 -X faulthandler -m pytest -s -q -m cuda tests/test_cuda_tuning.py -p no:cacheprovider \
   -o faulthandler_timeout=100 --log-cli-level=INFO > /tmp/tune.txt 2>&1; echo "rc=$?" >> /tmp/tune.txt) &
wait
grep -av "nanobind\|leaked" /tmp/tune.txt > $OUT/tune.txt
rm -rf /tmp/fz/fuzz-shards-*; cp /tmp/fz/* $OUT/
echo "== tune"; grep -a "passed\|failed\|rc=\|site \|Timeout\|Thread\|File" $OUT/tune.txt | head -60
echo "== fuzz $S"; wc -l < $OUT/f$S.jsonl; grep -a "pass\|wrong\|crash\|seed" $OUT/f$S.log | tail -8
