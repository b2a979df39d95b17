"""docs/ follows the code: the feature tables list exactly the tested cases, every reason is documented; the
pages a user reads name no work history, link only to files in the repository, show generated headline numbers
and only commands that a test runs (or that say they need a GPU)."""

import glob
import os
import re

import pytest
import torch
import torch.nn.functional as F

import te_compile
from forms import FORMS

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "README.md")


def _doc() -> str:
    with open(DOCS) as f:
        return f.read()


def _listed(prefix: str, text: str) -> set[str]:
    start = text.index(prefix)
    para = text[start: text.index("\n\n", start)]
    return set(re.findall(r"`([A-Za-z0-9_]+)`", para.split(":", 1)[1]))


def test_sdpa_feature_list_matches_the_tested_forms():
    assert _listed("Checked cases", _doc()) == {f.name for f in FORMS}


def test_flex_feature_list_matches_the_tested_mods():
    import test_flex
    doc = _doc()
    para = doc[doc.index("Checked score_mods"):]
    para = para[: para.index("\n\n")]
    scores, masks = para.split("mask_mods:")
    assert set(re.findall(r"`([A-Za-z0-9_]+)`", scores.split(":", 1)[1])) == set(test_flex.SCORE_MODS)
    assert set(re.findall(r"`([A-Za-z0-9_]+)`", masks)) == set(test_flex.MASK_MODS)


def test_every_kept_reason_seen_in_tests_is_documented():
    q = torch.randn(1, 2, 8, 8)
    reasons = []
    for fn, target in [
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1), "reference"),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(8, 8), is_causal=True),
         "reference"),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "auto"),
        (lambda q, k, v: F.scaled_dot_product_attention(q[0], k[0], v[0]), "reference"),
    ]:
        reasons += [d.reason for d in te_compile.explain(fn, q, q, q, target=target).decisions]
    doc = re.sub(r"\d+", "N", _doc())
    assert len(reasons) == 4
    for r in reasons:
        head = re.sub(r"\d+", "N", re.split(r"[=(:]", r)[0].strip())
        assert head in doc, r


# --------------------------------------------------------------------------- the docs a user reads

ROOT = os.path.dirname(os.path.dirname(DOCS))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


# the history of the work, not something a user can act on: rounds of work, issue numbers, paths outside the
# repository, the machinery the project is developed with
_HISTORY = re.compile(r"""
    \b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|that|last|next|previous|same)
      \s+(?:session|round)s?\b
  | \bsessions?\b
  | \bissues?\s*(?:\#\s*)?\d+
  | \bissues?\s+"
  | (?<![\w&/])\#\d+\b
  | \.\./shared
  | \b\d+-minute\ calls?\b | \bcall'?s\ limit\b          # the limits of the machines the project is developed on
  | \bstored\ (?:PyTorch\ )?source\b | \bat\ commit\ [0-9a-f]{7,}\b | \bsearch\ index
""", re.I | re.X)


def test_docs_name_no_work_rounds_issues_or_outside_paths():
    bad = [f"{page}:{i}: {line.strip()[:120]}" for page in PAGES
           for i, line in enumerate(_read(page).splitlines(), 1) if _HISTORY.search(line)]
    assert not bad, "\n".join(bad)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links inside them are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def _anchors(rel: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", _read(rel), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", text, flags=re.M)}


def test_relative_links_resolve_inside_the_repository():
    bad = []
    for page in PAGES:
        here = os.path.dirname(os.path.join(ROOT, page))
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(_read(page))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file here
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, page)
            if os.path.commonpath([full, ROOT]) != ROOT or not os.path.exists(full):
                bad.append(f"{page}: ({target}): no such file in the repository")
            elif anchor and full.endswith(".md") and anchor not in _anchors(os.path.relpath(full, ROOT)):
                bad.append(f"{page}: ({target}): no heading with that anchor")
    assert not bad, "\n".join(bad)


def test_repository_paths_named_in_the_docs_exist():
    bad = []
    for page in PAGES:
        for i, line in enumerate(_read(page).splitlines(), 1):
            for path in re.findall(r"(?<![\w./-])((?:bench|tests|te_compile|docs)/[\w./{},-]*[\w}])", line):
                path = path.split("::")[0]
                if "{" not in path and not os.path.exists(os.path.join(ROOT, path)):
                    bad.append(f"{page}:{i}: {path}")
    assert not bad, "\n".join(bad)


def test_every_benchmark_json_is_named_in_benchmarks_md():
    """benchmarks.md names the runs it shows, cudnn-notes.md the runs its facts rest on, history.md superseded runs."""
    named = "".join(_read(os.path.join("docs", page)) for page in ("benchmarks.md", "cudnn-notes.md", "history.md"))
    data = sorted(os.listdir(os.path.join(ROOT, "docs", "data")))
    assert data and not [f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".json")]
    assert [f for f in data if f.endswith(".json") and f not in named] == []


#: pages that state current facts stay short enough to read: what a later run supersedes goes to docs/history.md
_MAX_LINES = {"docs/cudnn-notes.md": 600, "docs/benchmarks.md": 400}


