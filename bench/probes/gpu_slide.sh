. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 bench/probes/probe_sliding.py > $OUT/sliding_919.txt 2>&1
LD_PRELOAD=$CUDNN_NEW timeout 200 python3 bench/probes/probe_sliding.py > $OUT/sliding_927.txt 2>&1
grep -h "W \|H200\|H100\|Error" $OUT/sliding_9*.txt | cut -c1-250
