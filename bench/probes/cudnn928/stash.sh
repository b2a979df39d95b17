#!/usr/bin/env bash
# cuDNN 9.28.1.4 (full: graph + heuristic + ops + precompiled/runtime-compiled/tensor_ir engines)
# travels to the GPU machine as 6 parts of one .tar.xz, one git-ignored dir per call:
#   calls 1-5 (each within 30 s of the previous, same warm machine):
#       carry [".c28K"]                 command: bash .c28K/stash.sh          (K = 1..5)
#   call 6:
#       carry [".whl", ".c286"]         command: . .whl/setup.sh && . .c286/use.sh && LD_PRELOAD=$CUDNN_NEW python3 ...
# This script (the same copy in every .c28K) stashes whichever .c28*/part-* the checkout holds
# into /tmp/c28 (kept only while the machine stays warm) and checks them against parts.sha256.
T=/tmp/c28
mkdir -p "$T" || exit 1
n=0
for f in .c28[0-9]/part-[0-9][0-9]; do
  [ -f "$f" ] || continue
  cp -f "$f" "$T/" || { echo "c28: copying $f to $T failed"; exit 1; }
  n=$((n+1))
  d=${f%/*}; p=${f##*/}
  if [ -f "$d/parts.sha256" ]; then
    if (cd "$T" && grep " $p\$" "$OLDPWD/$d/parts.sha256" | sha256sum -c --quiet -); then
      echo "c28: stashed $f (sha256 ok)"
    else
      rm -f "$T/$p"; echo "c28: $f has a wrong sha256; removed from $T"; exit 1
    fi
  else
    echo "c28: stashed $f"
  fi
done
[ "$n" -gt 0 ] || echo "c28: no .c28K/part-* in this checkout (carry one of .c281 ... .c286)"
have=$(cd "$T" && ls part-[0-9][0-9] 2>/dev/null | tr '\n' ' '); have=${have% }
miss=""; for i in 0 1 2 3 4 5; do [ -f "$T/part-0$i" ] || miss="$miss part-0$i"; done
echo "c28: /tmp/c28 now holds: ${have:-nothing}${miss:+ (still missing:$miss; part-05 may also come with the last call, via .c286/use.sh)}"
echo "c28: start the next call within 30 s"
