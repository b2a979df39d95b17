"""flex_attention through te_compile (reference target) equals eager flex: out, lse, grads (of a loss on out and lse)."""

import math

import expecttest
import pytest
import torch
import torch.nn.attention.flex_attention as fa
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

import te_compile
from te_compile.passes import flex as flex_pass

B, H, L, D = 2, 4, 24, 8


@pytest.fixture(autouse=True)
def _cpu_flex_with_grad(monkeypatch):
    # eager/compiled flex refuse CPU inputs that require grad; the math path itself is fine
    monkeypatch.setattr(fa, "_validate_device", lambda *a, **k: None)


SLOPES = torch.rand(H) + 0.1
HEAD_SCALE = torch.rand(H) + 0.5

SCORE_MODS = {
    "none": None,
    "softcap": lambda s, b, h, q, kv: 20.0 * torch.tanh(s / 20.0),
    "rel_bias": lambda s, b, h, q, kv: s + (q - kv) * 0.1,
    "alibi_from_h": lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / H)) * (kv - q),
    "alibi_captured": lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q),
    "head_scale_captured": lambda s, b, h, q, kv: s * HEAD_SCALE[h],
    "trig": lambda s, b, h, q, kv: torch.sin(s) + torch.cos(s / 3),
    "times_two": lambda s, b, h, q, kv: s * 2,  # linear in score: folded into the softmax scale
    "one_minus": lambda s, b, h, q, kv: 1 - 0.1 * s,
}
MASK_MODS = {
    "none": None,
    "causal": lambda b, h, q, kv: q >= kv,
    "sliding": lambda b, h, q, kv: (q >= kv) & (q - kv <= 5),
    "inverse_causal": lambda b, h, q, kv: q <= kv,
}
CASES = [(s, m) for s in SCORE_MODS for m in ("none", "causal")] + [
    ("softcap", "sliding"), ("none", "sliding"), ("rel_bias", "inverse_causal"), ("alibi_captured", "sliding")]


def _fn(score_name, mask_name, S=L, return_lse=True, gqa=False, block=16):
    mm = MASK_MODS[mask_name]
    bm = create_block_mask(mm, 1, 1, L, S, device="cpu", BLOCK_SIZE=block) if mm else None

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=SCORE_MODS[score_name], block_mask=bm,
                              return_lse=return_lse, enable_gqa=gqa)
    return fn


def _inputs(S=L, hk=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, n, D, generator=g, dtype=torch.float64).requires_grad_()
            for h, n in ((H, L), (hk, S), (hk, S))]


def _run(fn, args):
    args = [a.detach().requires_grad_() for a in args]
    out, lse = fn(*args)
    g = torch.Generator().manual_seed(1)
    dout = torch.randn(out.shape, generator=g, dtype=out.dtype)
    dlse = torch.randn(lse.shape, generator=g, dtype=lse.dtype)
    # lse is in the loss too (its gradient joins the backward's dS); fully masked rows' -inf lse contribute nothing
    ((out * dout).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse).sum()).backward()
    return out.detach(), lse.detach(), [a.grad for a in args]


def _compare(fn, args, tol=1e-7):
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"), fullgraph=True)
    got = _run(compiled, args)
    want = _run(fn, args)
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1], want[1], rtol=tol, atol=tol)
    for a, b in zip(got[2], want[2]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("score,mask", CASES, ids=[f"{s}-{m}" for s, m in CASES])
def test_flex_matches_eager(score, mask):
    fn = _fn(score, mask)
    report = te_compile.explain(fn, *[a.detach() for a in _inputs()], target="reference")
    assert [d.runs_on for d in report.decisions] == ["reference"], str(report)
    _compare(fn, _inputs())


def test_gqa_and_cross_lengths():
    _compare(_fn("softcap", "causal", S=40, gqa=True), _inputs(S=40, hk=2))


def test_out_only_and_default_block_mask():
    fn = _fn("alibi_from_h", "none", return_lse=False)
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    args = _inputs()
    torch.testing.assert_close(compiled(*args), fn(*args))


def test_fully_masked_rows_give_zero_and_minus_inf_lse():
    bm = create_block_mask(lambda b, h, q, kv: (q >= kv) & (q != 3), 1, 1, L, L, device="cpu", BLOCK_SIZE=8)

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True)
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    out, lse = compiled(*[a.detach() for a in _inputs()])
    assert torch.all(out[:, :, 3] == 0) and torch.all(lse[:, :, 3] == float("-inf"))
    _compare(fn, _inputs())


