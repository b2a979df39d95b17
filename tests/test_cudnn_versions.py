"""cuDNN versions: emitted score_mod graphs are served only on checked versions, with a reason naming the
version elsewhere; the emission never hands one tensor to two operands of an op (cuDNN 9.27 crashed on that)."""

from __future__ import annotations

import pytest

from te_compile.reasons import CUDNN_VERSION, category
from tools import fuzz


def test_describe():
    from te_compile.cudnn.versions import describe
    assert describe(91900) == "9.19"
    assert describe(92700) == "9.27"
    assert describe(90102) == "9.1.2"
    assert describe(0) == "unknown"


def test_emitted_graphs_are_served_only_on_checked_versions(monkeypatch):
    from te_compile.cudnn import versions
    monkeypatch.delenv(versions.ENV, raising=False)
    assert versions.emitted_reason(91900) is None
    assert versions.emitted_reason(92801) is None  # 9.28.1, checked with the raw score behind one identity
    assert versions.emitted_reason(92700) is None  # 9.27, checked after the identity fixed its crash
    assert versions.emitted_reason(0) is None  # no cuDNN library loaded
    monkeypatch.setitem(versions.KNOWN, 92900, "ran some emitted graphs into an illegal memory access")
    known = versions.emitted_reason(92900)
    assert "9.29" in known and "illegal memory access" in known and category(known) == CUDNN_VERSION
    new = versions.emitted_reason(93100)
    assert "9.31" in new and "not been checked" in new and category(new) == CUDNN_VERSION
    monkeypatch.setenv(versions.ENV, "serve")
    assert versions.emitted_reason(93100) is None


def test_check_keeps_emitted_sites_on_an_unchecked_version(monkeypatch):
    """The support check refuses an emitted score_mod on an unchecked version, and still serves a built-in mask."""
    import torch
    from te_compile.cudnn import check, versions
    from te_compile.spec import AttentionSpec
    monkeypatch.delenv(versions.ENV, raising=False)
    monkeypatch.setattr(versions, "running", lambda: 93100)
    q = torch.empty(1, 2, 128, 64, dtype=torch.bfloat16, device="meta")
    emitted = _spec_of("score * score")
    assert emitted is not None
    why = check.check(q, q, q, None, emitted, False, False)
    assert why is not None and "9.31" in why and category(why) == CUDNN_VERSION
    native = AttentionSpec(mask="causal")
    assert "9.31" not in str(check.check(q, q, q, None, native, False, False))


def _spec_of(expr: str):
    T = "def score_mod(score, b, h, q_idx, kv_idx):\n    return {}\n"
    c = fuzz.Case(seed=1, B=1, H=2, HKV=2, L=16, S=16, D=8, DV=8, score=T.format(expr))
    _, _, decisions = fuzz.compare(c, "cpu", fuzz._prepare("cpu"))
    return next((d.spec for d in decisions if d.rewrite), None)


@pytest.mark.parametrize("expr", ["score * score", "torch.square(score)", "score ** 3", "torch.tanh(score)",
                                  "score * (score + 1)", "score + (q_idx - q_idx)", "torch.minimum(-score, score)"])
def test_no_op_gets_one_tensor_twice(expr):
    """Every op of the emitted score_mod and bprop has distinct operands (EmitOptions.distinct_operands)."""
    from te_compile.lowering import lower as lowering
    from te_compile.cudnn import emit
    spec = _spec_of(expr)
    assert spec is not None, f"{expr} was not served on the reference target"
    entries = emit.structure(lowering.lower(spec))
    ops = [e for e in entries if len(e) == 3 and isinstance(e[1], tuple) and e[0] != "dtype"]
    assert ops
    for name, operands, _ in ops:
        tensors = [o for o in operands if isinstance(o, tuple)]
        assert len(tensors) == len(set(tensors)), f"{expr}: {name}{operands} gets one tensor twice"


def test_distinct_operands_off_repeats_the_operand():
    """The check above can fail: with the option off, score * score is mul(score, score)."""
    from te_compile.lowering import lower as lowering
    from te_compile.cudnn import emit
    spec = _spec_of("score * score")
    old = lowering.set_options(distinct_operands=False)
    try:
        entries = emit.structure(lowering.lower(spec))
    finally:
        lowering.set_options(**{f: getattr(old, f) for f in ("distinct_operands",)})
    muls = [e[1] for e in entries if len(e) == 3 and e[0] == "mul"]
    assert any(len(ops) == 2 and ops[0] == ops[1] for ops in muls), muls


@pytest.mark.parametrize("expr", ["score ** 3", "torch.maximum(score * 2, score)", "torch.minimum(-score, score)",
                                  "torch.sqrt(torch.abs(torch.maximum((score * 2), score)) + 0.5)",
                                  "torch.tanh(score / 30) * 30", "score * score"])
def test_raw_score_has_one_consumer(expr):
    """cuDNN's score tensor feeds exactly one op, an identity (EmitOptions.score_identity), in the forward and
    the backward transcript, at a ragged length (the padded-tile guard reads the score's shape too)."""
    from te_compile.lowering import lower as lowering
    from te_compile.cudnn import emit
    spec = _spec_of(expr)
    assert spec is not None, f"{expr} was not served on the reference target"
    entries = emit.structure(lowering.lower(spec, (129, 100)))
    users = [e[0] for e in entries if len(e) == 3 and isinstance(e[1], tuple) and ("score",) in e[1]]
    assert users == ["identity"], f"{expr}: the raw score feeds {users}"


def test_score_identity_off_reads_the_raw_score_in_several_ops():
    """The check above can fail: with the option off, score ** 3 reads the raw score in several ops."""
    from te_compile.lowering import lower as lowering
    from te_compile.cudnn import emit
    spec = _spec_of("score ** 3")
    old = lowering.set_options(score_identity=False)
    try:
        entries = emit.structure(lowering.lower(spec, (129, 100)))
    finally:
        lowering.set_options(score_identity=old.score_identity)
    users = [e[0] for e in entries if len(e) == 3 and isinstance(e[1], tuple) and ("score",) in e[1]]
    assert len(users) > 1 and "mul" in users
