# cuDNN 9.19 (carry .whl): 1. the super-exponential keep on the GPU fuzzer's seed-14001 case and its variants
# (bench/probes/diag_steep.py) and its regression class; 2. Hugging Face flex models at 1x4096 with --tune and the
# final whole-model rule (median round). models $1 (default "llama qwen3"), until $2 seconds of the call.
. .whl/setup.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
timeout 120 python3 bench/probes/diag_steep.py --jobs 10 --only "E " 2>&1 | grep -av "^nanobind\|leaked" | tee $OUT/diag_steep.txt
timeout 150 python3 -m pytest -q -m cuda tests/test_cuda_fuzz_classes.py -k "super_exp or nan_score or large_gathered or inverse_causal" 2>&1 | tail -3
left=$((${2:-560} - SECONDS))
SHAPES="1x4096" timeout $left bash bench/probes/gpu_run33.sh 919 $((left - 5)) tune "${1:-llama qwen3}"
