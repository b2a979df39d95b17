"""The native call path: the te_compile ops' CUDA and Autograd kernels in C++ (csrc/native_attn.cpp).

With it on, a call of ``te_compile::attn_fwd`` / ``attn_bwd`` on CUDA tensors stays in C++: one lookup of
the runner registered for its signature, the allocations, one execute of the cuDNN plan on PyTorch's current
stream. Python runs only for a signature it does not hold yet (te_compile.runtime.kernels builds the runner, serves
the call, and registers the runner here when it is one graph on the call's own tensors) and for calls that
record autograd history (te_compile.runtime.ops's autograd.Function, as without it).

The C++ side uses only cuDNN's C API: the Python frontend builds each plan and serializes it
(te_compile.cudnn.frontend_private.plan_blob reads what the variant pack needs), C++ loads the plan and executes it. A site on cuDNN's
interval kernels (te_compile.cudnn.flexkernel) registers the launches te_compile.cudnn.flexlaunch recorded instead:
C++ calls those compiled kernels through TVM-FFI's C ABI (csrc/interval_launch.h), for calls that pass the mask's
(in i) inputs the plan was built from (unchanged: same memory, same version); others go to Python, which builds
the plan for them and registers again.

``enable()`` compiles the extension once per machine (cached next to Inductor's cache, keyed by the source,
torch, Python and the cuDNN and CUDA headers) through torch.utils.cpp_extension.load (ninja and the system C++
compiler), against the headers a pip-installed CUDA torch brings (torch's, cuDNN's; the CUDA runtime's from the
toolkit or pip); it then swaps
the ops' Python CUDA and Autograd kernels for the C++ ones. Where something is missing it stays off and ``status()`` says why; the
Python kernels serve as before. ``TE_COMPILE_NATIVE=0`` keeps it off.

Replays: a runner that sees the same pointers twice captures its execute into a CUDA graph and launches that
graph for those pointers from then on (one ``cudaGraphLaunch`` instead of cuDNN's execute, which costs several
kernel launches of host time). ``TE_COMPILE_NATIVE_REPLAY=0`` or ``set_replay(False)`` turns them off.

This module does not import the cuDNN frontend: te_compile.runtime.kernels asks ``active()`` on every call.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from .. import counters, env
from .frontend_private import plan_blob

log = logging.getLogger("te_compile")

ENV = "TE_COMPILE_NATIVE"
REPLAY_ENV = "TE_COMPILE_NATIVE_REPLAY"
SOURCE = Path(__file__).parent / "csrc" / "native_attn.cpp"

#: the extension module while it serves the ops (None: the Python kernels serve)
_ext: Any = None
#: the extension module once loaded (kept when the native path is turned off, to turn it on again)
_module: Any = None
#: why the native path is off ("" while on)
_why_off: str = "not enabled yet"
_tried = False
_lock = threading.Lock()
#: called with the extension when the native path turns on, with None when it turns off (te_compile.runtime.ops swaps
#: the ops' kernels)
hooks: list[Callable[[Any], None]] = []


def active() -> bool:
    """Whether the C++ kernels serve the ops in this process."""
    return _ext is not None


def possible() -> bool:
    """Whether the native call path is on, or can turn on in this process (not turned off, not failed, a machine that
    can build it): what the rules assume of sites whose speed depends on it."""
    return _ext is not None or (not _tried and not _unavailable())


def status() -> str:
    """One line for reports: "on" or "off: <reason>" (does not build anything)."""
    return "on" if _ext is not None else f"off: {_why_off}"


def enable() -> str:
    """Turn the native call path on where this machine can build it (once per process; the build once per
    machine); returns ``status()``."""
    global _tried
    with _lock:
        if not _tried:
            _tried = True
            _try_enable()
    return status()


def _try_enable() -> None:
    global _ext, _why_off, _module
    why = _unavailable()
    if why:
        _why_off = why
        return
    try:
        includes = _includes()
    except LookupError as e:
        _why_off = str(e)
        return
    try:
        ext = _module or _build_and_load(includes)
    except _BuildError as e:
        _why_off = str(e)
        log.warning("te_compile: the native call path is off: %s", _why_off)
        return
    why = ext.init()
    if why:
        _why_off = why
        return
    from .graphs import UID
    want = {u.name: int(u.value) for u in UID}
    if dict(ext.uids()) != want:  # the C++ source and graphs.py must name the operands alike
        _why_off = f"the extension's operand uids {dict(ext.uids())} differ from te_compile's {want}"
        return
    _module = ext
    ext.set_replay(env.value(REPLAY_ENV) != "0")
    for hook in hooks:
        hook(ext)
    _ext = ext
    _why_off = ""
    log.info("te_compile: native call path on (cuDNN %s)", ext.backend_version())


def disable() -> None:
    """Back to the Python kernels (tests; the next ``enable()`` turns it on again without rebuilding)."""
    global _ext, _why_off, _tried
    with _lock:
        if _ext is not None:
            _ext.clear()
            for hook in hooks:
                hook(None)
        _ext, _why_off, _tried = None, "disabled", False


def set_replay(on: bool) -> bool:
    """Turn the native path's CUDA-graph replays on or off (benchmarks compare both); returns the old setting
    (False while the native path is off)."""
    return bool(_ext.set_replay(on)) if _ext is not None else False


def fail_next(n: int = 1) -> None:
    """A test hook: the next ``n`` plan executes in C++ fail as a refused cuDNN execute would (each failing
    runner warns once, with the status, and its calls go to Python from then on)."""
    if _ext is not None:
        _ext.fail_next(n)


def _unavailable() -> str:
    if env.value(ENV) == "0":
        return f"{ENV}=0"
    if torch.version.cuda is None:
        return "this torch has no CUDA"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if shutil.which(_compiler()) is None:
        return f"no C++ compiler ({_compiler()} not found; set CXX)"
    return ""


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


# --------------------------------------------------------------------------- headers

def _site_dirs() -> list[Path]:
    """Where pip put packages: the directories holding torch and the cuDNN frontend, then sys.path."""
    out: list[Path] = []
    for mod in ("torch", "cudnn"):
        spec = importlib.util.find_spec(mod)
        if spec is not None and spec.origin:
            out.append(Path(spec.origin).parent.parent)
    out += [Path(p) for p in sys.path if p and os.path.isdir(p)]
    seen: set = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def _find_header(name: str, candidates: list[Path]) -> Optional[Path]:
    for d in candidates:
        if (d / name).is_file():
            return d
    return None


def _includes() -> list[str]:
    """Include directories for the CUDA runtime's and cuDNN's headers (cuda_runtime_api.h, cudnn.h); raises
    LookupError naming what is missing."""
    sites = _site_dirs()
    cuda_home = [Path(p) / "include" for p in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                                               "/usr/local/cuda") if p]
    nv = [s / "nvidia" / sub / "include" for s in sites for sub in ("cu13", "cu12", "cuda_runtime")]
    cudnn_dirs = [s / "nvidia" / sub / "include" for s in sites for sub in ("cudnn", "cudnn_jit")]
    if os.environ.get("CUDNN_INCLUDE_DIR"):
        cudnn_dirs.insert(0, Path(os.environ["CUDNN_INCLUDE_DIR"]))
    found: list[str] = []
    # the runtime headers include crt/host_config.h, which a CUDA toolkit has and the pip runtime package may lack
    for header, where in (("crt/host_config.h", cuda_home + nv), ("cuda_runtime_api.h", cuda_home + nv),
                          ("cudnn.h", cudnn_dirs + cuda_home + [Path("/usr/include")])):
        d = _find_header(header, where)
        if d is None:
            raise LookupError(f"{header} not found (looked in {', '.join(str(p) for p in where[:4])}, ...)")
        if str(d) not in found:
            found.append(str(d))
    return found


# --------------------------------------------------------------------------- the build

class _BuildError(RuntimeError):
    pass


def _cache_root() -> Path:
    """Next to Inductor's cache (``TE_COMPILE_NATIVE_DIR`` overrides it)."""
    if env.value("TE_COMPILE_NATIVE_DIR"):
        return Path(env.value("TE_COMPILE_NATIVE_DIR"))
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        return Path(cache_dir()) / "te_compile" / "native"
    except Exception:  # noqa: BLE001 - older layouts
        return Path(tempfile.gettempdir()) / "te_compile" / "native"


