# The identity on the raw score (EmitOptions.reuse_identity="score") against none ("off"): kernel and step times of
# the emitted flex rows of the sweep at 2x16x4096x128, serve="always", on cuDNN 9.19 and 9.28 (carry .whl .c286 on a
# machine where .c286/use.sh unpacked 9.28), one card.
. .whl/setup.sh && . .c286/use.sh > /dev/null || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH TE_COMPILE_SERVE=always
N="LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve"
for v in 919 928; do pre=""; [ $v = 928 ] && pre=$N
  for opt in off score; do
    echo "== cuDNN $v reuse_identity=$opt"
    env $pre timeout 150 python3 -c "
import runpy, sys
from te_compile.cudnn import lowering
lowering.set_options(reuse_identity='$opt')
sys.argv = ['sweep.py', '--part', 'flex', '--cases', '${CASES:-softcap,softcap + causal,ALiBi}', '--rounds', '2', '--iters', '20',
            '--json', '$OUT/id-$v-$opt.json']
runpy.run_path('bench/sweep.py', run_name='__main__')" 2>&1 | grep -a "^flex\|geomean" | cut -c1-200
  done
done
