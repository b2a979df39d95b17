"""tools/mutants.py: the docs list its mutants; a run scores killed and surviving mutants, refuses a stale snippet
and leaves the checkout as it was."""

import io
import os

from tools import mutants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_docs_list_the_tools_mutants():
    with open(os.path.join(ROOT, "docs", "contributing.md")) as f:
        text = f.read()
    begin, end = "<!-- mutants:list begin -->\n", "<!-- mutants:list end -->"
    listed = text[text.index(begin) + len(begin): text.index(end)].strip()
    assert listed == mutants.markdown(mutants.MUTANTS), "regenerate with: python -m tools.mutants --markdown"
    assert len(mutants.MUTANTS) >= 25 and len({m.name for m in mutants.MUTANTS}) == len(mutants.MUTANTS)
    assert f"{len(mutants.MUTANTS)} of {len(mutants.MUTANTS)} mutants killed" in text


def test_a_run_scores_kills_and_survivors_and_leaves_the_checkout_alone():
    sel = ("tests/test_alibi.py", "-k", "cudnn_slopes_follow_the_alibi_recipe")
    path = os.path.join(ROOT, "te_compile", "lowering", "alibi.py")
    with open(path) as f:
        before = f.read()
    killed = mutants.Mutant("slopes", "te_compile/lowering/alibi.py", "-8.0 * (h + 1) / n", "-8.0 * h / n", sel, "")
    survives = mutants.Mutant("comment", "te_compile/lowering/alibi.py", "(float32 rounding of the user's formula)",
                              "(float32 rounding)", sel, "")
    stale = mutants.Mutant("stale", "te_compile/lowering/alibi.py", "no such text", "", sel, "")
    out = io.StringIO()
    assert mutants.run([killed, survives, stale], 300, out=out) == 1
    lines = out.getvalue().splitlines()
    assert any(ln.startswith("killed   slopes") for ln in lines)
    assert any(ln.startswith("SURVIVED comment") for ln in lines)
    assert any(ln.startswith("STALE    stale") for ln in lines)
    assert lines[-1].startswith("mutants: 1 of 3 killed (33%), 1 survived, 1 stale"), lines[-1]
    with open(path) as f:
        assert f.read() == before


def test_every_mutant_snippet_is_in_its_file_once():
    """A change that moves a guard's text makes its mutant stale (make mutants then fails): caught here, in make test."""
    assert mutants._check_snippets(ROOT, mutants.MUTANTS) == []
