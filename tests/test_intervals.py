"""te_compile.lowering.intervals: mask_mods as per-row key intervals, checked element by element against the mask_mod itself
(evaluated by torch over every (b, q, kv)), for the masks people train with and for random compositions."""

import random

import pytest
import torch

from te_compile.lowering import intervals

from te_compile.score import ir
from te_compile.score.expr import Expr
from te_compile.reference import index_grids

P = ir.parse


def _eager(mask: Expr, B: int, L: int, S: int, bufs) -> torch.Tensor:
    grids = {**index_grids(B, 1, L, S, torch.device("cpu")), "inputs": [], "bufs": list(bufs)}
    m = torch.as_tensor(ir.evaluate(mask, grids)).bool()
    while m.dim() < 4:
        m = m.unsqueeze(0)
    return m.expand(B, 1, L, S)[:, 0]


def _check(mask: Expr, B: int, L: int, S: int, bufs=()):
    ep = intervals.endpoints(mask, B, L, S, bufs, torch.device("cpu"))
    sh = intervals.shape(mask)
    assert ep.funcs.shape == (1, sh.nfunc, B * L)
    assert ep.funcs.dtype == torch.int32
    f = ep.funcs[0].long()
    assert bool((f[1:] >= f[:-1]).all()), "endpoints must be nondecreasing per row"
    assert bool(((f >= 0) & (f <= S)).all())
    got = intervals.dense(ep.funcs, B, L, S)
    want = _eager(mask, B, L, S, bufs)
    assert torch.equal(got, want), f"{mask}: {int((got != want).sum())} positions differ"
    return ep


NAMED = {
    "causal": ("(ge q_idx kv_idx)", 1),
    "sliding window": ("(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 7))", 3),
    "sliding window <": ("(and (ge q_idx kv_idx) (lt (sub q_idx kv_idx) 7))", 3),
    "prefix-LM": ("(or (lt kv_idx 5) (ge q_idx kv_idx))", 1),
    "sink + local": ("(and (ge q_idx kv_idx) (or (lt kv_idx 3) (le (sub q_idx kv_idx) 6)))", 3),
    "bottom-right causal": ("(le kv_idx (add q_idx 4))", 1),
    "symmetric window": ("(and (le (sub q_idx kv_idx) 3) (le (sub kv_idx q_idx) 3))", 3),
    "global tokens": ("(or (or (lt kv_idx 2) (lt q_idx 2)) (le (sub q_idx kv_idx) 3))", 3),
    "not causal": ("(not (ge q_idx kv_idx))", 3),
    "kv != q": ("(ne q_idx kv_idx)", 3),
    "all": ("true", 1),
    "kv_idx cancels": ("(le (sub kv_idx kv_idx) (sub q_idx 3))", 1),
}


@pytest.mark.parametrize("name", sorted(NAMED))
@pytest.mark.parametrize("L,S", [(37, 37), (64, 64), (20, 33)])
def test_named_masks_match_the_mask_mod_everywhere(name, L, S):
    text, nfunc = NAMED[name]
    mask = P(text)
    assert intervals.shape(mask).nfunc == nfunc
    _check(mask, 2, L, S)


def _doc_mask(causal: bool, batched: bool) -> Expr:
    idx_q = "(index (buf 0) b q_idx)" if batched else "(index (buf 0) q_idx)"
    idx_kv = "(index (buf 0) b kv_idx)" if batched else "(index (buf 0) kv_idx)"
    e = f"(eq {idx_q} {idx_kv})"
    return P(f"(and {e} (ge q_idx kv_idx))" if causal else e)


def _packing(L: int, n: int, g: torch.Generator) -> torch.Tensor:
    """ids of n contiguous documents (lengths >= 1) over L positions."""
    cuts = (torch.randperm(L - 1, generator=g)[: n - 1] + 1).sort().values.tolist()
    lengths = [b - a for a, b in zip([0] + cuts, cuts + [L])]
    return torch.repeat_interleave(torch.arange(n), torch.tensor(lengths))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("docs", [1, 2, 7, 40])  # one document spanning the row ... every position its own
def test_packed_documents_are_runs_per_row(causal, docs):
    g = torch.Generator().manual_seed(docs)
    B, L = 3, 40
    ids = torch.stack([_packing(L, docs, g) for _ in range(B)])  # a different packing per row
    ids[1] = ids[1] + 100  # ids need not start at 0
    ep = _check(_doc_mask(causal, batched=True), B, L, L, [ids])
    assert bool(ep.valid.all())


def test_a_length_one_document_and_an_unbatched_id_tensor():
    ids = torch.tensor([0, 0, 0, 1, 2, 2, 2, 2, 3, 4, 4])
    ep = _check(_doc_mask(True, batched=False), 2, 11, 11, [ids])
    assert bool(ep.valid.all())


