# class 3 bisect: wrapper (plain-like) vs te_only_report, with and without reading gm.code; cudagraph logs
. .whl/setup.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
mkdir -p /tmp/hf
run() {  # name, env..., variant
  local name=$1; shift
  (env "$@" TORCH_LOGS="recompiles,+cudagraphs" timeout 300 python3 bench/probes/diag20_hf3.py ${name%%@*} > /tmp/hf/$name.log 2>&1; echo "rc=$?" >> /tmp/hf/$name.log) &
}
run wrapper X=1
run wrapper_code X=1
run te_only_report X=1
run te_only_report_nocode X=1
wait
run te X=1
run te_nocode X=1
run te_only_report@nostatic TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0
run wrapper_recompile X=1
wait
cd /tmp/hf && for f in *.log; do grep -av "nanobind\|leaked\|^ *$" $f > $f.clean; done; tar czf $OUT/hf_logs.tgz *.clean
for f in /tmp/hf/*.clean; do echo "== $f"; grep -a "HF \|rc=\|Segmentation\|\[backend" $f | head -12; done > $OUT/hf.txt
cat $OUT/hf.txt
