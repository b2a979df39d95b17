# cuDNN frontend's interval-mask flex attention (9.19), then the training-tune replay. Call 1: carry .fa4a,
# `python3 .fa4a/unpack.py`; call 2 within 30 s: carry .whl .fa4b, `bash bench/probes/gpu_run35.sh`.
. .whl/setup.sh && . .fa4b/install.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH TE_COMPILE_CACHE_DIR=/tmp/empty-cache-35
F="nanobind\|leaked\|_warn_once\|skipped remainder\|UserWarning"
timeout 300 python3 bench/probes/probe_cudnn_flex_intervals.py > $OUT/intervals.log 2>&1; echo "rc $?"
grep -av "$F" $OUT/intervals.log | tail -30 | cut -c1-400
timeout 250 python3 bench/probes/probe_tune_train_hf.py llama 8192 > $OUT/tune.log 2>&1; echo "rc $?"
grep -av "$F" $OUT/tune.log | tail -30 | cut -c1-400
