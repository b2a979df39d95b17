# Sourced from the repo root on the GPU machine, in the call that carries ".whl" and ".c286", after
# bash .c281/stash.sh ... bash .c285/stash.sh ran in the 5 previous calls on the same warm machine
# (each call within 30 s of the previous one):
#   . .whl/setup.sh && . .c286/use.sh && LD_PRELOAD=$CUDNN_NEW python3 ...
# Stashes part-05, checks all 6 parts, reassembles + unpacks them once into /tmp/c28/x, and exports
# CUDNN_NEW, an LD_PRELOAD value listing every cuDNN 9.28 library: prefix a command with
# LD_PRELOAD=$CUDNN_NEW to run torch and the cudnn frontend on 9.28; leave it off for torch's 9.19.
# (C28_SKIP_CHECK=1 skips the final python print; used only for CPU-side testing.)
_c28_use() {
  local T=/tmp/c28 D=.c286 L p miss="" f
  mkdir -p "$T" || return 1
  if [ ! -d "$T/x" ]; then
    cp -f "$D/part-05" "$T/" || { echo "c28: copying $D/part-05 failed (carry .c286)"; return 1; }
    for p in part-00 part-01 part-02 part-03 part-04 part-05; do [ -f "$T/$p" ] || miss="$miss $p"; done
    if [ -n "$miss" ]; then
      echo "c28: /tmp/c28 lacks:$miss. Each of .c281 ... .c285 must be stashed first (bash .c28K/stash.sh,"
      echo "c28: one call each, every call within 30 s of the previous, on the same warm machine); start over from .c281 if the machine went cold."
      return 1
    fi
    (cd "$T" && sha256sum -c --quiet "$OLDPWD/$D/parts.sha256") || { echo "c28: a stashed part has a wrong sha256; stash it again"; return 1; }
    echo "c28: all 6 parts present; unpacking into $T/x ..."
    rm -rf "$T/x.tmp"; mkdir -p "$T/x.tmp/nvidia/cudnn" || return 1
    if command -v xz >/dev/null 2>&1; then
      ( set -o pipefail; cat "$T"/part-0[0-5] | xz -dc -T0 | tar -C "$T/x.tmp/nvidia/cudnn" -xf - )
    else
      ( set -o pipefail; cat "$T"/part-0[0-5] | python3 -c "import sys, tarfile; kw = {'filter': 'fully_trusted'} if hasattr(tarfile, 'fully_trusted_filter') else {}; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1], **kw)" "$T/x.tmp/nvidia/cudnn" )
    fi || { echo "c28: unpacking failed"; rm -rf "$T/x.tmp"; return 1; }
    (cd "$T/x.tmp/nvidia/cudnn/lib" && sha256sum -c --quiet "$OLDPWD/$D/libs.sha256") || { echo "c28: unpacked libraries fail their sha256"; rm -rf "$T/x.tmp"; return 1; }
    mv "$T/x.tmp" "$T/x" || return 1
  fi
  L=$T/x/nvidia/cudnn/lib
  # the engine libraries' RUNPATH looks in $ORIGIN/../../{cublas,cuda_nvrtc,cu13}/lib: point those at
  # the nvidia packages torch uses (best effort; libraries torch already loaded match by soname anyway)
  for p in $(python3 -c "import nvidia; print(' '.join(nvidia.__path__))" 2>/dev/null); do
    for f in cublas cuda_nvrtc cu13; do
      [ -e "$T/x/nvidia/$f" ] || [ ! -d "$p/$f/lib" ] || ln -s "$p/$f" "$T/x/nvidia/$f"
    done
  done
  CUDNN_NEW=""
  for f in libcudnn.so.9 libcudnn_graph.so.9 libcudnn_heuristic.so.9 libcudnn_ops.so.9 \
           libcudnn_engines_precompiled.so.9 libcudnn_engines_runtime_compiled.so.9 libcudnn_engines_tensor_ir.so.9; do
    [ -f "$L/$f" ] || { echo "c28: $L/$f is missing; rm -rf $T/x and start over"; return 1; }
    CUDNN_NEW="$CUDNN_NEW${CUDNN_NEW:+:}$L/$f"
  done
  export CUDNN_NEW
  echo "c28: CUDNN_NEW=$CUDNN_NEW"
  [ -n "${C28_SKIP_CHECK:-}" ] && return 0
  LD_PRELOAD=$CUDNN_NEW python3 -c "import torch, cudnn; print('new cuDNN: torch', torch.backends.cudnn.version(), 'frontend', cudnn.backend_version())"
}
_c28_use
