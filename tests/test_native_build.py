"""The native call path's build (te_compile.cudnn.native): through torch.utils.cpp_extension.load, cached per machine
by the sources and flags, and a clear reason when it cannot build (the Python path then serves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from te_compile.cudnn import native

pytest.importorskip("ninja")

GOOD = """#include <pybind11/pybind11.h>
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", []() { return 42; }); }
"""


@pytest.fixture
def source(tmp_path, monkeypatch):
    src = tmp_path / "csrc" / "native_attn.cpp"
    src.parent.mkdir()
    monkeypatch.setattr(native, "SOURCE", src)
    monkeypatch.setenv("TE_COMPILE_NATIVE_DIR", str(tmp_path / "cache"))
    return src


def test_the_extension_builds_through_cpp_extension_once(source):
    source.write_text(GOOD)
    mod = native._build_and_load([])
    assert mod.answer() == 42
    (built,) = Path(native._cache_root()).glob("*/te_compile_native_*.so")
    assert (built.parent / "build.ninja").is_file()  # cpp_extension's build, with its standard flags
    assert "-DTORCH_EXTENSION_NAME" in (built.parent / "build.ninja").read_text()
    assert " -Wall" in (built.parent / "build.ninja").read_text()
    stamp = built.stat().st_mtime_ns
    assert native._build_and_load([]).answer() == 42
    assert built.stat().st_mtime_ns == stamp  # not built again


def test_a_failed_build_names_its_log_with_the_compilers_error(source):
    source.write_text(GOOD + "int broken = ;\n")
    with pytest.raises(native._BuildError) as e:
        native._build_and_load([])
    log = Path(str(e.value).split("log: ")[1].rstrip(")"))
    assert "expected primary-expression" in log.read_text() or "error" in log.read_text()


def test_without_ninja_the_reason_says_how_to_get_it(source, monkeypatch):
    source.write_text(GOOD)
    monkeypatch.setattr(native, "_ninja", lambda: "")
    with pytest.raises(native._BuildError, match="ninja not found.*pip install ninja"):
        native._build_and_load([])
