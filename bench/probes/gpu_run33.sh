# branch wip/graph-aware-cost: the cost model with the graph's other GPU work, on the rows that decide whether it
# lands. carry .whl (9.19) or run after a .cj1 stash with .cj2 ($1 = 927). Default policy vs serve="always" vs
# torch.compile (+ A/A), Hugging Face flex models at 1x8192, 1x4096 and 4x1024. $2: seconds; $3 = tune: the default
# column decides from measurements (te_compile.tune first, with the graph's work before each call), else the model.
V=${1:-919}
case $V in
  927) . .whl/setup.sh && . .cj2/use.sh || exit 1; P="$CUDNN_NEW" ;;
  928) . .whl/setup.sh && . .c286/use.sh > /dev/null || exit 1; P="$CUDNN_NEW" ;;  # after the .c28K stash calls; carry .whl .c286
  *) . .whl/setup.sh; P="" ;;
esac
export PYTHONPATH=$PWD:$PYTHONPATH TE_COMPILE_CACHE_DIR=/tmp/empty-cache-$V
F="nanobind\|leaked\|_warn_once\|skipped remainder"
END=$((SECONDS + ${2:-540}))
TUNE=""; [ "$3" = tune ] && TUNE="--tune"
MODELS=${4:-llama mistral gemma3 qwen3}
for shape in ${SHAPES:-1x8192 1x4096 4x1024}; do  # SHAPES="1x4096 4x1024" picks some
  set -- ${shape/x/ }
  for m in $MODELS; do
    left=$((END - SECONDS)); [ $left -gt 60 ] || break 2
    LD_PRELOAD=$P timeout $left python3 bench/hf_models.py --batch $1 --seq $2 --iters 10 --models $m \
      --impls flex_attention --always --control ${TUNE} --json $OUT/hf-$V-$m-$1x$2.json 2>&1 | grep -av "$F" | grep -a "^$m" | cut -c1-330
  done
done
