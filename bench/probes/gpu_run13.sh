# after .cj1/stash.sh in the call before; carry .whl .cj2
# the cuda suite on cuDNN 9.19 and 9.27 (same code), two shards per version, in parallel
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
A="tests/test_cuda.py tests/test_cuda_flex.py tests/test_cuda_graphs.py"
B="tests/test_cuda_generate.py tests/test_cuda_fuzz_classes.py tests/test_cuda_hf.py tests/test_cuda_learned_bias_training.py tests/test_distributed.py"
suite() { # name shard-files [env]
  local n=$1 files=$2; shift 2
  (env "$@" timeout 570 python3 -m pytest -q -m cuda $files -p no:cacheprovider > /tmp/s_$n.txt 2>&1; echo "rc=$?" >> /tmp/s_$n.txt) &
}
suite 919a "$A"
suite 919b "$B"
suite 927a "$A" LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve
suite 927b "$B" LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve
wait
for n in 919a 919b 927a 927b; do grep -av "nanobind\|leaked" /tmp/s_$n.txt > $OUT/suite_$n.txt; echo "== $n"; grep -aE "passed|failed|rc=" $OUT/suite_$n.txt | tail -3; grep -a "^FAILED\|^ERROR" $OUT/suite_$n.txt | cut -c1-200 | head; done