def _reasons(fn, *args):
    return [(d.runs_on, d.reason) for d in te_compile.explain(fn, *args, target="reference").decisions]


def test_non_additive_gather_is_kept():
    table = torch.randn(2 * L - 1)
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s * table[q_ - kv + L - 1])  # noqa: E731
    ((target, why),) = _reasons(fn, *[a.detach() for a in _inputs()])
    assert target == "kept" and "gather" in why and "not score-independent-additive" in why


@pytest.mark.parametrize("learned", [True, False])
def test_relative_position_table_becomes_a_bias(learned):
    """score + table[h, q - kv] (T5 / ALiBi-table style): f = score runs in the kernel, the
    gather is materialized as a bias, and the table gets its gradient through the gather."""
    table = (torch.randn(H, 2 * L - 1, dtype=torch.float64) * 0.5).requires_grad_(learned)
    bm = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cpu", BLOCK_SIZE=8)

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True,
                              score_mod=lambda s, b, h, q_, kv: 20.0 * torch.tanh(s / 20.0) + table[h, q_ - kv + L - 1])
    report = te_compile.explain(fn, *_inputs(), target="reference")
    (d,) = report.decisions
    assert d.runs_on == "reference" and d.dbias_note == ("yes (table needs grad)" if learned else "no (table frozen)")
    assert "materialize_bias" in report.code()
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    got = _run(compiled, _inputs())
    table_grad = table.grad.clone() if learned else None
    if learned:
        table.grad = None
    want = _run(fn, _inputs())
    for a, b in zip(got[:2] + tuple(got[2]), want[:2] + tuple(want[2])):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-7)
    if learned:
        torch.testing.assert_close(table_grad, table.grad, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("learned", [True, False])
def test_a_learned_tables_bias_stays_float32(learned):
    """The gathered bias of a learned table is float32 next to bf16 q (rounded to bf16 it put the table's gradient
    past tolerance on the GPU); a frozen table's is in q's dtype (half the memory traffic, no gradient to lose)."""
    table = (torch.randn(H, 2 * L - 1) * 0.5).requires_grad_(learned)
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + table[h, q_ - kv + L - 1])  # noqa: E731
    seen = []
    real = flex_pass.materialize_bias

    def spy(*a, **kw):
        bias, shift = real(*a, **kw)
        seen.append(bias.dtype)
        return bias, shift
    flex_pass.materialize_bias = spy
    try:
        compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
        q, k, v = (t.detach().bfloat16().requires_grad_(True) for t in _inputs())
        out = compiled(q, k, v)
        out.float().sum().backward()
    finally:
        flex_pass.materialize_bias = real
    assert seen and set(seen) == {torch.float32 if learned else torch.bfloat16}
    assert (table.grad is not None) == learned and (not learned or table.grad.dtype == torch.float32)


