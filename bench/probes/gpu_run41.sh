# branch wip/graph-aware-cost: the whole-graph check (te_compile.tuning.graph_check) on the GPU. carry .whl.
# 1. its GPU test; 2. the row it is for (Llama 4x1024 inference: per-site tuning served 4 sites, 0.77x);
# 3. the Hugging Face rows at every shape with --tune (default vs always vs torch.compile + A/A), as gpu_run33.
# $1: seconds for step 3
. .whl/setup.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
F="nanobind\|leaked\|_warn_once\|skipped remainder"
timeout 120 python3 -m pytest -q -x tests/test_cuda_tuning.py -p no:cacheprovider > $OUT/test.txt 2>&1
grep -a "passed\|failed\|^E " $OUT/test.txt | head -8
for mode in infer train; do
  TE_COMPILE_CACHE_DIR=/tmp/gc-$mode timeout 200 python3 bench/probes/graph_check_hf.py --model llama --batch 4 \
    --seq 1024 --mode $mode --json $OUT/gc-llama-4x1024-$mode.json 2>&1 | grep -av "$F" | tail -8 | cut -c1-500
done
SHAPES="4x1024 1x4096 1x8192" bash bench/probes/gpu_run33.sh 919 ${1:-300} tune "llama qwen3 mistral"
