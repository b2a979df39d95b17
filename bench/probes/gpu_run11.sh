# for the next GPU session (issue "The cuDNN users run", items 4 and 5), after .cj1/stash.sh in the call before:
# native ALiBi exactness and tile skipping, and sliding-window spellings, on cuDNN 9.19 and 9.27, one card
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
for v in 919 927; do
  pre=""; [ $v = 927 ] && pre="LD_PRELOAD=$CUDNN_NEW"
  env $pre timeout 120 python3 bench/probes/probe_alibi_bias.py > $OUT/alibi_$v.txt 2>&1
  env $pre timeout 60 python3 bench/probes/probe_alibi_bias.py --shape 2,12,4096,128 >> $OUT/alibi_$v.txt 2>&1
  env $pre timeout 200 python3 bench/probes/probe_sliding.py > $OUT/sliding_$v.txt 2>&1
done
grep -ahv "nanobind\|leaked" $OUT/*.txt
