# the tuning measurement-vs-step gap: candidates outside and inside a compile next to the compiled steps (9.19)
. .whl/setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
F="nanobind\|leaked\|_warn_once\|skipped remainder"
for args in "--shape 4,16,1024,64,4" "--shape 4,16,1024,64,16" "--shape 4,16,1024,64,4 --causal" "--shape 2,16,4096,128,16 --causal"; do
  timeout 150 python3 bench/probes/probe_candidate_gap.py $args 2>&1 | grep -v "$F" | cut -c1-200
done
