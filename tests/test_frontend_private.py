"""The cuDNN frontend's private surface: one module reads it (te_compile.cudnn.frontend_private), the frontend the
suite installs is one it was checked on and still defines every name, and a changed name fails with the version."""

from __future__ import annotations

import pathlib
import re

import pytest

from te_compile.cudnn import frontend_private

cudnn = pytest.importorskip("cudnn")

PKG = pathlib.Path(frontend_private.__file__).resolve().parent.parent.parent
OWNER = pathlib.Path(frontend_private.__file__).resolve().parent
#: every private name te_compile reads -> the file of the cudnn package that defines it (a glob for the compiled one)
PRIVATE = {
    "_flex_attention_forward": "flex_attention/execution.py",
    "_flex_attention_backward": "flex_attention/execution.py",
    "_plan_tensors": "flex_attention/execution.py",
    "_prepare_flex_attn_fwd": "flex_attention/dispatch.py",
    "_compile_flex_attn_fwd": "flex_attention/dispatch.py",
    "_launch_flex_attn_fwd": "flex_attention/dispatch.py",
    "_flex_attn_bwd": "flex_attention/dispatch.py",
    "_BwdPreallocated": "flex_attention/dispatch.py",
    "_runtime_args": "flex_attention/plan/mask_plan.py",
    "_backward_runtime_args": "flex_attention/plan/mask_plan.py",
}


def test_the_suite_runs_on_a_frontend_whose_private_surface_was_checked():
    assert cudnn.__version__ in frontend_private.FRONTEND_CHECKED, (
        f"cuDNN frontend {cudnn.__version__}: check te_compile/cudnn/frontend_private/'s names on it (the cuda suite "
        f"and the GPU fuzzer), then add it to FRONTEND_CHECKED ({frontend_private.FRONTEND_CHECKED})")


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_the_installed_frontend_still_defines_each_private_name(name):
    root = pathlib.Path(cudnn.__file__).resolve().parent
    files = sorted(root.glob(PRIVATE[name]))
    assert files, f"cuDNN frontend {cudnn.__version__}: no {PRIVATE[name]}"
    text = b"".join(f.read_bytes() for f in files)
    assert re.search(rb"\b" + name.encode() + rb"\b", text), f"cuDNN frontend {cudnn.__version__}: {name} is gone"


def test_no_other_module_reads_a_private_name():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if OWNER in path.parents:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(PKG)}:{n} {name}" for name in PRIVATE
                      if re.search(r"(\.|\b_[A-Za-z]*\()" + re.escape(name) + r"\b", line) or f"``{name}" in line]
    assert not found, found


def test_a_changed_name_fails_naming_the_version(monkeypatch):
    class Plan:  # a mask plan of a frontend without _runtime_args
        pass

    monkeypatch.setattr(frontend_private, "FRONTEND_CHECKED", ("0.0.1",))
    with pytest.raises(frontend_private.FrontendChanged) as e:
        frontend_private.forward_runtime_args(Plan())
    msg = str(e.value)
    assert f"cuDNN frontend {cudnn.__version__}" in msg and "_runtime_args" in msg and "checked" in msg and "0.0.1" in msg
