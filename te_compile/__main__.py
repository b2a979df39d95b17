"""Command line: ``python -m te_compile`` (also installed as ``te-compile``).

    te-compile demo [--device cpu]                  compile a small GPT, print the site report
    te-compile explain MODULE:FACTORY [--json]      report on your own model (see below)
    te-compile tune MODULE:FACTORY [--list]         measure the model's sites on this GPU, fill the cache
    te-compile calibrate SWEEP.json... [--out F]    refit the cost model from bench/sweep.py files (one GPU)
    te-compile bench [--suite sdpa|flex|all] ...    the GPU benchmark (needs CUDA)

``explain`` takes ``MODULE:FACTORY`` where FACTORY is a callable of no arguments that returns
``(model_or_fn, args)`` or ``(model_or_fn, args, kwargs)``, e.g. ``te_compile.demo:example``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from typing import Optional


def _load(spec: str):
    if ":" not in spec:
        raise SystemExit(f"te-compile explain: expected MODULE:FACTORY, got {spec!r}")
    mod_name, attr = spec.split(":", 1)
    if "" not in sys.path and os.getcwd() not in sys.path:
        # the installed `te-compile` script does not put the current folder on sys.path (`python -m` does);
        # users point it at their own module in the folder they are in
        sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"te-compile explain: cannot load {spec!r}: {e}") from None
    made = obj()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise SystemExit(f"te-compile explain: {spec} must return (model_or_fn, args[, kwargs])")
    fn, args = made[0], made[1]
    if not callable(fn):
        raise SystemExit(f"te-compile explain: {spec} returned {type(fn).__name__} as the model; expected a module "
                         f"or a function: return (model_or_fn, args[, kwargs])")
    if not isinstance(args, (tuple, list)):
        raise SystemExit(f"te-compile explain: {spec} returned {type(args).__name__} as the args; expected a tuple "
                         f"of example inputs, e.g. (model, (x,)): return (model_or_fn, args[, kwargs])")
    kwargs = made[2] if len(made) == 3 else {}
    if not isinstance(kwargs, dict):
        raise SystemExit(f"te-compile explain: {spec} returned {type(kwargs).__name__} as the kwargs; expected a "
                         f"dict: return (model_or_fn, args, kwargs)")
    return fn, tuple(args), dict(kwargs)


def _explain(argv: list[str]) -> int:
    import te_compile

    p = argparse.ArgumentParser(prog="te-compile explain", description="report every attention site of a model")
    p.add_argument("factory", help="MODULE:FACTORY returning (model_or_fn, args[, kwargs])")
    p.add_argument("--target", default="auto", choices=["auto", "reference"])
    p.add_argument("--inner", default="aot_eager", choices=["inductor", "aot_eager", "eager"])
    p.add_argument("--json", action="store_true", help="print report.to_dict() as JSON")
    p.add_argument("--code", action="store_true", help="also print the rewritten graph code")
    p.add_argument("--mode", default=None, help="the torch.compile mode the model runs under (e.g. reduce-overhead: "
                   "decide as under CUDA graphs)")
    a = p.parse_args(argv)
    fn, args, kwargs = _load(a.factory)
    t0 = time.perf_counter()
    print(f"te-compile: compiling {a.factory} (target {a.target}, inner {a.inner}) ...", file=sys.stderr, flush=True)
    report = te_compile.explain(fn, *args, target=a.target, inner=a.inner, mode=a.mode, **kwargs)
    print(f"te-compile: done in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report)
        if a.code:
            print(report.code())
    return 0


def _tune(argv: list[str]) -> int:
    from . import tuning
    from .tuning import cache
    from .tuning.tune import tune

    p = argparse.ArgumentParser(prog="te-compile tune", description="measure each attention site of a model on "
                                "this GPU (te_compile's cuDNN op vs what torch.compile runs) and cache the results; "
                                "later compiles decide from the cache")
    p.add_argument("factory", nargs="?", help="MODULE:FACTORY returning (model_or_fn, args[, kwargs])")
    p.add_argument("--mode", default=None, help="the torch.compile mode the model runs under")
    p.add_argument("--list", action="store_true", help="list the cached measurements and where they are")
    a = p.parse_args(argv)
    if a.list or not a.factory:
        entries = cache.entries()
        print(f"{len(entries)} measurement(s) in {cache.path()}")
        for key, e in sorted(entries.items()):
            ratios = e.get("ratios") or []
            won = f" (cuDNN faster in {sum(r > 1.0 for r in ratios)} of {len(ratios)} rounds)" if ratios else ""
            print(f"  {e.get('site', key)}: {e.get('te_ms', 0):.3f} ms cuDNN vs {e.get('tc_ms', 0):.3f} ms "
                  f"torch.compile{won}")
        return 0
    fn, args, kwargs = _load(a.factory)
    print(f"te-compile tune: {a.factory} on {tuning.platform()['gpu']} (cache {cache.path()})", flush=True)
    tune(fn, *args, mode=a.mode, echo=lambda line: print(line, flush=True), **kwargs)
    return 0


def _bench(argv: list[str]) -> int:
    from .benchmark import main as bench_main

    return bench_main(argv)


COMMANDS = ("demo", "explain", "tune", "calibrate", "bench")


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="te-compile", description="te_compile: attention on cuDNN for torch.compile",
                                epilog="run 'te-compile COMMAND --help' for a command's options")
    p.add_argument("command", choices=COMMANDS)
    if argv and argv[0] in COMMANDS:  # the command's own parser reads the rest, --help included
        command, rest = argv[0], argv[1:]
    else:
        a, rest = p.parse_known_args(argv)
        command = a.command
    a = argparse.Namespace(command=command)
    # progress: graph builds and per-site decisions are logged at INFO
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("te_compile").setLevel(logging.INFO if a.command != "explain" else logging.WARNING)
    if a.command == "demo":
        from .demo import main as demo

        return demo(rest)
    if a.command == "explain":
        return _explain(rest)
    if a.command == "tune":
        return _tune(rest)
    if a.command == "calibrate":
        from .cudnn.refit import main as calibrate

        return calibrate(rest)
    return _bench(rest)


if __name__ == "__main__":
    raise SystemExit(main())