@pytest.mark.parametrize("page", sorted(_MAX_LINES))
def test_fact_pages_stay_short(page):
    lines = len(_read(page).splitlines())
    assert lines < _MAX_LINES[page], f"{page}: {lines} lines (< {_MAX_LINES[page]}): move superseded runs to docs/history.md"


def _tables():
    import importlib.util
    spec = importlib.util.spec_from_file_location("docs_tables", os.path.join(ROOT, "docs", "tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_headline_table_is_generated_from_its_json():
    tables = _tables()
    tables.check()  # python docs/tables.py --check
    for page in tables.TARGETS:
        assert "<!-- table:flex-headline begin -->" in _read(page), page


def test_readme_is_short_and_states_figures_only_in_its_generated_table():
    tables = _tables()
    readme = _read("README.md")
    assert len(readme.splitlines()) < 80
    assert tables.readme_numbers() == []
    begin, end = tables._markers(tables.README_NAME)
    table = readme[readme.index(begin):readme.index(end)]
    assert len(re.findall(r"\*\*[^*]*\d\.\d+x[^*]*\*\*", table)) == 1  # one headline figure
    # what the README says about installing is what make does
    assert "make demo TORCH_PIN=" in readme and "--index-url https://download.pytorch.org/whl/cpu" in readme
    assert "pip install --no-deps 'nvidia-cudnn-frontend==1.32'" in readme
    assert "--no-deps" in _read("Makefile") and "nvidia-cudnn-frontend==1.32" in _read("Makefile")


def test_readme_numbers_check_finds_a_figure_outside_the_table(monkeypatch):
    tables = _tables()
    real = open
    fake = _read("README.md").replace("## Use", "te_compile is 9.9x faster.\n\n## Use")

    def opened(path, *a, **k):
        if os.path.abspath(path) == os.path.join(ROOT, "README.md"):
            import io
            return io.StringIO(fake)
        return real(path, *a, **k)
    monkeypatch.setattr("builtins.open", opened)
    assert tables.readme_numbers() == ["README.md: '9.9' outside the generated table (figures belong in it or "
                                       "docs/benchmarks.md)"]


# README commands a CPU can run -> the tests that run them (reused, not run again here). Each test module must
# name the subcommand and every flag of the README's command.
_RUN_BY = {
    "demo": "test_demo_output.py::test_demo_prints_one_report_and_no_warnings",
    "explain": "test_cli_and_options.py::test_installed_script_finds_a_module_in_the_current_folder",
    "explain --json": "test_cli_and_options.py::test_cli_explain_table_and_json",
    "explain --for": "test_explain_for_device.py::test_the_command_line",
}


def _readme_commands() -> list[tuple[str, str, list[str]]]:
    """(line, subcommand, flags) for every `te-compile SUB ...` / `python -m te_compile SUB ...` in README.md."""
    out = []
    for line in _read("README.md").splitlines():
        for m in re.finditer(r"(?:te-compile|python3? -m te_compile)[ \t]+(demo|explain|bench)\b([^#`\n]*)", line):
            out.append((line, m.group(1), re.findall(r"(?<!\S)--?[a-z][\w-]*", m.group(2))))
    return out


def test_readme_commands_are_tested_or_marked_gpu_only(capsys):
    from te_compile.__main__ import main

    commands = _readme_commands()
    assert {sub for _, sub, _ in commands} == {"demo", "explain", "bench"}, commands
    for line, sub, flags in commands:
        with pytest.raises(SystemExit):
            main([sub, "--help"])
        usage = capsys.readouterr().out
        assert all(f in usage for f in flags), (line, flags)  # every flag shown exists
        if re.search(r"\bneeds (?:a )?(?:CUDA )?GPU\b|\bneeds CUDA\b", line):
            continue  # says it needs a GPU
        key = " ".join([sub] + sorted(flags))
        assert key in _RUN_BY, f"README command not run by any test: {line.strip()}"
        module, test = _RUN_BY[key].split("::")
        source = _read(os.path.join("tests", module))
        assert f"def {test}(" in source, _RUN_BY[key]
        assert all(f'"{w}"' in source for w in [sub] + flags), (_RUN_BY[key], sub, flags)


# history in code: comments, docstrings and help say what is, not which piece of work made it
_CODE_HISTORY = re.compile(r"""
    \bissues?\s*(?:\#\s*)?\d+
  | \bissues?\s+"
  | (?<![\w&/])\#\d+\b
  | \.\./shared
  | \brestores?\ the\ old\b
  | \bas\ of\ \d{4}-\d\d-\d\d
""", re.I | re.X)


def test_code_names_no_issues_or_work_history():
    files = [p for d in ("te_compile", "bench", "tests", "tools", "docs") for p in glob.glob(os.path.join(ROOT, d, "**", "*.py"),
                                                                              recursive=True)]
    bad = [f"{os.path.relpath(p, ROOT)}:{i}: {line.strip()[:120]}" for p in sorted(files)
           for i, line in enumerate(_read(os.path.relpath(p, ROOT)).splitlines(), 1)
           if _CODE_HISTORY.search(line) and "_CODE_HISTORY" not in line]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("line", ["the suite in 10-minute calls", "ran past a 10-minute call's limit",
                                  "the stored PyTorch source at commit 09b101c5", "found in the search index"])
def test_the_history_check_finds_development_machinery(line):
    assert _HISTORY.search(line), line
