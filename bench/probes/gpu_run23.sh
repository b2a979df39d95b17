# carry .whl. Hugging Face models at 1x8192, flex_attention, cuDNN 9.19: tuned default policy vs serve="always" vs
# plain torch.compile (+ A/A), training and inference. Each model prints as it finishes.
. .whl/setup.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
export TE_COMPILE_CACHE_DIR=$OUT/cache
IFS=, read -ra MS <<< "${1:-llama,mistral,qwen3,gemma2,gemma3}"
END=$((SECONDS + ${2:-480}))
for m in "${MS[@]}"; do
  left=$((END - SECONDS)); [ $left -gt 60 ] || break
  timeout $left python3 bench/hf_models.py --batch 1 --seq 8192 --iters 10 --models $m --impls flex_attention \
    --tune --always --control --json $OUT/hf-$m.json 2>&1 | grep -av "nanobind\|leaked" > $OUT/hf-$m.txt
  grep -a "^$m\|oracle\|geomean\|x " $OUT/hf-$m.txt | grep -av "Warning" | cut -c1-300 | tail -6
done