def test_a_large_gathered_term_keeps_its_precision_in_bf16():
    """The bias is in q's dtype; a gathered term with a large per-row part (``max(T[b], q_idx + 7)`` reaches
    ~70 here) rounded to bf16 lost the table's detail (GPU fuzzer: out 27% off). Each bias row is shifted by
    its top first, and the lse gets the shift back: out and lse match eager's float32 math."""
    n = 64
    g = torch.Generator().manual_seed(3)
    t1 = torch.randn(H, 2 * n - 1, generator=g)
    t2 = torch.randint(0, 8, (B,), generator=g)

    def fn(q, k, v):
        return flex_attention(q, k, v, return_lse=True, score_mod=lambda s, b, h, q_, kv: torch.where(
            s >= 0.5, s, s * 0.5) + t1[h, q_ - kv + n - 1] + torch.maximum(t2[b], q_ + 7) * 1)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
    want_out, want_lse = fn(q, k, v)  # eager, float32
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    out, lse = compiled(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert "materialize_bias" in te_compile.explain(fn, q, k, v, target="reference").code()
    bf16_step = 2.0 ** -8
    assert (out.float() - want_out).abs().max() < 4 * bf16_step * want_out.abs().max()
    assert (lse.float() - want_lse).abs().max() < 4 * bf16_step * want_lse.abs().max()


def test_a_gathered_term_under_a_mask_keeps_its_precision_in_bf16():
    """Each bias row is shifted by its largest entry over all keys; under a mask that entry can be a hidden key and
    the visible ones sit far below it (``score + T[kv_idx]``, T rising to 25, causal: row 0 sees only T[0]), where
    bf16 rounds in steps that move the softmax (7x eager bf16's error before such a bias stayed float32). te_compile
    in bf16 is as close to float64 as eager flex in bf16 is."""
    n = 256
    table = torch.arange(n, dtype=torch.float32) * 0.1
    bm = create_block_mask(lambda b, h, q_, kv: q_ >= kv, None, None, n, n, device="cpu")

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + table[kv], block_mask=bm)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g, dtype=torch.float64) for _ in range(3))
    want = fn(q, k, v)
    low = [t.bfloat16() for t in (q, k, v)]
    assert "materialize_bias" in te_compile.explain(fn, *low, target="reference").code()
    got = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))(*low)

    def err(a):
        return float((a.double() - want).abs().max() / want.abs().max())
    assert err(got) < 2 * err(fn(*low)), (err(got), err(fn(*low)))


def test_captured_tensor_that_needs_grad_is_kept():
    w = torch.rand(H, requires_grad=True)
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s * w[h])  # noqa: E731
    ((target, why),) = _reasons(fn, *_inputs())
    assert target == "kept" and "requires grad" in why


def test_hand_built_block_mask_is_kept():
    # one kv block per query block, noop mask_mod: compiled flex attends the listed blocks only
    nq = L // 8
    kv_num = torch.ones(1, 1, nq, dtype=torch.int32)
    kv_idx = torch.zeros(1, 1, nq, nq, dtype=torch.int32)
    bm = BlockMask.from_kv_blocks(kv_num, kv_idx, BLOCK_SIZE=8)

    def fn(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm)
    ((target, why),) = _reasons(fn, *[a.detach() for a in _inputs()], bm)
    assert target == "kept" and "not built by create_block_mask" in why


def test_a_different_block_mask_at_run_time_is_refused():
    good = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cpu", BLOCK_SIZE=8)

    def fn(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm)
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    args = [a.detach() for a in _inputs()]
    torch.testing.assert_close(compiled(*args, good), fn(*args, good))
    # same tensors' shapes, different content, same mask_mod: only the run-time check can see it
    kv_num = good.kv_num_blocks.clone()
    kv_num[..., -1] = 0
    bad = BlockMask.from_kv_blocks(kv_num, good.kv_indices.clone(), good.full_kv_num_blocks.clone(),
                                   good.full_kv_indices.clone(), BLOCK_SIZE=8, mask_mod=good.mask_mod)
    with pytest.raises(RuntimeError, match="not built by create_block_mask"):
        compiled(*args, bad)


class TestFlexGolden(expecttest.TestCase):
    def test_rewritten_graph(self):
        fn = _fn("alibi_captured", "causal")
        report = te_compile.explain(fn, *[a.detach().float() for a in _inputs()], target="reference")
        self.assertExpectedInline(str(report).splitlines()[0], """te_compile: 1 attention site(s) in 1 graph(s): 0 on cuDNN, 1 on the reference kernel, 0 kept""")
        code = "\n".join(ln for ln in report.code().splitlines() if "te_compile" in ln or "mul" in ln)
        self.assertExpectedInline(code, """\
    bh_input = te_compile_passes_inserted_bh_input(l_q_, '(index (buf 0) h)', g_slopes_);  g_slopes_ = None
    attn_fwd_default = torch.ops.te_compile.attn_fwd.default(l_q_, l_k_, l_v_, None, [bh_input, l_bm_kv_num_blocks, l_bm_kv_indices, l_bm_full_kv_num_blocks, l_bm_full_kv_indices], '{"block_full":true,"block_kv":16,"block_q":16,"impl":"reference","mask":"none","mask_mod":"(ge q_idx kv_idx)","n_inputs":1,"scale":0.35355339059327373,"score":"(add score (mul (in 0) (sub kv_idx q_idx)))","source":"flex"}');  l_q_ = l_k_ = l_v_ = bh_input = l_bm_kv_num_blocks = l_bm_kv_indices = l_bm_full_kv_num_blocks = l_bm_full_kv_indices = None
    mul_1 = getitem_4 * 1.4426950408889634;  getitem_4 = None
    lse_scaled = mul_1 * 0.6931471805599453;  mul_1 = None""")


