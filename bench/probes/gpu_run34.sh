# cuDNN frontend's flex attention (interval masks) vs Inductor on the sweep's masks (9.19). Call 1: carry .fa4a,
# `python3 .fa4a/unpack.py`; call 2 within 30 s: carry .whl .fa4b, `bash bench/probes/gpu_run34.sh`.
. .whl/setup.sh && . .fa4b/install.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 500 python3 bench/probes/probe_cudnn_flex_intervals.py 2>&1 | grep -av "nanobind\|leaked\|_warn_once\|skipped remainder\|UserWarning" | cut -c1-300
