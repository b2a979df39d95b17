# One GPU call: cuDNN 9.27 crash bisect (both versions), HF reduce-overhead crash bisect (H100), fuzz on both.
# Run after .cj1/stash.sh, with .whl and .cj2 carried:  bash bench/probes/gpu_run1.sh
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt; python3 -c "import torch;print(torch.__version__, torch.cuda.get_device_name())" >> $OUT/card.txt
crash() { for v in "$@"; do timeout 170 python3 bench/probes/diag21_crash.py $v 2>&1 | grep -v Warning | tail -3; echo "$v rc=$?"; done; }
export -f crash
{
  (LD_PRELOAD=$CUDNN_NEW bash -c 'crash ss ss_fwd ss_noraw ss_bigws ss_lse' > $OUT/c927a.log 2>&1) &
  (LD_PRELOAD=$CUDNN_NEW bash -c 'crash ss_L256 ss_L128 ss_D64 ss_B1H1 ss_plus' > $OUT/c927b.log 2>&1) &
  (LD_PRELOAD=$CUDNN_NEW bash -c 'crash ss_ident ss_x2 ss_sq cap cap_fwd band band_fwd' > $OUT/c927c.log 2>&1) &
  (bash -c 'crash ss cap band ss_noraw' > $OUT/c919.log 2>&1) &
  for v in te plain fx_direct fx_wrapper te_nowrapper te_nohf plain_nohf; do
    (timeout 400 python3 bench/probes/diag20_hf.py $v > $OUT/hf_$v.log 2>&1; echo "rc=$?" >> $OUT/hf_$v.log) &
  done
  (TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0 timeout 400 python3 bench/probes/diag20_hf.py te > $OUT/hf_te_static0.log 2>&1; echo "rc=$?" >> $OUT/hf_te_static0.log) &
  (timeout 540 python3 -m te_compile.testing.fuzz --device cuda --cases 300 --seed 2001 --jobs 3 --json $OUT/f919_2001.jsonl > $OUT/f919_2001.log 2>&1) &
  (LD_PRELOAD=$CUDNN_NEW timeout 540 python3 -m te_compile.testing.fuzz --device cuda --cases 300 --seed 2002 --jobs 3 --json $OUT/f927_2002.jsonl > $OUT/f927_2002.log 2>&1) &
  wait
}
for f in $OUT/hf_*.log; do echo "== $f"; grep -a "HF \|auto-compiled\|rc=\|Segmentation\|Fatal" $f | head -5; done
tail -n 4 $OUT/c9*.log; tail -n 2 $OUT/f9*.log
