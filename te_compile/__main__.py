"""Command line: ``python -m te_compile`` (also installed as ``te-compile``).

    te-compile demo [--device cpu]                  compile a small GPT, print the site report
    te-compile explain MODULE:FACTORY [--json]      report on your own model (see below)
    te-compile tune MODULE:FACTORY [--list]         measure the model's sites on this GPU, fill the cache
    te-compile bench [--suite sdpa|flex|all] ...    the GPU benchmark (needs CUDA)

``explain`` takes ``MODULE:FACTORY`` where FACTORY is a callable of no arguments that returns
``(model_or_fn, args)`` or ``(model_or_fn, args, kwargs)``, e.g. ``te_compile.cli.demo:example``.

Failures are one line on stderr: a usage error (an option or value the command does not take, an environment
variable te_compile does not accept) exits 2; a failure while running (the user's code raised, no GPU for a command
that needs one, an error of te_compile's) exits 1, an interrupted run 130. ``--traceback`` prints the whole
traceback too.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
import traceback
from typing import Any, Callable, Optional

from .cli.cli_parser import Parser

#: the subcommands and what each does (te-compile --help)
COMMANDS = {
    "demo": "compile a small GPT with te_compile and print its site report (cuDNN on a GPU, the reference kernel "
            "on a CPU)",
    "explain": "report every attention site of your model: rewritten or kept, and why",
    "tune": "measure your model's sites on this GPU (cuDNN vs what torch.compile runs) into the cache later "
            "compiles decide from (needs a CUDA GPU)",
    "bench": "the attention benchmark: te_compile vs Inductor flex vs torch's SDPA backends (needs a CUDA GPU)",
}
#: the torch.compile modes `--mode` accepts
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class UserError(Exception):
    """A failure of the user's code or input: reported as one line (``--traceback``: the whole traceback)."""

    def __init__(self, line: str, cause: Optional[BaseException] = None):
        super().__init__(line)
        self.cause = cause


def _where(e: BaseException) -> str:
    """``file.py:LINE in func``: the innermost frame of ``e``'s traceback outside torch and te_compile (the
    user's code), or ""."""
    here = os.path.dirname(os.path.abspath(__file__))
    import torch
    skip = (here, os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(os.__file__))
    frames = traceback.extract_tb(e.__traceback__)
    for fr in reversed(frames):
        path = os.path.abspath(fr.filename)
        if not path.startswith(skip) and not fr.filename.startswith("<"):
            return f"{os.path.relpath(path) if path.startswith(os.getcwd()) else path}:{fr.lineno} in {fr.name}"
    return ""


def _user_call(what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a failure of it raised as a UserError naming ``what`` and the user's line."""
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit, UserError):
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the user's code is reported, not a traceback of ours
        inner = e
        while getattr(inner, "__cause__", None) is not None and type(inner).__module__.startswith("torch._dynamo"):
            inner = inner.__cause__  # Dynamo wraps what the model raised while tracing
        at = _where(inner) or _where(e)
        msg = str(inner).strip().splitlines()[0] if str(inner).strip() else ""
        raise UserError(f"{what} raised {type(inner).__name__}" + (f": {msg}" if msg else "")
                        + (f" (at {at})" if at else ""), e) from e


