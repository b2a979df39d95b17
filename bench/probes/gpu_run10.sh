# cuDNN 9.19 vs 9.27: the flex sweep at 2x16x4096x128, serve="always" (emitted graphs served on 9.27 too), one card
. .whl/setup.sh && . .cj2/use.sh && export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
export TE_COMPILE_SERVE=always
python3 -c "import torch, cudnn; print(torch.backends.cudnn.version(), cudnn.backend_version())" >> $OUT/card.txt
LD_PRELOAD=$CUDNN_NEW python3 -c "import torch, cudnn; print(torch.backends.cudnn.version(), cudnn.backend_version())" >> $OUT/card.txt
timeout 270 python3 bench/sweep.py --part flex --rounds 2 --iters 20 --json $OUT/sw919.json > $OUT/sw919.log 2>&1
LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve timeout 270 python3 bench/sweep.py --part flex --rounds 2 --iters 20 --json $OUT/sw927.json > $OUT/sw927.log 2>&1
for f in $OUT/sw919.log $OUT/sw927.log; do grep -av "nanobind\|leaked" $f > $f.tmp; mv $f.tmp $f; done
cat $OUT/card.txt; grep -a "served\|Error\|error" $OUT/sw919.log $OUT/sw927.log | cut -c1-220
