# $1 = 919 (carry .whl .cj1: stash part 1) or 927 (carry .whl .cj2, right after): the learned-bias class
V=${1:-919}
if [ $V = 919 ]; then bash .cj1/stash.sh; . .whl/setup.sh; P=""
else . .whl/setup.sh && . .cj2/use.sh || exit 1; P="$CUDNN_NEW"; export TE_COMPILE_UNCHECKED_CUDNN=serve; fi
export PYTHONPATH=$PWD:$PYTHONPATH
F="nanobind\|leaked\|_warn_once"
LD_PRELOAD=$P timeout 150 python3 bench/probes/diag_learned_bias.py ${2:-4} 2>&1 | grep -v "$F" | cut -c1-400
LD_PRELOAD=$P timeout 100 python3 bench/probes/probe_dbias_precision.py --seeds 1 2>&1 | grep -v "$F" | cut -c1-300
LD_PRELOAD=$P timeout 150 python3 -m pytest -q -x -m cuda tests/test_cuda_fuzz_classes.py -k "learned" 2>&1 | tail -15 | cut -c1-600
