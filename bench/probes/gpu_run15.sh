# after .cj1/stash.sh in the call before; carry .whl .cj2
# Hugging Face models at 1x8192 not reached in the previous call, default policy, cuDNN 9.19 then 9.27
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
for v in 919 927; do
  pre=""; [ $v = 927 ] && pre="LD_PRELOAD=$CUDNN_NEW"
  env $pre timeout 280 python3 bench/hf_models.py --batch 1 --seq 8192 --iters 10 --models $1 --impls flex_attention --json $OUT/hf$v.json > /tmp/hf$v.log 2>&1
  grep -av "nanobind\|leaked" /tmp/hf$v.log > $OUT/hf$v.log; echo "== $v"; grep -a "sites\|geomean\|error" $OUT/hf$v.log | cut -c1-200
done
