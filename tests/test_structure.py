"""The package's layout rules: no import cycle
between te_compile modules (imports inside functions included), layers that run one way between subpackages and
top-level modules (LAYERS), the passes never import the ops or cuDNN,
no te_compile module imports another's private (``_name``) symbols, no function in te_compile is
longer than 60 lines, and the serve decision's code stays at most half its former size."""

import ast
import pathlib
import re

PKG = pathlib.Path(__file__).resolve().parent.parent / "te_compile"
MAX_LINES = 60


def _module(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _from_imports(path: pathlib.Path):
    """(te_compile module, imported name) for each ``from ... import name`` of a te_compile module in ``path``
    (module level or inside functions)."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = pkg.split(".")
            base = base[: len(base) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        if name.startswith("te_compile"):
            for a in node.names:
                yield name, a.name


def _imports(path: pathlib.Path) -> set[str]:
    """te_compile modules imported anywhere in ``path`` (module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("te_compile"))
    for name, symbol in _from_imports(path):  # `from . import ir` names a module, `from .spec import X` a symbol
        sub = f"{name}.{symbol}"
        path_of = PKG.parent / sub.replace(".", "/")
        out.add(sub if path_of.with_suffix(".py").exists() or (path_of / "__init__.py").exists() else name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {m: {i for i in _imports(p) if i in mods and i != m} for m, p in mods.items()}
    # the package __init__ re-exports the public API: importing it is not a dependency of a submodule
    return {m: {i for i in deps if i != "te_compile"} for m, deps in graph.items()}


def _cycle(graph: dict[str, set[str]]):
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    graph = _graph()
    assert "te_compile.passes.rewrite" in graph and graph["te_compile.passes.rewrite"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_detector_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


#: te_compile's layers, lowest first: a module or subpackage imports only from its own layer or below. Subpackages
#: are one unit each (their modules import each other freely); top-level modules are units of their own.
LAYERS = [
    # the language of a site: expressions, specs, reasons, layouts, the exact math, warnings
    {"score", "spec", "layout", "reasons", "fxcopy", "user_warnings",
     "reference", "env", "counters"},
    {"lowering"},  # what cuDNN computes for a site: its lowering, ALiBi, the prefix-LM split, key intervals
    {"cudnn"},  # what talks to cuDNN
    {"runtime", "passes"},  # the run-time op, the graph passes
    {"tuning"},  # the serve decision: the rule table and measured decisions (the pieces backend uses)
    {"backend", "report"},  # the torch.compile backend
    {"api", "cli", "__main__", "__init__"},  # the user API (explain, tune, model checks) and the CLI
]


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and (PKG / parts[1]).is_dir():
        return parts[1]
    return "__init__" if module == "te_compile" else parts[-1]


def _package_graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        out.setdefault(_unit(m), set()).update(_unit(d) for d in deps if _unit(d) != _unit(m))
    return out


def test_layers_run_one_way_at_package_level():
    """No cycle between units (subpackages and top-level modules), every unit in exactly one layer, and no import
    from a lower layer up to a higher one."""
    graph = _package_graph()
    layer = {u: i for i, units in enumerate(LAYERS) for u in units}
    assert sum(len(u) for u in LAYERS) == len(layer), "a unit is in two layers"
    assert set(graph) == set(layer), f"not in a layer: {set(graph) - set(layer)}; gone: {set(layer) - set(graph)}"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    up = sorted(f"{a} ({layer[a]}) -> {b} ({layer[b]})" for a, deps in graph.items() for b in deps
                if layer[b] > layer[a])
    assert not up, up


def test_the_layer_check_sees_an_import_up():
    assert _cycle({"tuning": {"backend"}, "backend": {"tuning"}}) == ["backend", "tuning", "backend"]
    layer = {u: i for i, units in enumerate(LAYERS) for u in units}
    assert layer["backend"] > layer["tuning"] > layer["cudnn"] > layer["spec"]


def test_passes_never_import_ops_or_cudnn():
    for p in (PKG / "passes").glob("*.py"):
        bad = {i for i in _imports(p) if i in ("te_compile.runtime.ops", "te_compile.runtime.kernels") or i.startswith("te_compile.cudnn")}
        assert not bad, f"{p.name} imports {bad}"


def _long_functions(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_LINES:
                yield f"{path.name}:{node.lineno} {node.name} ({n} lines)"


def test_no_long_functions():
    long = [f for p in sorted(PKG.rglob("*.py")) for f in _long_functions(p)]
    assert not long, long


def test_no_private_imports_between_modules():
    """What one module uses of another is public: a ``_name`` stays inside its module."""
    private = [f"{p.relative_to(PKG.parent)}: from {mod} import {name}"
               for p in sorted(PKG.rglob("*.py")) for mod, name in _from_imports(p) if name.startswith("_")]
    assert not private, private


def _private_attribute_uses(path: pathlib.Path):
    """``module._name`` where ``module`` is a te_compile module that ``path`` imported as a name
    (``from te_compile.cudnn import graphs`` / ``from . import graphs`` / ``import te_compile.x as m``)."""
    tree = ast.parse(path.read_text())
    modules = set()
    for mod, name in _from_imports(path):
        where = PKG.parent.joinpath(*mod.split("."), name)
        if where.with_suffix(".py").exists() or (where / "__init__.py").exists():
            modules.add(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name.startswith("te_compile") and a.asname)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            yield f"{path.relative_to(PKG.parent)}:{node.lineno} {node.value.id}.{node.attr}"


def test_no_private_attributes_of_other_modules():
    """Nor does a module reach into another's ``_name`` through the module object (``graphs._new_graph``)."""
    bad = [u for p in sorted(PKG.rglob("*.py")) for u in _private_attribute_uses(p)]
    assert not bad, bad


#: measurements belong in docs/cudnn-notes.md and docs/benchmarks.md; comments keep the why. rules.py's
#: docstrings name what its rules were measured on (they are the rules' data), benchmark.py prints timings
_TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|µs|us)\b|\bH[12]00\b")
_TIMING_EXEMPT = {"rules.py", "benchmark.py"}


def _comment_lines(path: pathlib.Path):
    """(line number, text) of every comment and docstring line of ``path``."""
    import io
    import tokenize
    src = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        elif tok.type == tokenize.STRING and tok.string.lstrip("rbuf").startswith(('"""', "'''")):
            for i, line in enumerate(tok.string.splitlines()):
                yield tok.start[0] + i, line


def test_no_timings_or_cards_in_code_comments():
    bad = [f"{p.relative_to(PKG)}:{n}: {line.strip()}" for p in sorted(PKG.rglob("*.py"))
           if str(p.relative_to(PKG)) not in _TIMING_EXEMPT
           for n, line in _comment_lines(p) if _TIMING.search(line)]
    assert not bad, bad


def test_the_serve_decision_code_stays_small():
    """The default decision is a rule table and measurement on request: rules, tuning/, api/autotune, api/model_check and
    backend._decide together stay at most half of the 1,879 lines the cost model, its refits and replay took."""
    files = [PKG / "api" / "autotune.py", PKG / "api" / "model_check.py", *sorted((PKG / "tuning").glob("*.py"))]
    # a line that only gives the report's one-line wording (a rule's ``short``) is not decision code
    lines = sum(1 for f in files for ln in f.read_text().splitlines() if not ln.strip().startswith(("short=", "short:")))
    backend = ast.parse((PKG / "backend.py").read_text())
    decide = next(n for n in backend.body if isinstance(n, ast.FunctionDef) and n.name == "_decide")
    lines += decide.end_lineno - decide.lineno + 1
    assert lines <= 1879 // 2, f"{lines} lines of decision code"


def test_te_compile_variables_are_read_through_env_only():
    """te_compile's environment variables are read in one place (te_compile.env: what each accepts, a warning for a
    value it does not): no other module reads a ``TE_COMPILE_*`` variable, or a name bound to one, from os.environ."""
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "env.py" and path.parent == PKG:
            continue
        text = path.read_text()
        names = set(re.findall(r'^(\w+) = "TE_COMPILE_\w+"', text, re.M))
        for m in re.finditer(r"(?:os\.environ(?:\.get)?|os\.getenv)\s*[\[(]\s*([^,\])]+)", text):
            arg = m.group(1).strip()
            if "TE_COMPILE_" in arg or arg in names:
                offenders.append(f"{path.relative_to(PKG.parent)}: {m.group(0)}")
    assert not offenders, offenders


def test_every_import_of_a_te_compile_module_resolves():
    """Every ``from <te_compile module> import name`` anywhere in te_compile (inside functions too: the GPU-only call
    paths import lazily, and CPU tests never run them) names a module or an attribute that exists."""
    import importlib
    import importlib.util

    missing = []
    for path in sorted(PKG.rglob("*.py")):
        for module, name in _from_imports(path):
            spec = importlib.util.find_spec(module)
            if spec is None:
                missing.append(f"{_module(path)}: no module {module}")
                continue
            if name == "*" or (spec.submodule_search_locations is not None
                               and importlib.util.find_spec(f"{module}.{name}") is not None):
                continue
            if not hasattr(importlib.import_module(module), name):
                missing.append(f"{_module(path)}: {module} has no {name}")
    assert not missing, missing
