# after .fa4a/unpack.py in the call before, on a machine where .cj2/use.sh ran (9.27 in /tmp/cj/x); carry .whl .fa4b
# the flex sweep at 2x16x4096x128, te_compile (serve="always") vs Inductor vs FLASH (FA4), on cuDNN $1 (919 or 927)
. .whl/setup.sh && . .fa4b/install.sh && export PYTHONPATH=$PWD:$PYTHONPATH
_L=/tmp/cj/x/nvidia/cudnn_jit/lib
export CUDNN_NEW="$_L/libcudnn.so.9:$_L/libcudnn_graph.so.9:$_L/libcudnn_engines_runtime_compiled.so.9"
nvidia-smi -L > $OUT/card.txt
pre=""; [ "$1" = 927 ] && pre="LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve"
env $pre python3 -c "import torch, cudnn; print(torch.backends.cudnn.version(), cudnn.backend_version())" >> $OUT/card.txt
env $pre timeout 90 python3 bench/probes/probe_sliding_profile.py 2>&1 | grep -av "nanobind\|leaked\|Warning\|warn" > $OUT/slprof$1.txt
env $pre TE_COMPILE_SERVE=always timeout 470 python3 bench/sweep.py --part flex --flash --rounds 2 --iters 20 --json $OUT/sw$1.json > /tmp/sw.log 2>&1
grep -av "nanobind\|leaked" /tmp/sw.log > $OUT/sw$1.log
cat $OUT/card.txt $OUT/slprof$1.txt; grep -a "served\|Error\|error\|x " $OUT/sw$1.log | cut -c1-200 | tail -30