def test_lse_is_log2_at_the_hop_boundary():
    # flex's front end multiplies the HOP's lse by ln 2; the rewrite hands it lse / ln 2
    fn = _fn("none", "causal")
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    args = [a.detach() for a in _inputs()]
    _, lse = compiled(*args)
    s = (args[0] @ args[1].transpose(-1, -2)) / math.sqrt(D)
    s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))


def test_a_block_mask_check_begun_answers_when_finished():
    """The op's check in two halves (its device work queued, then the answer): a BlockMask create_block_mask built
    passes and is remembered only once its answer is read; an edited one is refused at finish(), not at begin, and
    the refusal is remembered too."""
    from te_compile.runtime import blockmask
    from tools import fuzz_blockmask

    bm = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cpu", BLOCK_SIZE=8)
    fn = lambda q, k, v, bm: flex_attention(q, k, v, block_mask=bm)  # noqa: E731
    q, k, v = (a.detach() for a in _inputs())
    spec = te_compile.explain(fn, q, k, v, bm, target="reference").decisions[0].spec
    assert spec.block_q == 8 and spec.block_full
    bm = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cpu", BLOCK_SIZE=8)  # one not checked yet

    def blocks(m):
        return [m.kv_num_blocks, m.kv_indices, m.full_kv_num_blocks, m.full_kv_indices]

    before = blockmask.verified.checks
    check = blockmask.begin_call(spec, q, k, [], blocks(bm))
    assert blockmask.verified.checks == before + 1
    again = blockmask.begin_call(spec, q, k, [], blocks(bm))  # not answered yet: not remembered yet
    assert blockmask.verified.checks == before + 2
    assert check.finish() is True and again.finish() is True
    assert blockmask.begin_call(spec, q, k, [], blocks(bm)).finish() is True
    assert blockmask.verified.checks == before + 2

    edited = next(e for e in (fuzz_blockmask.edit(bm, s) for s in range(100)) if e and e[0].startswith("drop_full"))[1]
    check = blockmask.begin_call(spec, q, k, [], blocks(edited))  # queued: no answer, no error yet
    with pytest.raises(RuntimeError, match="full blocks differ"):
        check.finish()
    with pytest.raises(RuntimeError, match="full blocks differ"):
        blockmask.begin_call(spec, q, k, [], blocks(edited)).finish()
    assert blockmask.verified.checks == before + 3


def test_the_block_mask_check_is_keyed_by_what_the_mask_reads():
    """A BlockMask is checked once, however often the tensors the score_mod reads change (a graph may hand the op a
    fresh copy every call, an optimizer updates one in place); an in-place edit of the ids a mask_mod reads makes
    it check again."""
    from te_compile.runtime import blockmask

    scale = torch.rand(H, dtype=torch.float64) + 0.5
    ids = torch.tensor([0] * 10 + [1] * 14)
    causal = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cpu", BLOCK_SIZE=8)
    docs = create_block_mask(lambda b, h, q, kv: (ids[q] == ids[kv]) & (q >= kv), 1, 1, L, L, device="cpu",
                             BLOCK_SIZE=8)

    def scaled(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s * scale[h], block_mask=causal)

    def packed(q, k, v):
        return flex_attention(q, k, v, block_mask=docs)
    backend = te_compile.backend(inner="aot_eager", target="reference")
    q, k, v = (a.detach() for a in _inputs())
    for fn in (scaled, packed):
        assert [d.runs_on for d in te_compile.explain(fn, q, k, v, target="reference").decisions] == ["reference"]
    scaled_c, packed_c = (torch.compile(fn, backend=backend, fullgraph=True) for fn in (scaled, packed))
    for fn, c in ((scaled, scaled_c), (packed, packed_c)):
        torch.testing.assert_close(c(q, k, v), fn(q, k, v))  # compiled; the BlockMask checked
    before = blockmask.verified.checks
    for _ in range(3):
        scale.mul_(1.01)  # a score_mod input changed in place: no new check
        torch.testing.assert_close(scaled_c(q, k, v), scaled(q, k, v))
    assert blockmask.verified.checks == before
    ids[-1] = 0  # the mask_mod's ids changed: checked again (the BlockMask no longer matches them: refused)
    with pytest.raises(RuntimeError, match="not built by create_block_mask"):
        packed_c(q, k, v)
    assert blockmask.verified.checks == before + 1