def _load(spec: str, command: str = "explain"):
    prog = f"te-compile {command}"
    if ":" not in spec:
        raise UserError(f"{prog}: expected MODULE:FACTORY, got {spec!r}")
    mod_name, attr = spec.split(":", 1)
    if "" not in sys.path and os.getcwd() not in sys.path:
        # the installed `te-compile` script does not put the current folder on sys.path (`python -m` does);
        # users point it at their own module in the folder they are in
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise UserError(f"{prog}: cannot load {spec!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing
        raise UserError(f"{prog}: importing {mod_name} raised {type(e).__name__}: {e} (at {_where(e)})", e) from e
    obj = getattr(module, attr, None)
    if obj is None:
        raise UserError(f"{prog}: cannot load {spec!r}: module {mod_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise UserError(f"{prog}: {spec} is not a function (its type is {type(obj).__name__}); FACTORY must be a "
                        f"function of no arguments returning (model_or_fn, args[, kwargs])")
    made = _user_call(f"{prog}: {spec}()", obj)
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise UserError(f"{prog}: {spec} must return (model_or_fn, args[, kwargs])")
    fn, args = made[0], made[1]
    if not callable(fn):
        raise UserError(f"{prog}: {spec} returned {type(fn).__name__} as the model; expected a module "
                        f"or a function: return (model_or_fn, args[, kwargs])")
    if not isinstance(args, (tuple, list)):
        raise UserError(f"{prog}: {spec} returned {type(args).__name__} as the args; expected a tuple "
                        f"of example inputs, e.g. (model, (x,)): return (model_or_fn, args[, kwargs])")
    kwargs = made[2] if len(made) == 3 else {}
    if not isinstance(kwargs, dict):
        raise UserError(f"{prog}: {spec} returned {type(kwargs).__name__} as the kwargs; expected a "
                        f"dict: return (model_or_fn, args, kwargs)")
    return fn, tuple(args), dict(kwargs)


def _parser(prog: str, description: str) -> Parser:
    p = Parser(prog, description)
    p.add_argument("--traceback", action="store_true", help="on a failure of your code, print the whole traceback "
                   "instead of one line")
    return p


def explain_parser() -> Parser:
    p = _parser("te-compile explain", COMMANDS["explain"])
    p.add_argument("factory", help="MODULE:FACTORY, a function of no arguments returning (model_or_fn, args[, kwargs])")
    p.add_argument("--target", default="auto", choices=["auto", "reference"],
                   help="auto: cuDNN for CUDA sites (others kept); reference: the exact reference kernel, any device")
    p.add_argument("--inner", default="aot_eager", choices=["inductor", "aot_eager", "eager"],
                   help="what compiles the rewritten graph; aot_eager compiles quicker and decides every site as "
                        "inductor does (te_compile.backend and te_compile.compile default to inductor)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (with --code: and the graphs' code)")
    p.add_argument("--code", action="store_true", help="also print the rewritten graphs' code")
    p.add_argument("--mode", default=None, choices=MODES,
                   help="the torch.compile mode the model runs under (reduce-overhead: decide as under CUDA graphs)")
    p.add_argument("--for", dest="for_device", default=None, choices=["cuda"],
                   help="decide every site as on a CUDA GPU, whatever device the model is on (on a machine without "
                        "one: what te_compile would run there, with dtype, support and speed reasons)")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--train", dest="train", action="store_const", const=True, default=None,
                      help="decide as a training step (the model's parameters require grad); only the forward runs")
    step.add_argument("--infer", dest="train", action="store_const", const=False,
                      help="decide as inference (no gradients); without --train / --infer the model's "
                           "requires_grad decides")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="each site's long reason: the evidence and the runs a rule cites")
    return p


