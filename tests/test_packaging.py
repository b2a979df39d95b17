"""The package says what it is: a LICENSE file in the repository and in the installed metadata."""

import importlib.metadata
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_license_file_and_metadata():
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0" in text
    md = importlib.metadata.metadata("te_compile")
    assert "Apache-2.0" in (md.get("License-Expression"), md.get("License"))
    assert "LICENSE" in (md.get_all("License-File") or [])


# --------------------------------------------------------------------------- how the cuDNN frontend is installed

import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[;\s]", r, maxsplit=1)[0].lower() for r in reqs}


def test_cudnn_frontend_is_the_cuda_extra_not_a_requirement():
    """CPU users (reference target) get no CUDA packages; GPU users install te_compile[cuda] (the frontend, and ninja for
    the native call path's build)."""
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]  # SPDX, no banner
    assert _names(project["dependencies"]) == {"torch", "numpy"}
    extras = project["optional-dependencies"]
    assert extras["cuda"] == ["nvidia-cudnn-frontend>=1.32", "ninja"]  # ninja: the native path's cpp_extension build
    assert "nvidia-cudnn-frontend" not in _names(extras["test"])
    from te_compile.cudnn.install import CUDA_EXTRA, FRONTEND

    assert CUDA_EXTRA in extras and FRONTEND in extras[CUDA_EXTRA]


def _recipe(make: str, target: str) -> str:
    return make.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]


def test_make_installs_per_purpose():
    """``make demo`` installs te_compile and torch alone (no CUDA package on a CPU); ``make test`` adds the test
    extra and the cuDNN frontend's Python package without its CUDA dependencies (its validator runs on a CPU);
    the cuda extra, with everything, only for the GPU targets."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        make = f.read()
    base, tests, cuda = _recipe(make, "$(BASE)"), _recipe(make, "$(TESTS)"), _recipe(make, "$(CUDA)")
    assert re.findall(r"pip install -q (\S+)$", base, re.M) == ["$(TORCH_PIN)", "."]
    assert 'pip install -q ".[test]"' in tests and 'pip install -q --no-deps "nvidia-cudnn-frontend==1.32"' in tests
    assert 'pip install -q ".[test,cuda]"' in cuda
    assert _recipe(make, "demo").startswith(" $(BASE)") and _recipe(make, "test").startswith(" $(TESTS)")
    for target in ("test-cuda", "fuzz-cuda", "bench"):
        assert _recipe(make, target).startswith(" $(CUDA)"), target


def test_the_cpu_suite_refuses_to_run_without_the_frontend():
    """One rule for the frontend in the CPU suite: make test installs it, and without it collection stops with
    one message (no mix of skips and failures)."""
    code = ("import sys; sys.modules['cudnn'] = None\n"  # import cudnn raises ImportError
            "import pytest; sys.exit(pytest.main(['-q', '--collect-only', '-p', 'no:cacheprovider', "
            "'tests/test_spec.py']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 4, (r.returncode, r.stdout[-1000:], r.stderr[-1000:])
    assert "the CPU suite needs the cuDNN frontend's Python package" in r.stdout + r.stderr


def test_readme_shows_both_install_paths_after_the_two_commands():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert readme.startswith("# te_compile\n\n```\nmake demo")
    two_commands = readme.index("make test")
    cpu, gpu = readme.find("pip install .  "), readme.find("pip install '.[cuda]'")
    assert cpu > 0 and gpu > 0 and "pip install te_compile" not in readme  # not on PyPI
    assert two_commands < cpu and two_commands < gpu, (cpu, gpu)


def test_frontend_missing_says_how_to_install():
    from te_compile.cudnn.install import frontend_missing

    missing = ModuleNotFoundError("No module named 'cudnn'", name="cudnn")
    assert frontend_missing(missing) == ("cuDNN frontend not installed (ModuleNotFoundError: No module named "
                                         "'cudnn'): pip install 'nvidia-cudnn-frontend>=1.32' (te_compile's [cuda] extra)")
    broken = frontend_missing(ImportError("libcudnn.so.9: cannot open shared object file\nmore"))
    assert broken.startswith("cuDNN frontend unavailable (ImportError: libcudnn.so.9: cannot open shared object file)")
    assert "pip install 'nvidia-cudnn-frontend>=1.32'" in broken
    # a library the frontend needs is missing: the frontend is there, but broken
    assert frontend_missing(ModuleNotFoundError("No module named 'tvm_ffi'", name="tvm_ffi")).startswith(
        "cuDNN frontend unavailable")
    assert len(frontend_missing(RuntimeError("x" * 1000))) < 300  # one line, the error text cut short


_WITHOUT_FRONTEND = r"""
import sys
sys.modules["cudnn"] = None  # as if nvidia-cudnn-frontend were not installed: `import cudnn` fails
import torch
import torch.nn.functional as F
import te_compile
from te_compile.cudnn.install import frontend_missing
try:
    import cudnn
except ImportError as e:
    assert frontend_missing(e).startswith("cuDNN frontend not installed"), frontend_missing(e)
q = torch.randn(1, 2, 8, 8)
fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
(d,) = te_compile.explain(fn, q, q, q, target="reference").decisions
assert d.rewrite and d.runs_on == "reference", d.reason
(d,) = te_compile.explain(fn, q, q, q, target="auto").decisions
assert not d.rewrite and "cpu" in d.reason, d.reason
out = torch.compile(fn, backend=te_compile.backend(target="reference", inner="eager"))(q, q, q)
torch.testing.assert_close(out, fn(q, q, q))
print("ok")
"""


def test_cpu_user_without_the_frontend():
    """Without the cuda extra, importing te_compile, the reference target and explain work on a CPU."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TORCH_LOGS", None)
    p = subprocess.run([sys.executable, "-c", _WITHOUT_FRONTEND], cwd=ROOT, env=env, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout


def test_the_wheel_holds_the_package_only(tmp_path):
    """The installed package is te_compile alone (with the native call path's C++ source): the fuzzer, the peer
    mods, the distributed harness and the tests stay in the checkout."""
    import zipfile
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), ROOT],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("te_compile-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "te_compile/cudnn/csrc/native_attn.cpp" in names and "te_compile/runtime/kernels.py" in names
    outside = {n.split("/")[0] for n in names} - {"te_compile", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert not outside, outside
    assert not [n for n in names if "fuzz" in n or "peers" in n or "distributed" in n], names