def _flags() -> tuple[list[str], list[str]]:
    """What te_compile adds to cpp_extension's standard flags (its include paths, ABI and pybind defines, -fPIC, the C++
    standard): optimisation, warnings, and c10's CUDA library (the stream and device guards)."""
    debug = ["-g"] if env.value("TE_COMPILE_NATIVE_DEBUG") else []
    torch_lib = Path(torch.__file__).parent / "lib"
    cuda = ["-lc10_cuda"] if (torch_lib / "libc10_cuda.so").is_file() else []  # none in a CPU torch
    return debug + ["-O2", "-Wall"], [f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", *cuda, "-ldl"]


def _fingerprint(includes: list[str], flags: list[str]) -> str:
    h = hashlib.sha256()
    for src in sorted(SOURCE.parent.iterdir()):  # the source and the headers it includes
        h.update(src.name.encode() + src.read_bytes())
    h.update(" ".join(flags).encode())
    h.update(f"{torch.__version__} {sys.version}".encode())
    for d in includes:  # the headers' versions (cudnn_version.h, the frontend's version header)
        for name in ("cudnn_version.h", "cuda_runtime_api.h"):
            p = Path(d) / name
            if p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _ninja() -> str:
    """Where ninja is, made findable for cpp_extension (the ``ninja`` package's binary, next to this Python, or on
    PATH); "" when there is none."""
    dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja  # the PyPI package te_compile[cuda] installs
        dirs.insert(0, ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for d in dirs:
        if os.path.isfile(os.path.join(d, "ninja")) and d not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = d + os.pathsep + os.environ.get("PATH", "")
    return shutil.which("ninja") or ""


def _build_and_load(includes: list[str]) -> Any:
    """Build (once per machine: cached by the sources, flags, torch, Python and the headers) and import the extension
    through torch.utils.cpp_extension.load, with its standard flags."""
    from torch.utils import cpp_extension

    if not _ninja():
        raise _BuildError("ninja not found (torch's cpp_extension builds with it: pip install ninja, or "
                          "te_compile[cuda])")
    cflags, ldflags = _flags()
    tag = _fingerprint(includes, cflags + ldflags)
    root = _cache_root() / tag
    root.mkdir(parents=True, exist_ok=True)
    built = any(root.glob("te_compile_native_*.so"))
    if not built:
        print("te_compile: building the native call path (C++, once per machine; about a minute) ...",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        mod = cpp_extension.load(f"te_compile_native_{tag}", [str(SOURCE)], extra_cflags=cflags, extra_ldflags=ldflags,
                                 extra_include_paths=includes, build_directory=str(root), with_cuda=False)
    except (RuntimeError, OSError, ImportError, subprocess.CalledProcessError) as e:
        (root / "build.log").write_text(str(e))
        raise _BuildError(f"the C++ build failed (log: {root / 'build.log'})") from None
    if not built:
        print(f"te_compile: native call path built in {time.perf_counter() - t0:.0f} s ({root})", file=sys.stderr,
              flush=True)
    return mod


# --------------------------------------------------------------------------- runners (called by te_compile.runtime.kernels)

def register(direction: str, args: tuple, info: dict) -> None:
    """Hand the runner of the call ``args`` (the op's arguments) to C++; a refusal leaves it to Python."""
    ext = _ext
    if ext is None:
        return
    if "interval" in info:
        _register_interval(ext, direction, args, info)
        return
    vp = plan_blob.variant_pack(info["plan"])
    if isinstance(vp, str):
        decline(direction, vp)
        return
    pack = (info["owner"], vp.plan_json, list(vp.uids), list(vp.kinds), list(vp.payloads), list(vp.offsets),
            vp.fe_workspace, info["n_inputs"], info["consts"])
    try:
        if direction == "forward":
            q, k, v, bias, extra, spec = args
            ext.register_forward(q, k, v, bias, list(extra), spec, *pack, info["out_shape"], info["out_stride"],
                                 info["bias_shape"], info["bias_copy"], info["rows"], info["bias_rows"], info["block"])
        else:
            dout, q, k, v, out, lse, bias, extra, spec, need_dbias = args
            ext.register_backward(dout, q, k, v, out, lse, bias, list(extra), spec, bool(need_dbias), *pack,
                                  info["grad_strides"], info["need_dbias"], info["bias_shape"], info["bias_copy"],
                                  info["guard_lse"])
    except Exception as e:  # noqa: BLE001 - a runner C++ refuses stays with Python; the call itself goes on
        decline(direction, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")  # TORCH_CHECK's message


_ffi_set = False


def _register_interval(ext, direction: str, args: tuple, info: dict) -> None:
    """A runner of cuDNN's interval kernels (te_compile.cudnn.flexkernel): C++ calls their recorded launches."""
    global _ffi_set
    try:
        if not _ffi_set:
            ext.set_tvm_ffi(*info["ffi"]())
            atexit.register(clear)  # runners release their TVM-FFI objects while Python is still whole
            _ffi_set = True
        common = (info["interval"],)  # info["keep"] holds its objects until C++ holds references
        if direction == "forward":
            q, k, v, bias, extra, spec = args
            ok = ext.register_interval_forward(q, k, v, bias, list(extra), spec, *common, info["out_stride"],
                                               info["rows"], info["data"], info["n_inputs"], info["block"])
        else:
            dout, q, k, v, out, lse, bias, extra, spec, need_dbias = args
            ok = ext.register_interval_backward(dout, q, k, v, out, lse, bias, list(extra), spec, bool(need_dbias),
                                                *common, info["grad_strides"], info["guard_lse"], info["data"],
                                                info["n_inputs"])
    except (RuntimeError, TypeError, ValueError, OSError, AttributeError, ImportError) as e:
        decline(direction, f"cuDNN's interval kernels: {type(e).__name__}: {e}")
        return
    if not ok:
        decline(direction, "cuDNN's interval kernels: a C++ launch failed before")


def decline(direction: str, why: str) -> None:
    """Record that a signature's runner stays with Python, and why (te_compile.counters ``declined``, ``stats()``)."""
    counters.decline(direction, why)
    log.info("te_compile: the native call path leaves a %s signature to Python (%s)", direction, why)


def block_checked(q, k, extra, spec: str) -> None:
    """The BlockMask in ``extra`` passed te_compile's check: C++ may run calls that carry it."""
    if _ext is not None:
        _ext.block_checked(q, k, list(extra), spec)


def clear() -> None:
    if _ext is not None:
        _ext.clear()


def forget(owner: int) -> None:
    """Drop the runners registered with ``owner`` (the id of the cuDNN graph they run; each destroys its plan)."""
    if _ext is not None:
        _ext.forget(owner)


def stats() -> dict:
    """Calls the native path ran (hits; ``replays`` of them launched a captured graph) and handed to Python
    (misses), the graphs it captured, the runners it holds, the cuDNN execution plans alive (``plans``: each runner
    owns its plan and destroys it when it leaves its table), and the runners whose execute failed
    (``failed_runners``: each warned once and sends its calls to Python)."""
    return dict(_ext.stats(), declined=dict(counters.declined)) if _ext is not None else {}


counters.add_source("native", lambda: _ext.stats() if _ext is not None else {})

