# class 3: fresh vs warm Inductor cache, plain vs te_compile, sequential in one cache dir each
. .whl/setup.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
mkdir -p /tmp/hf
seq_runs() {  # which
  export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$1
  for r in cold warm warm2; do
    timeout 280 python3 bench/probes/diag20_hf4.py $1 $r > /tmp/hf/$1_$r.log 2>&1; echo "rc=$?" >> /tmp/hf/$1_$r.log
  done
}
seq_runs plain &
seq_runs te &
wait
cd /tmp/hf && for f in *.log; do grep -av "nanobind\|leaked\|^ *$" $f > $f.clean; done; tar czf $OUT/hf_logs.tgz *.clean
for f in /tmp/hf/*.clean; do echo "== $f"; grep -a "HF \|rc=\|Segmentation\|stale before\|File.*line" $f | grep -v "^  File" | head -8; grep -a "^  File" $f | tail -3; done > $OUT/hf.txt
cat $OUT/hf.txt
