# dBias precision: float32 dBias output, and the learned-table case over seeds, padded / not. $1 = 919 | 927
V=${1:-919}
if [ $V = 919 ]; then bash .cj1/stash.sh; . .whl/setup.sh; P=""
else . .whl/setup.sh && . .cj2/use.sh || exit 1; P="$CUDNN_NEW"; export TE_COMPILE_UNCHECKED_CUDNN=serve; fi
export PYTHONPATH=$PWD:$PYTHONPATH
LD_PRELOAD=$P timeout 400 python3 bench/probes/probe_dbias_precision.py ${2:-8} 2>&1 | grep -v "nanobind\|leaked\|_warn_once\|skipped remainder" | cut -c1-300
