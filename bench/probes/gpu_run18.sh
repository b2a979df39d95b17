# carry .whl. Measured decisions on the rows the cost model left: tune each case (cache under $OUT), then the
# default policy vs serve="always" vs torch.compile (+ A/A), on cuDNN 9.19.
. .whl/setup.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
export TE_COMPILE_CACHE_DIR=$OUT/cache
timeout 190 python3 bench/sweep.py --part flex --shape 8,16,1024,64 --cases "softcap,softcap + causal" --tune --always --control \
  --rounds 3 --json $OUT/tuned-8x1024.json 2>&1 | grep -av "nanobind\|leaked" | tee $OUT/tuned-8x1024.txt | grep -a "flex\|geomean\|oracle\|site\|tune"
timeout 125 python3 bench/sweep.py --part flex --shape 2,16,4096,128 --cases "sliding <=" --tune --always --rounds 3 \
  --json $OUT/tuned-4k.json 2>&1 | grep -av "nanobind\|leaked" | tee $OUT/tuned-4k.txt | grep -a "flex\|geomean\|oracle\|site\|tune"