def test_the_block_mask_check_takes_query_rows_a_few_blocks_at_a_time(monkeypatch):
    """The check evaluates mask_mod in chunks of whole query blocks (bounded memory at long lengths): the blocks it
    derives are the ones of the whole mask at once, for a mask_mod that reads captured document ids per batch row,
    with a last chunk shorter than a block; create_block_mask's BlockMask passes, an edited one does not."""
    from te_compile.runtime import blockmask
    from tools import fuzz_blockmask

    ids = torch.tensor([[0] * 5 + [1] * 9 + [2] * 10, [0] * 12 + [1] * 12])
    n = 21  # not a multiple of the block size

    def mm(b, h, q, kv):
        return (ids[b, q] == ids[b, kv]) & (q >= kv)
    bm = create_block_mask(mm, B, 1, n, n, device="cpu", BLOCK_SIZE=8)
    q, k, v = (a.detach()[:, :, :n] for a in _inputs())
    spec = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, k, v,
                              target="reference").decisions[0].spec
    expr, inputs = spec.mask_expr(), [ids]
    whole = blockmask.element_blocks(expr, inputs, B, H, n, n, 8, 8, torch.device("cpu"))
    monkeypatch.setattr(blockmask, "CHUNK_ELEMENTS", 1)  # one query block per chunk: 3 chunks, the last of 5 rows
    chunked = blockmask.element_blocks(expr, inputs, B, H, n, n, 8, 8, torch.device("cpu"))
    assert whole[0].shape[-2:] == (3, 3) and all(torch.equal(a, b) for a, b in zip(whole, chunked))

    def check(m):
        return blockmask.mismatch(expr, inputs, B, H, n, n, 8, 8, m.kv_num_blocks, m.kv_indices,
                                  m.full_kv_num_blocks, m.full_kv_indices, torch.device("cpu"))
    assert check(bm) is None
    edited = next(e for e in (fuzz_blockmask.edit(bm, s) for s in range(100)) if e and e[0].startswith("drop_"))[1]
    assert check(edited) is not None


def test_block_mask_is_checked_once_per_block_mask():
    from te_compile.runtime.blockmask import verified

    bm = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cpu", BLOCK_SIZE=8)

    def fn(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm)
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    args = [a.detach() for a in _inputs()]
    compiled(*args, bm)
    before = verified.checks
    for _ in range(3):
        compiled(*args, bm)
    assert verified.checks == before
    bm.kv_num_blocks.add_(0)  # an in-place edit (same values) bumps the version: checked again
    compiled(*args, bm)
    assert verified.checks == before + 1


DOCS = torch.tensor([[0] * 7 + [1] * 9 + [2] * 8, [0] * 12 + [1] * 12])  # [B, L] document ids


def _doc_mask(b, h, q, kv):
    return DOCS[b, q] == DOCS[b, kv]


def _doc_causal(b, h, q, kv):
    return (DOCS[b, q] == DOCS[b, kv]) & (q >= kv)


@pytest.fixture
def serve_sparse_document_masks(monkeypatch):
    from te_compile.passes import flex
    monkeypatch.setattr(flex, "MIN_GATHER_MASK_DENSITY", 0.0)
    monkeypatch.setenv("TE_COMPILE_INTERVALS", "0")  # without a score_mod the interval kernels would take them


