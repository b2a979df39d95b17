# Next GPU call after the broadcast-only keep: is an op with no full operand what crashed cuDNN 9.19? carry .whl.
# 1. bench/probes/diag_broadcast.py (each variant served, kept, and served with full_inputs=1, own processes); 2. the fuzz classes on cuDNN,
# the new broadcast_only_op class among them; 3. the same probe on a newer cuDNN when $1 = 927 (after .cj1/stash.sh,
# carry .whl .cj2).
. .whl/setup.sh || exit 1
[ "$1" = 927 ] && { . .cj2/use.sh || exit 1; export LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve; }
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi -L > $OUT/card.txt
timeout 300 python3 bench/probes/diag_broadcast.py --jobs 6 2>&1 | grep -av "nanobind\|leaked" | tee $OUT/diag_broadcast.txt
timeout 200 python3 -m pytest -q -m cuda tests/test_cuda_fuzz_classes.py -p no:cacheprovider > $OUT/classes.txt 2>&1
grep -a "passed\|failed\|^FAILED" $OUT/classes.txt | cut -c1-200 | tail -5
