#!/usr/bin/env bash
# The cuDNN version matrix on one GPU, side by side: the cuda suite, the fuzzer on cuDNN (serve="always") and the
# flex sweep, first on the cuDNN torch loads, then on another one preloaded, with the same code.
#
#   CUDNN_NEW=/path/libcudnn.so.9:/path/libcudnn_graph.so.9:/path/libcudnn_engines_runtime_compiled.so.9 \
#     bash bench/versions.sh OUTDIR [suite,fuzz,sweep] [SEED]
#
# CUDNN_NEW is an LD_PRELOAD value (docs/gpu.md, "Which cuDNN", says how to get one). The second version runs
# with TE_COMPILE_UNCHECKED_CUDNN=serve, so that the fuzzer and the sweep exercise its emitted graphs too.
# Results: OUTDIR/{suite,fuzz,sweep}_{base,new}.*; the last lines print the counts.
set -uo pipefail
out=${1:?OUTDIR}; what=${2:-suite,fuzz,sweep}; seed=${3:-$(date +%s)}
[ -n "${CUDNN_NEW:-}" ] || { echo "set CUDNN_NEW (an LD_PRELOAD value for the other cuDNN)"; exit 2; }
mkdir -p "$out"
run() {  # tag, then the command; tag "new" preloads the other cuDNN
  local tag=$1; shift
  if [ "$tag" = new ]; then env LD_PRELOAD="$CUDNN_NEW" TE_COMPILE_UNCHECKED_CUDNN=serve "$@"; else "$@"; fi
}
for tag in base new; do
  run $tag python3 -c "import torch, cudnn; print('$tag:', torch.cuda.get_device_name(), 'torch cuDNN',
    torch.backends.cudnn.version(), 'frontend', cudnn.backend_version())" | tee -a "$out/versions.txt"
done
for tag in base new; do  # correctness runs of both versions in parallel (no timing)
  case ",$what," in *,suite,*) (run $tag python3 -m pytest -q -m cuda tests -p no:cacheprovider > "$out/suite_$tag.txt" 2>&1) & ;; esac
  case ",$what," in *,fuzz,*) (run $tag python3 -m tools.fuzz --device cuda --cases 500 --seed "$seed" \
      --jobs 4 --json "$out/fuzz_$tag.jsonl" > "$out/fuzz_$tag.txt" 2>&1) & ;; esac
done
wait
case ",$what," in *,sweep,*) for tag in base new; do  # timing: one at a time
  run $tag env TE_COMPILE_SERVE=always python3 bench/sweep.py --part flex --rounds 2 --iters 20 \
    --json "$out/sweep_$tag.json" > "$out/sweep_$tag.txt" 2>&1
done ;; esac
for f in "$out"/suite_*.txt "$out"/fuzz_*.txt "$out"/sweep_*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f")"; grep -aE "passed|failed|^fuzz cuda:|^geomean" "$f" | tail -2; }
done
