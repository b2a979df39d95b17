# Hugging Face models at 1x8192, flex_attention: tuned default policy, serve="always", plain torch.compile, A/A and
# FLASH (FA4), training and inference; plus the band probe (fewer queries than keys).
#   $1 = 919 (carry .whl .fa4b, after .fa4a/unpack.py) | 919s (carry .whl .cj1: stashes cuDNN 9.27's part 1 first)
#        | 927 (carry .whl .cj2, right after 919s)      | 927c (carry .whl .cj2, 9.27 already unpacked)
#   $2 = models (comma list), $3 = seconds for the models, $4 = 1: run the band probe first
V=$1
case $V in
  919) . .whl/setup.sh && . .fa4b/install.sh || exit 1; P="" ;;
  919s) bash .cj1/stash.sh; . .whl/setup.sh; P="" ;;
  927|927c) . .whl/setup.sh && . .cj2/use.sh || exit 1; P="$CUDNN_NEW" ;;
esac
export PYTHONPATH=$PWD:$PYTHONPATH:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
python3 -c "import flash_attn.cute" 2>/dev/null && echo "FLASH importable" || echo "FLASH not importable"
nvidia-smi -L > $OUT/card.txt
export TE_COMPILE_CACHE_DIR=$OUT/cache
F="nanobind\|leaked\|_warn_once\|skipped remainder"
if [ "$4" = 1 ]; then
  LD_PRELOAD=$P timeout 150 python3 bench/probes/probe_band_sq_lt_skv.py 2>&1 | grep -av "$F" | tee $OUT/band.txt | cut -c1-250
fi
IFS=, read -ra MS <<< "$2"
END=$((SECONDS + ${3:-480}))
for m in "${MS[@]}"; do
  left=$((END - SECONDS)); [ $left -gt 60 ] || break
  LD_PRELOAD=$P timeout $left python3 bench/hf_models.py --batch 1 --seq 8192 --iters 10 --models $m \
    --impls flex_attention --tune --always --control --flash --json $OUT/hf-$V-$m.json 2>&1 | grep -av "$F" > $OUT/hf-$V-$m.txt
  grep -a "^$m\|FLASH\|error" $OUT/hf-$V-$m.txt | grep -av "Warning" | cut -c1-400 | tail -4
done
