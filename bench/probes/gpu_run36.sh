# explain's replayed reports / tune's own backend on torch 2.11 (9.19): the CPU tests of explain, tune and the
# cuda tuning tests, then the training-tune replay at 1x8192. carry .whl.
. .whl/setup.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH TE_COMPILE_CACHE_DIR=/tmp/empty-cache-36
F="nanobind\|leaked\|_warn_once\|skipped remainder\|UserWarning"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_explain_replay.py tests/test_explain_repeat.py \
  tests/test_backend_identity.py tests/test_tuning.py tests/test_cuda_tuning.py > $OUT/pytest.log 2>&1; echo "pytest rc $?"
grep -a "passed\|failed\|Error" $OUT/pytest.log | tail -8 | cut -c1-300
timeout 250 python3 bench/probes/probe_tune_train_hf.py llama 8192 > $OUT/tune.log 2>&1; echo "rc $?"
grep -av "$F" $OUT/tune.log | grep -a "tune\|explain\|counters" | cut -c1-200
