# class 3 bisect: each variant its own process, in parallel; exit code 139/-11 = segfault
for v in te fx_direct; do
  (timeout 300 python3 bench/probes/diag20_hf.py $v sdpa > $OUT/hf_$v.log 2>&1; echo "exit $v: $?" >> $OUT/hf_$v.log) &
done
(TORCHINDUCTOR_GRAPH_PARTITION=0 timeout 300 python3 bench/probes/diag20_hf.py fx_direct sdpa > $OUT/hf_fxnp.log 2>&1; echo "exit fx_direct no-partition: $?" >> $OUT/hf_fxnp.log) &
wait
