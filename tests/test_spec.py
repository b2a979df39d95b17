import pytest

from te_compile.spec import AttentionSpec


def test_key_roundtrip_and_canonical():
    s = AttentionSpec(scale=0.125, mask="causal")
    assert AttentionSpec.from_key(s.key()) == s
    assert s.key() == AttentionSpec(mask="causal", scale=0.125).key()
    assert AttentionSpec(scale=None).scale_for(64) == pytest.approx(0.125)
    assert AttentionSpec(scale=0.3).scale_for(64) == pytest.approx(0.3)


def test_ints_become_floats():
    assert AttentionSpec(scale=1).key() == AttentionSpec(scale=1.0).key()


@pytest.mark.parametrize("kw", [dict(mask="sliding"), dict(impl="triton")])
def test_rejects_unknown_values(kw):
    with pytest.raises(ValueError, match="unknown"):
        AttentionSpec(scale=1.0, **kw)


def test_from_key_rejects_garbage():
    with pytest.raises(ValueError, match="not a te_compile attention spec"):
        AttentionSpec.from_key('{"nope": 1}')


def test_hash_is_cached_equal_and_not_pickled():
    """The spec's hash is computed once (ops look it up on every call) and equals a fresh spec's; a pickled
    spec does not carry it (str hashes differ between processes)."""
    import copy
    import pickle
    a = AttentionSpec(mask="causal", score="(mul score 2.0)", source="flex")
    b = AttentionSpec.from_key(a.key())
    assert hash(a) == hash(b) and {a: 1}[b] == 1
    assert "_hash" in a.__dict__
    c = pickle.loads(pickle.dumps(a))
    assert "_hash" not in c.__dict__ and c == a and hash(c) == hash(a)
    assert copy.deepcopy(a) == a and hash(AttentionSpec(mask="causal")) != hash(AttentionSpec())
