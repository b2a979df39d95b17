# The float32 bias of a learned table (carry .whl for 9.19; $1 = 927 after .cj1/stash.sh, carry .whl .cj2): the
# near-tolerance learned-table fuzz case at 6 data seeds (float32 bias vs bias in q's dtype), the cost of the float32
# bias in a training step, the CUDA tests that serve learned tables, the fuzzer's learned-table classes.
V=${1:-919}
. .whl/setup.sh || exit 1
P=""; [ $V = 927 ] && { . .cj2/use.sh || exit 1; P=$CUDNN_NEW; export TE_COMPILE_UNCHECKED_CUDNN=serve; }
export PYTHONPATH=$PWD:$PYTHONPATH TE_COMPILE_CACHE_DIR=/tmp/c$V
nvidia-smi -L > $OUT/card.txt
F="^nanobind\|^leaked\|Warning\|_warn_once\|^  "
LD_PRELOAD=$P timeout 200 python3 bench/probes/probe_w2.py 6 2>&1 | grep -av "$F" | tee $OUT/w2-$V.txt | grep -a "seed\|Error"
LD_PRELOAD=$P timeout 200 python3 bench/probes/probe_table_f32_time.py ${SHAPES:-2,16,4096,128 4,16,1024,64 1,16,4096,64} 2>&1 | grep -av "$F" | tee $OUT/time-$V.txt
LD_PRELOAD=$P timeout ${T:-240} python3 -m pytest -q -m cuda tests/test_cuda_learned_bias_training.py tests/test_cuda_fuzz_classes.py -p no:cacheprovider > $OUT/tests-$V.txt 2>&1; tail -3 $OUT/tests-$V.txt; grep -a "^FAILED" $OUT/tests-$V.txt | head