@pytest.mark.parametrize("mask_mod,score", [(_doc_mask, "none"), (_doc_causal, "softcap"), (_doc_causal, "rel_table")])
def test_document_mask_becomes_a_minus_inf_bias(mask_mod, score, serve_sparse_document_masks):
    """mask_mods that gather (document ids) run as a 0/-inf bias materialized in the graph."""
    table = (torch.randn(H, 2 * L - 1, dtype=torch.float64) * 0.5).requires_grad_()
    mods = {"none": None, "softcap": SCORE_MODS["softcap"],
            "rel_table": lambda s, b, h, q_, kv: s + table[h, q_ - kv + L - 1]}
    bm = create_block_mask(mask_mod, B, 1, L, L, device="cpu", BLOCK_SIZE=8)

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=mods[score], block_mask=bm, return_lse=True)
    report = te_compile.explain(fn, *_inputs(), target="reference")
    (d,) = report.decisions
    assert d.runs_on == "reference", str(report)
    assert "materialize_mask" in report.code()
    assert d.dbias_note == ("yes (table needs grad)" if score == "rel_table" else "no (mask as -inf bias)")
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    got = _run(compiled, _inputs())
    table_grad = table.grad.clone() if score == "rel_table" else None
    table.grad = None
    want = _run(fn, _inputs())
    for a, b in zip(got[:2] + tuple(got[2]), want[:2] + tuple(want[2])):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-7)
    if table_grad is not None:
        torch.testing.assert_close(table_grad, table.grad, rtol=1e-7, atol=1e-7)


def test_sparse_document_mask_is_kept_for_inductor(monkeypatch):
    """Few attended blocks: Inductor's block-sparse flex beats a dense bias, so the node is kept (on the graph path:
    the interval kernels off)."""
    monkeypatch.setenv("TE_COMPILE_INTERVALS", "0")
    bm = create_block_mask(_doc_causal, B, 1, L, L, device="cpu", BLOCK_SIZE=8)
    density = (bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum()).item() / (B * 9)
    fn = lambda q, k, v: flex_attention(q, k, v, block_mask=bm)  # noqa: E731
    ((target, why),) = _reasons(fn, *[a.detach() for a in _inputs()])
    assert density < 0.6
    assert target == "kept" and "document-style" in why and f"{100 * density:.0f}% of the blocks" in why


