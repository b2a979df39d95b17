# carry .whl. Next GPU checks of measured decisions and calibration (cuDNN 9.19; prefix LD_PRELOAD for 9.27):
#  1. the tuned rows again with compiled candidates: default policy vs serve="always" vs torch.compile, A/A;
#  2. a calibration sweep that records kernel times (TE_COMPILE_SERVE=always), then te-compile calibrate on it;
#  3. where a served flex step's host time goes (cProfile by cumulative time, Inductor's generated code).
. .whl/setup.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
export TE_COMPILE_CACHE_DIR=$OUT/cache
step=${1:-all}
if [ $step = all ] || [ $step = tune ]; then
timeout 200 python3 bench/sweep.py --part flex --shape 8,16,1024,64 --cases "softcap,softcap + causal" --tune --always --control \
  --json $OUT/tuned-8x1024.json 2>&1 | grep -av "nanobind\|leaked" | tee $OUT/tuned-8x1024.txt | grep -a "flex\|geomean\|oracle\|site\|tune"
fi
if [ $step = all ] || [ $step = calib ]; then
TE_COMPILE_SERVE=always timeout 250 python3 bench/sweep.py --part flex --json $OUT/calib-flex.json 2>&1 | grep -av "nanobind\|leaked" | tee $OUT/calib-flex.txt | grep -a "^flex\|geomean"
python3 -m te_compile calibrate $OUT/calib-flex.json --out $OUT/calibration.json | tail -22
fi
if [ $step = all ] || [ $step = host ]; then
TORCH_LOGS=output_code timeout 120 python3 bench/probes/flex_step_host.py --sort cumulative > $OUT/fsh.txt 2>&1
grep -av "nanobind\|leaked" $OUT/fsh.txt > $OUT/flex_step_host.txt; rm $OUT/fsh.txt; grep -a "step wall\|step host" $OUT/flex_step_host.txt
fi