def _explain(argv: list[str]) -> int:
    import te_compile

    a = explain_parser().parse_args(argv)
    fn, args, kwargs = _load(a.factory)
    t0 = time.perf_counter()
    print(f"te-compile: compiling {a.factory} (target {a.target}, inner {a.inner}) ...", file=sys.stderr, flush=True)
    report = _user_call(f"te-compile explain: {a.factory}'s model", te_compile.explain, fn, *args, target=a.target,
                        inner=a.inner, mode=a.mode, for_device=a.for_device, train=a.train, **kwargs)
    print(f"te-compile: done in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    if a.json:
        d = report.to_dict()
        if not a.code:
            d.pop("code", None)
        print(json.dumps(d, indent=1))
    else:
        print(report.table(verbose=a.verbose))
        if a.code:
            print(report.code())
    return 0


def _needs_gpu(prog: str) -> None:
    import torch
    if not torch.cuda.is_available():
        raise UserError(f"{prog}: needs a CUDA GPU (torch.cuda.is_available() is False here): it measures "
                        f"kernels on the GPU it runs on")


def tune_parser() -> Parser:
    p = _parser("te-compile tune", COMMANDS["tune"])
    p.add_argument("factory", nargs="?", help="MODULE:FACTORY returning (model_or_fn, args[, kwargs])")
    p.add_argument("--mode", default=None, choices=MODES, help="the torch.compile mode the model runs under")
    p.add_argument("--list", action="store_true", help="list the cached measurements and where they are")
    return p


def _tune(argv: list[str]) -> int:
    from . import tuning
    from .tuning import cache
    from .api.autotune import tune

    a = tune_parser().parse_args(argv)
    if a.list or not a.factory:
        entries = cache.entries()
        print(f"{len(entries)} measurement(s) in {cache.path()}")
        for key, e in sorted(entries.items()):
            ratios = e.get("ratios") or []
            won = f" (cuDNN faster in {sum(r > 1.0 for r in ratios)} of {len(ratios)} rounds)" if ratios else ""
            print(f"  {e.get('site', key)}: {e.get('te_ms', 0):.3f} ms cuDNN vs {e.get('tc_ms', 0):.3f} ms "
                  f"torch.compile{won}")
        return 0
    _needs_gpu("te-compile tune")
    fn, args, kwargs = _load(a.factory, "tune")
    print(f"te-compile tune: {a.factory} on {tuning.platform()['gpu']} (cache {cache.path()})", flush=True)
    _user_call(f"te-compile tune: {a.factory}'s model", tune, fn, *args, mode=a.mode,
               echo=lambda line: print(line, flush=True), **kwargs)
    return 0


def _bench(argv: list[str]) -> int:
    from .cli.benchmark import main as bench_main, parser

    parser().parse_args(argv)  # a usage error first (exit 2), then the GPU
    _needs_gpu("te-compile bench")
    return bench_main(argv)


def _help() -> str:
    width = max(map(len, COMMANDS))
    return "commands:\n" + "\n".join(f"  {c.ljust(width)}  {d}" for c, d in COMMANDS.items())


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = Parser("te-compile", "te_compile: attention on cuDNN for torch.compile",
               epilog=_help() + "\n\nrun 'te-compile COMMAND --help' for a command's options",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of: " + ", ".join(COMMANDS))
    if argv and argv[0] in COMMANDS:  # the command's own parser reads the rest, --help included
        command, rest = argv[0], argv[1:]
    else:
        a, rest = p.parse_known_args(argv)
        command = a.command
    # progress: graph builds and per-site decisions are logged at INFO
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("te_compile").setLevel(logging.INFO if command != "explain" else logging.WARNING)
    from .env import problems

    if problems():  # a usage error: stop (those read at import were named then)
        for why in problems(unreported=True):
            print(f"te-compile: {why}", file=sys.stderr)
        return 2
    show = "--traceback" in rest
    try:
        return _run(command, rest)
    except UserError as e:
        if show and e.cause is not None:
            traceback.print_exception(type(e.cause), e.cause, e.cause.__traceback__)
        print(str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"te-compile {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a failure of te_compile or torch: one line, the trace on request
        if show:
            traceback.print_exc()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"te-compile {command}: {type(e).__name__}" + (f": {msg}" if msg else "")
              + ("" if show else " (--traceback shows where)"), file=sys.stderr)
        return 1


def _run(command: str, rest: list[str]) -> int:
    if command == "demo":
        from .cli.demo import main as demo

        return demo(rest)
    if command == "explain":
        return _explain(rest)
    if command == "tune":
        return _tune(rest)
    return _bench(rest)


if __name__ == "__main__":
    raise SystemExit(main())