def test_document_mask_follows_a_hand_built_block_mask(serve_sparse_document_masks):
    """With the mask materialized, the BlockMask's semantics are applied too (unlisted blocks
    masked, full blocks kept), so even a hand-built BlockMask gives compiled flex's answer."""
    good = create_block_mask(_doc_mask, B, 1, L, L, device="cpu", BLOCK_SIZE=8)
    kv_num = good.kv_num_blocks.clone()
    kv_num[..., -1] = 0  # drop the last query block's partial blocks
    bad = BlockMask.from_kv_blocks(kv_num, good.kv_indices.clone(), good.full_kv_num_blocks.clone(),
                                   good.full_kv_indices.clone(), BLOCK_SIZE=8, mask_mod=_doc_mask)

    def fn(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True)
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    q, k, v = [a.detach() for a in _inputs()]
    for bm in (good, bad):
        # compiled flex's (Triton) semantics, written out: full blocks kept, partial blocks where
        # mask_mod keeps, unlisted blocks masked (eager flex ignores the block structure)
        keep = torch.zeros(B, 1, L, L, dtype=torch.bool)
        for b in range(B):
            for i in range(L // 8):
                rows = slice(8 * i, 8 * i + 8)
                for n_, idx, full in ((bm.kv_num_blocks, bm.kv_indices, False),
                                      (bm.full_kv_num_blocks, bm.full_kv_indices, True)):
                    for j in idx[b, 0, i, : int(n_[b, 0, i])].tolist():
                        cols = slice(8 * j, 8 * j + 8)
                        qi = torch.arange(8 * i, 8 * i + 8)[:, None]
                        kj = torch.arange(8 * j, 8 * j + 8)[None, :]
                        keep[b, 0, rows, cols] |= True if full else _doc_mask(b, 0, qi, kj)
        s_ = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        p_ = torch.softmax(s_.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
        got = compiled(q, k, v, bm)[0]
        torch.testing.assert_close(got, p_ @ v, rtol=1e-7, atol=1e-7)
    assert not torch.equal(compiled(q, k, v, good)[0], compiled(q, k, v, bad)[0])


def test_document_mask_over_the_size_limit_is_kept(monkeypatch, serve_sparse_document_masks):
    from te_compile.passes import flex
    monkeypatch.setattr(flex, "MAX_BIAS_BYTES", 1024)
    bm = create_block_mask(_doc_mask, B, 1, L, L, device="cpu", BLOCK_SIZE=8)
    fn = lambda q, k, v: flex_attention(q, k, v, block_mask=bm)  # noqa: E731
    ((target, why),) = _reasons(fn, *[a.detach() for a in _inputs()])
    assert target == "kept" and "GiB" in why and "mask_mod" in why


# a negative factor folds its magnitude: the scale stays positive (cuDNN needs it) and the sign stays in
# the score_mod as a negation
@pytest.mark.parametrize("name,factor,score", [("times_two", 2.0, ""), ("one_minus", 0.1, "(add (neg score) 1.0)")])
def test_linear_score_mod_folds_into_the_scale(name, factor, score):
    report = te_compile.explain(_fn(name, "causal"), *_inputs(), target="reference")
    (d,) = report.decisions
    assert d.spec.scale == pytest.approx(factor / math.sqrt(D)) and d.spec.score == score


def test_flex_call_is_read_by_name_on_both_block_mask_layouts():
    """find.FlexArgs / FlexBlockMask name the HOP's arguments; the BlockMask tuple has 13 entries on torch 2.11
    and 17 on 2.13 (dq-order tensors before the block sizes), read the same way."""
    from te_compile.passes.find import FlexBlockMask, find_sites

    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 256, 256, device="cpu", BLOCK_SIZE=128)
    t = bm.as_tuple()
    got = FlexBlockMask.parse(t)
    assert got.kv_num_blocks is bm.kv_num_blocks and got.kv_indices is bm.kv_indices
    assert got.full_kv_num_blocks is bm.full_kv_num_blocks and got.full_kv_indices is bm.full_kv_indices
    assert (got.q_block, got.kv_block) == tuple(bm.BLOCK_SIZE) and got.mask_mod is bm.mask_mod
    t11 = t[:10] + t[-3:]  # torch 2.11's layout: no dq-order entries
    assert len(t11) == 13 and FlexBlockMask.parse(t11) == got

    sites = []

    def be(gm, ex):
        sites.extend(find_sites(gm.graph))
        return gm.forward

    q = torch.randn(1, 2, 256, 16)
    torch.compile(lambda q: flex_attention(q, q, q, score_mod=lambda s, b, h, i, j: s * 2, block_mask=bm),
                  backend=be, fullgraph=True)(q)
    (site,) = sites
    assert site.problem is None and site.flex is not None
    assert site.flex.q is site.q and site.flex.block_mask.q_block == 128
    assert site.score_mod is getattr(site.node.graph.owning_module, site.flex.score_mod.target)
    assert site.mask_mod is getattr(site.node.graph.owning_module, site.flex.block_mask.mask_mod.target)


@pytest.mark.parametrize("score,nan", [
    ("(log (div score -4.0))", True), ("(sqrt score)", True), ("(pow score 0.5)", True), ("(div 1.0 score)", True),
    ("(log (add (abs score) 1.0))", False), ("(sqrt (add (abs score) 0.5))", False), ("(pow score 2)", False),
    ("(mul (tanh (div score 30.0)) 30.0)", False), ("(add score (mul kv_idx 0.1))", False),
])
def test_which_score_mods_may_be_nan_at_finite_scores(score, nan):
    """A score_mod that may be NaN is kept under a gathering mask_mod (its -inf bias does not hide a NaN)."""
    from te_compile.score import ir
    assert ir.may_be_nan(ir.parse(score)) is nan


def _edit_full_blocks(bm, edit):
    """``bm`` with one full block of its first (batch, head) edited, the partial blocks untouched: "drop" the last
    full block of the first query block that has one, "move" it to a kv block the BlockMask does not list, "add" an
    unlisted kv block as full to the first query block that has one."""
    num, idx = bm.full_kv_num_blocks.clone(), bm.full_kv_indices.clone()
    nk = bm.kv_indices.shape[-1]
    listed = [set(bm.kv_indices[0, 0, i, : int(bm.kv_num_blocks[0, 0, i])].tolist())
              | set(idx[0, 0, i, : int(num[0, 0, i])].tolist()) for i in range(num.shape[-1])]
    if edit in ("drop", "move"):
        i = next(i for i in range(num.shape[-1]) if num[0, 0, i] > 0)
        if edit == "drop":
            num[0, 0, i] -= 1
        else:
            idx[0, 0, i, int(num[0, 0, i]) - 1] = min(set(range(nk)) - listed[i])
    else:
        i = next(i for i in range(num.shape[-1]) if set(range(nk)) - listed[i])
        idx[0, 0, i, int(num[0, 0, i])] = min(set(range(nk)) - listed[i])
        num[0, 0, i] += 1
    return BlockMask.from_kv_blocks(bm.kv_num_blocks.clone(), bm.kv_indices.clone(), num, idx,
                                    BLOCK_SIZE=bm.BLOCK_SIZE, mask_mod=bm.mask_mod)


def _flex_block_semantics(q, k, v, bm, mask_mod):
    """out and lse of compiled flex's semantics for ``bm``, in float64 dense math: full blocks kept, partial blocks
    where mask_mod keeps, blocks not listed masked (eager flex applies mask_mod element-wise and ignores them)."""
    n = q.shape[2]
    keep = torch.zeros(bm.kv_num_blocks.shape[0], bm.kv_num_blocks.shape[1], n, n, dtype=torch.bool)
    for num, idx, full in ((bm.kv_num_blocks, bm.kv_indices, False), (bm.full_kv_num_blocks, bm.full_kv_indices, True)):
        for b in range(num.shape[0]):
            for h in range(num.shape[1]):
                for i in range(num.shape[2]):
                    for j in idx[b, h, i, : int(num[b, h, i])].tolist():
                        qi = torch.arange(8 * i, min(8 * i + 8, n))[:, None]
                        kj = torch.arange(8 * j, min(8 * j + 8, n))[None, :]
                        keep[b, h, qi, kj] |= True if full else mask_mod(b, h, qi, kj)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, lse


@pytest.mark.parametrize("edit", ["drop", "move", "add"])
def test_a_block_mask_with_edited_full_blocks_is_refused(edit):
    """Partial blocks as create_block_mask builds them, one full block dropped, moved or added: compiled flex
    attends differently there than mask_mod element-wise, so te_compile keeps the site at compile time and
    refuses the BlockMask at run time (a different BlockMask for an already compiled graph)."""
    good = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cpu", BLOCK_SIZE=8)
    bad = _edit_full_blocks(good, edit)
    args = [a.detach() for a in _inputs()]
    want_out, _ = _flex_block_semantics(*args, bad, MASK_MODS["causal"])
    elementwise = flex_attention(*args, block_mask=good)
    assert (want_out - elementwise).abs().max() > 0.1  # the edit changes the answer: serving it would be wrong

    def fn(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm)
    ((target, why),) = _reasons(fn, *args, bad)
    assert target == "kept" and "full blocks differ" in why, why
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    torch.testing.assert_close(compiled(*args, good), fn(*args, good))
    with pytest.raises(RuntimeError, match="its full blocks differ"):
        compiled(*args, bad)


@pytest.mark.parametrize("edit", ["drop", "move", "add"])
def test_document_mask_follows_edited_full_blocks(edit, serve_sparse_document_masks):
    """A document mask materialized with the BlockMask's semantics serves a BlockMask whose full blocks were
    edited: out and lse are compiled flex's for that BlockMask (float64 dense math), not mask_mod's."""
    bad = _edit_full_blocks(create_block_mask(_doc_mask, B, 1, L, L, device="cpu", BLOCK_SIZE=8), edit)

    def fn(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True)
    args = [a.detach() for a in _inputs()]
    want_out, want_lse = _flex_block_semantics(*args, bad, _doc_mask)
    assert (want_out - fn(*args, bad)[0]).abs().max() > 0.1  # eager flex (element-wise) differs: the edit matters
    assert _reasons(fn, *args, bad)[0][0] == "reference"
    out, lse = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))(*args, bad)
    torch.testing.assert_close(out, want_out, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(lse, want_lse, rtol=1e-7, atol=1e-7)

