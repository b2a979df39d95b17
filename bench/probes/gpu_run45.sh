# cuDNN 9.19 (carry .whl): 1. where the GPU fuzzer's open wrong classes B and D start to fail
# (bench/probes/diag_wrong.py --more); 2. Hugging Face flex models at 1x8192 with --tune: does the whole-model check
# leave the sites that win at long context served? models $1 (default "qwen3"), until $2 seconds of the call.
. .whl/setup.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
timeout 120 python3 bench/probes/diag_wrong.py --more --jobs 8 2>&1 | grep -av "nanobind\|leaked" | tee $OUT/diag_more.txt
left=$((${2:-560} - SECONDS))
SHAPES="1x8192" timeout $left bash bench/probes/gpu_run33.sh 919 $((left - 5)) tune "${1:-qwen3}"