def test_ids_that_are_not_runs_are_flagged_not_trusted():
    ids = torch.tensor([[0, 0, 1, 1, 0, 0, 2, 2], [0, 0, 0, 1, 1, 1, 2, 2]])  # row 0: document 0 comes back
    ep = intervals.endpoints(_doc_mask(True, batched=True), 2, 8, 8, [ids], torch.device("cpu"))
    assert ep.valid.tolist() == [False, True]
    got = intervals.dense(ep.funcs, 2, 8, 8)
    want = _eager(_doc_mask(True, batched=True), 2, 8, 8, [ids])
    assert torch.equal(got[1], want[1])
    assert not torch.equal(got[0], want[0])  # what the flag protects against


#: Hugging Face's packed-sequence mask (transformers.masking_utils: and_masks(causal, packed_sequence_mask_function)
#: through add_offsets_to_mask_function, the cache position's first entry a 0-dim tensor added to q_idx)
_HF_PACKED = P("(and (le kv_idx (add q_idx (buf 1))) "
               "(eq (index (buf 0) b (add q_idx (buf 1))) (index (buf 0) b kv_idx)))")


@pytest.mark.parametrize("L,S,offset", [(40, 40, 0), (8, 40, 32), (1, 40, 39)])  # training; a chunk; one token
def test_hugging_face_packed_sequences_with_the_cache_offset(L, S, offset):
    g = torch.Generator().manual_seed(L)
    ids = torch.stack([_packing(S, n, g) for n in (3, 9)])
    ep = _check(_HF_PACKED, 2, L, S, [ids, torch.tensor(offset)])
    assert bool(ep.valid.all())


def test_document_ids_over_fewer_queries_than_keys_and_swapped_sides():
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 3]])
    ep = _check(P("(eq (index (buf 0) b kv_idx) (index (buf 0) b q_idx))"), 1, 6, 10, [ids])
    assert bool(ep.valid.all())
    ep = _check(P("(eq (index (buf 0) b (add q_idx 2)) (index (buf 0) b (add kv_idx 1)))"), 1, 6, 8,
                [torch.tensor([[5, 0, 0, 0, 1, 1, 2, 2, 2, 3]])])
    assert bool(ep.valid.all())


def test_a_row_whose_position_no_key_reads_is_flagged():
    ids = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2, 3, 3]])  # rows q >= 6 read ids no key (0..5) reads
    ep = intervals.endpoints(P("(eq (index (buf 0) b q_idx) (index (buf 0) b kv_idx))"), 1, 10, 6, [ids],
                             torch.device("cpu"))
    assert ep.valid.tolist() == [False]


def test_padding_by_length_tensor():
    lens = torch.tensor([5, 9, 1])
    mask = P("(and (lt kv_idx (index (buf 0) b)) (ge q_idx kv_idx))")
    _check(mask, 3, 9, 9, [lens])


@pytest.mark.parametrize("text,why", [
    ("(ge h kv_idx)", "head"),
    ("(lt (mul kv_idx 2) q_idx)", "linear"),
    ("(eq (index (buf 0) q_idx) (index (buf 1) kv_idx))", "linear"),
])
def test_masks_without_a_derivation_say_why(text, why):
    with pytest.raises(intervals.NoIntervals, match=why):
        intervals.shape(P(text))


def test_too_many_intervals_are_refused():
    many = "(ne q_idx kv_idx)"
    for _ in range(3):
        many = f"(and {many} (ne (add q_idx 3) kv_idx))"
    with pytest.raises(intervals.NoIntervals, match="at most"):
        intervals.shape(P(many))


_ATOMS = ["(ge q_idx kv_idx)", "(lt kv_idx 4)", "(gt kv_idx 9)", "(le (sub q_idx kv_idx) 5)", "(ge (sub q_idx kv_idx) 2)",
          "(lt (add kv_idx 3) q_idx)", "(eq kv_idx 7)", "(ge q_idx 6)", "(le kv_idx (add q_idx 2))",
          "(ne (sub kv_idx 1) q_idx)", "(ge (neg kv_idx) (neg q_idx))"]


def _random_mask(rng: random.Random, depth: int) -> str:
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(_ATOMS)
    op = rng.choice(["and", "or", "not"])
    if op == "not":
        return f"(not {_random_mask(rng, depth - 1)})"
    return f"({op} {_random_mask(rng, depth - 1)} {_random_mask(rng, depth - 1)})"


def test_random_compositions_match_the_mask_mod():
    """40 random and / or / not trees of the atoms: each one te_compile derives matches the mask_mod everywhere, and
    most are derived (the rest need more intervals than MAX_INTERVALS)."""
    derived = 0
    for seed in range(40):
        mask = P(_random_mask(random.Random(seed), 3))
        try:
            intervals.shape(mask)
        except intervals.NoIntervals as e:
            assert "at most" in str(e)
            continue
        derived += 1
        _check(mask, 1, 23, 19 + seed % 9)
    assert derived >= 25
