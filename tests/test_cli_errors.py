"""The command line with the user's code or input at fault: one line on stderr naming what failed and where, a
non-zero exit, the whole traceback only with --traceback; every option has help text and shows its default."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from te_compile.cli import benchmark, demo
from te_compile.__main__ import COMMANDS, explain_parser, main, tune_parser


@pytest.fixture
def module(tmp_path, monkeypatch):
    """Write ``name.py`` into a folder on sys.path; returns a writer."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(body)
        return name
    return write


def _one_line(capsys) -> str:
    """The one error line (explain's progress line, "te-compile: compiling ...", before it is not an error)."""
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("te-compile: compiling")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_factory_that_raises(module, capsys):
    name = module("factory_raises", "def make():\n    raise ValueError('no such checkpoint')\n")
    assert main(["explain", f"{name}:make"]) == 1
    assert _one_line(capsys) == (f"te-compile explain: {name}:make() raised ValueError: no such checkpoint "
                                 f"(at {_path(name)}:2 in make)")


def _path(name: str) -> str:
    import importlib
    import os
    f = importlib.import_module(name).__file__
    return os.path.relpath(f) if os.path.abspath(f).startswith(os.getcwd()) else f


def test_with_traceback_the_whole_traceback(module, capsys):
    name = module("factory_raises_tb", "def make():\n    raise ValueError('no such checkpoint')\n")
    assert main(["explain", f"{name}:make", "--traceback"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "ValueError: no such checkpoint" in err
    assert err.strip().splitlines()[-1].startswith(f"te-compile explain: {name}:make() raised ValueError")


def test_a_factory_name_bound_to_something_else(module, capsys):
    name = module("factory_is_int", "make = 5\n")
    assert main(["explain", f"{name}:make"]) == 1
    assert _one_line(capsys) == (f"te-compile explain: {name}:make is not a function (its type is int); FACTORY must "
                                 "be a function of no arguments returning (model_or_fn, args[, kwargs])")


def test_a_forward_that_raises(module, capsys):
    name = module("forward_raises", "import torch\n"
                  "def fn(q):\n"
                  "    raise RuntimeError('shapes do not match')\n"
                  "def make():\n"
                  "    return fn, (torch.randn(2, 2),)\n")
    assert main(["explain", f"{name}:make", "--target", "reference"]) == 1
    line = _one_line(capsys)
    assert line.startswith(f"te-compile explain: {name}:make's model raised RuntimeError: "), line
    assert "shapes do not match" in line and line.endswith(f"(at {_path(name)}:3 in fn)"), line


def test_a_missing_module(capsys):
    assert main(["explain", "no_such_module_here:make"]) == 1
    assert _one_line(capsys).startswith("te-compile explain: cannot load 'no_such_module_here:make': No module named")


def test_a_bad_option_value(capsys):
    with pytest.raises(SystemExit) as e:
        main(["explain", "te_compile.cli.demo:example", "--mode", "bogus"])
    assert e.value.code == 2
    line = _one_line(capsys)
    assert line.startswith("te-compile explain: argument --mode: invalid choice: 'bogus'")
    assert line.endswith("('te-compile explain --help' lists the options)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a GPU")
@pytest.mark.parametrize("argv,prog", [(["tune", "te_compile.cli.demo:example"], "te-compile tune"),
                                       (["bench", "--suite", "flex"], "te-compile bench")])
def test_gpu_commands_without_a_gpu(argv, prog, capsys):
    assert main(argv) == 1
    line = _one_line(capsys)
    assert line.startswith(f"{prog}: needs a CUDA GPU") and "torch.cuda.is_available() is False" in line


def test_explain_json_has_the_code_only_with_code(capsys):
    args = ["explain", "te_compile.cli.demo:example", "--target", "reference", "--json"]
    assert main(args) == 0
    assert "code" not in json.loads(capsys.readouterr().out)
    assert main(args + ["--code"]) == 0
    assert "te_compile.attn_fwd" in json.loads(capsys.readouterr().out)["code"][0]


@pytest.mark.parametrize("make", [explain_parser, tune_parser, demo.parser, benchmark.parser],
                         ids=["explain", "tune", "demo", "bench"])
def test_every_option_has_help_and_shows_its_default(make):
    p = make()
    text = p.format_help()
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, action.dest
        if action.option_strings and action.default not in (None, False):
            assert f"(default: {action.default})" in " ".join(text.split()), action.dest


def test_the_command_list_says_what_each_command_does(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command, what in COMMANDS.items():
        assert f"  {command}" in out and " ".join(what.split()[:4]) in " ".join(out.split()), command
