# cuDNN 9.19 vs 9.28 (full package), speed and the limits noted as blocked by cuDNN, one card; carry .whl .c286 on a
# machine where .c286/use.sh already unpacked 9.28 (or after the five stash calls). $1 = sweep | limits
. .whl/setup.sh && . .c286/use.sh > /dev/null || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
N="LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve"
F="nanobind\|leaked\|_warn_once\|skipped remainder"
for v in 919 928; do pre=""; [ $v = 928 ] && pre=$N
  env $pre python3 -c "import torch, cudnn; print('$v:', torch.backends.cudnn.version(), cudnn.backend_version())" >> $OUT/card.txt; done
cat $OUT/card.txt
if [ "${1:-sweep}" = sweep ]; then
  for v in 919 928; do pre=""; [ $v = 928 ] && pre=$N
    env $pre TE_COMPILE_SERVE=always timeout ${2:-270} python3 bench/sweep.py --part flex --rounds 2 --iters 20 --json $OUT/sw$v.json 2>&1 | grep -av "$F" > $OUT/sw$v.log
    grep -a "^flex\|geomean\|Error\|error" $OUT/sw$v.log | cut -c1-220
  done
else
  for v in 928 919; do pre=""; [ $v = 928 ] && pre=$N
    echo "=== $v"
    env $pre timeout 150 python3 bench/probes/probe_band_sq_lt_skv.py 2>&1 | grep -av "$F" | tee $OUT/band_$v.txt | cut -c1-250
    env $pre timeout 120 python3 bench/probes/probe_alibi_bias.py 2>&1 | grep -av "$F" | tee $OUT/alibi_$v.txt | cut -c1-250
  done
fi
