# after .cj1/stash.sh in the call before; carry .whl .cj2. $1 fuzz seed, $2 suite/fuzz seconds
# the bias/dBias engine matrix on both versions, then gpu_run20.sh (suite + fuzz on both versions)
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
F="nanobind\|leaked\|_warn_once"
(timeout 60 python3 bench/probes/probe_dbias_engine.py 2>&1 | grep -v "$F" > $OUT/engine_919.txt) &
(LD_PRELOAD=$CUDNN_NEW timeout 60 python3 bench/probes/probe_dbias_engine.py 2>&1 | grep -v "$F" > $OUT/engine_927.txt) &
wait
cat $OUT/engine_919.txt $OUT/engine_927.txt | cut -c1-250
bash bench/probes/gpu_run20.sh ${1:-5101} ${2:-470}
