"""GPU numerics: flex_attention through cuDNN (score_mod, mask_mod, derived bprop) vs eager fp32.

Run on the GPU machine:  python3 -m pytest -q -m cuda tests
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from forms import ROWS_TOL, rel_err, rows_err

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]

TOL = 2e-2
H = 8
SLOPES = (torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32) * 8.0 / H).cuda()
          if torch.cuda.is_available() else None)


SCORE_MODS = {
    "none": None,
    "softcap": lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0),
    "alibi_from_h": lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / H)) * (kv - q),
    "alibi_captured": lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q),
    "rel_bias": lambda s, b, h, q, kv: s + (q - kv) * 0.05,
    "times_two": lambda s, b, h, q, kv: s * 2,
    "trig": lambda s, b, h, q, kv: torch.sin(s) + s * torch.cos(s / 4),
}
MASK_MODS = {
    "none": None,
    "causal": lambda b, h, q, kv: q >= kv,
    "sliding": lambda b, h, q, kv: (q >= kv) & (q - kv <= 100),
    "inverse_causal": lambda b, h, q, kv: q <= kv,
}
SCORE_MODS["half"] = lambda s, b, h, q, kv: s * 0.5
SCORE_MODS["exp_score"] = lambda s, b, h, q, kv: torch.exp(s / 8.0)
SCORE_MODS["one_minus"] = lambda s, b, h, q, kv: 1 - 0.1 * s  # folded into a negative softmax scale
# mask-first emission (cudnn/emit.py): softcap/alibi/rel_bias/times_two/exp_score + causal;
# half / one_minus are linear in the score: folded into the scale (half + causal: built-in mask)
CASES = [("none", "causal"), ("none", "sliding"), ("none", "inverse_causal"), ("softcap", "none"),
         ("softcap", "causal"), ("alibi_from_h", "none"), ("alibi_captured", "causal"), ("rel_bias", "none"),
         ("times_two", "sliding"), ("trig", "none"), ("times_two", "causal"), ("rel_bias", "causal"),
         ("half", "causal"), ("exp_score", "causal"), ("softcap", "inverse_causal"), ("one_minus", "none"),
         ("one_minus", "sliding")]


def _run(fn, args, dout):
    args = [a.detach().requires_grad_() for a in args]
    out, lse = fn(*args)
    out.backward(dout.to(out.dtype))
    return out.detach().float(), lse.detach().float(), [a.grad.float() for a in args]


def _on_cudnn_and_eager(fn, q, k, v, dout):
    """Assert the site goes to cuDNN; (report, compiled (out, lse, grads), eager float32 (out, lse, grads))."""
    torch._dynamo.reset()
    report = te_compile.explain(fn, q, k, v)
    assert [d.runs_on for d in report.decisions] == ["cudnn"], str(report)
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager"), fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a reference fallback would warn
        got = _run(compiled, [q, k, v], dout)
    return report, got, _run(fn, [q.float(), k.float(), v.float()], dout)


def _served_and_matches(fn, q, k, v, dout, tol=TOL * 2.5):
    """The site goes to cuDNN; compiled out, lse and q/k/v grads match eager flex in float32.
    Returns the report (for extra checks)."""
    report, (out, lse, grads), (ref_out, ref_lse, ref_grads) = _on_cudnn_and_eager(fn, q, k, v, dout)
    errs = {"out": rel_err(out, ref_out), "lse": (lse - ref_lse).abs().max().item()}
    errs.update({n: rel_err(a, b) for n, a, b in zip("qkv", grads, ref_grads)})
    assert max(errs.values()) <= tol, errs
    return report


@pytest.mark.parametrize("L", [256, 1000])  # one tile row per 128; 1000: a ragged last tile
@pytest.mark.parametrize("score,mask", CASES, ids=[f"{s}-{m}" for s, m in CASES])
def test_flex_on_cudnn_matches_eager_fp32(score, mask, L, hk=H):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, H, L, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, hk, L, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn(2, H, L, 64, device="cuda", generator=g)
    mm = MASK_MODS[mask]
    bm = create_block_mask(mm, 1, 1, L, L, device="cuda") if mm else None

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=SCORE_MODS[score], block_mask=bm, return_lse=True,
                              enable_gqa=hk != H)

    _, (out, lse, grads), (ref_out, ref_lse, ref_grads) = _on_cudnn_and_eager(fn, q, k, v, dout)
    assert not out.isnan().any()
    errs = {"out": rel_err(out, ref_out)}
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    errs["lse_abs"] = (lse[finite] - ref_lse[finite]).abs().max().item()
    for n, a, b in zip("qkv", grads, ref_grads):
        assert not a.isnan().any(), n
        errs[n] = rel_err(a, b)
    assert max(v for n, v in errs.items() if n != "lse_abs") <= TOL, errs
    assert errs["lse_abs"] < 5e-2, errs
    # per row: an error confined to a few rows (the ragged last tile, rows a mask empties) is not diluted
    rows = {n: rows_err(a, b) for n, a, b in zip(["out", "q", "k", "v"], [out, *grads], [ref_out, *ref_grads])}
    assert max(rows.values()) <= ROWS_TOL, rows


@pytest.mark.parametrize("mm", [lambda b, h, q, kv: (0 >= kv) | ((0 % 3) != 8), lambda b, h, q, kv: q >= 0],
                         ids=["folds_to_true", "index_always_true"])
def test_mask_mod_that_keeps_every_key(mm):
    """A mask_mod whose value is a constant True once folded: the BlockMask check evaluates it on the blocks'
    device (it raised a CPU/CUDA device mismatch in torch.equal), and the answer is eager's."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 4, 100, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(1, 4, 100, 128, device="cuda", generator=g)
    bm = create_block_mask(mm, 1, 1, 100, 100, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: -0.5 * s, block_mask=bm, return_lse=True)

    _served_and_matches(fn, q, k, v, dout)


def test_flex_gqa_softcap_causal():
    test_flex_on_cudnn_matches_eager_fp32("softcap", "causal", 384, hk=2)


def test_learned_relative_position_table_on_cudnn():
    """score + table[h, q - kv]: the gather becomes a bias, cuDNN computes dBias, autograd carries
    it back to the table (the additive split)."""
    L = 256
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, H, L, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(2, H, L, 64, device="cuda", generator=g)
    table = (torch.randn(H, 2 * L - 1, device="cuda", generator=g) * 0.5).requires_grad_()
    bm = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True,
                              score_mod=lambda s, b, h, q_, kv: s + table[h, q_ - kv + L - 1])

    torch._dynamo.reset()
    report = te_compile.explain(fn, q, k, v)
    assert [d.runs_on for d in report.decisions] == ["cudnn"], str(report)
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager"), fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, lse, grads = _run(compiled, [q, k, v], dout)
    got_table = table.grad.clone()
    table.grad = None
    ref_out, ref_lse, ref_grads = _run(fn, [q.float(), k.float(), v.float()], dout)
    errs = {"out": rel_err(out, ref_out), "table": rel_err(got_table, table.grad)}
    errs.update({n: rel_err(a, b) for n, a, b in zip("qkv", grads, ref_grads)})
    assert max(errs.values()) <= TOL, errs


@pytest.mark.parametrize("score", ["none", "softcap"])
def test_bottom_right_causal(score):
    """L != S with flex's bottom-right causal spelling ``q + (S - L) >= kv``: built-in band (right bound
    S - L) without a score_mod, mask-first inside the score_mod with one."""
    L, S = 128, 384
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, H, L, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, H, S, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn(2, H, L, 64, device="cuda", generator=g)
    mm = lambda b, h, q_, kv: q_ + (S - L) >= kv  # noqa: E731
    bm = create_block_mask(mm, 1, 1, L, S, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=SCORE_MODS[score], block_mask=bm, return_lse=True)

    report = _served_and_matches(fn, q, k, v, dout)
    from te_compile.lowering.lower import lower
    spec = report.decisions[0].spec
    assert (lower(spec, (L, S)).band == (None, S - L)) == (score == "none"), spec


@pytest.mark.parametrize("name,mm,band", [
    ("abs <=", lambda b, h, q_, kv: torch.abs(q_ - kv) <= 32, (33, 32)),
    ("abs <", lambda b, h, q_, kv: torch.abs(kv - q_) < 32, (32, 31)),
    ("abs offset", lambda b, h, q_, kv: torch.abs(q_ - kv - 8) <= 32, (41, 24)),
])
def test_symmetric_window_is_a_builtin_band(name, mm, band):
    """A bidirectional window spelled with abs (kv within W of q on both sides) runs as cuDNN's native
    diagonal band (left and right bound; tile skipping) and matches eager flex."""
    L = 256
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, H, L, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(2, H, L, 64, device="cuda", generator=g)
    bm = create_block_mask(mm, 1, 1, L, L, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True)

    report = _served_and_matches(fn, q, k, v, dout)
    from te_compile.lowering.lower import lower
    assert lower(report.decisions[0].spec, (L, L)).band == band, report.decisions[0].spec


def test_changed_constant_reuses_the_built_graph():
    """softcap 30 then 20: the second runs the same cuDNN graphs (constants are pass-by-value
    inputs), with its own value (numerics vs eager flex_attention in float32, with autograd)."""
    from te_compile.cudnn import graphs
    from te_compile.spec import AttentionSpec

    L = 256
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(2, H, L, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
    bm = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, 1, 1, L, L, device="cuda")
    builds = []
    for cap in (30.0, 20.0):
        spec = AttentionSpec(source="flex", score=f"(mul (tanh (div score {cap})) {cap})",
                             mask_mod="(ge q_idx kv_idx)").key()
        before = graphs.cache.builds
        out, lse = torch.ops.te_compile.attn_fwd(q, k, v, None, [], spec)
        got = torch.ops.te_compile.attn_bwd(dout, q, k, v, out, lse, None, [], spec, False)
        builds.append(graphs.cache.builds - before)
        f = [t.float().requires_grad_() for t in (q, k, v)]
        want_out = flex_attention(*f, score_mod=lambda s, b, h, i, j, c=cap: c * torch.tanh(s / c), block_mask=bm)
        want = torch.autograd.grad(want_out, f, dout.float())
        errs = [rel_err(out.float(), want_out)] + [rel_err(a.float(), b) for a, b in zip(got[:3], want)]
        assert max(errs) <= TOL, (cap, errs)
    assert builds[1] == 0, builds


@pytest.mark.parametrize("score", ["none", "softcap"])
def test_document_mask_on_cudnn(score, monkeypatch):
    """doc[q] == doc[kv] (& causal) on the graph path: the mask becomes a 0/-inf bias in the graph, cuDNN serves it
    (without a score_mod the interval kernels would take it: they are off here)."""
    from te_compile.passes import flex
    monkeypatch.setattr(flex, "MIN_GATHER_MASK_DENSITY", 0.0)  # serve it whatever its density
    monkeypatch.setenv("TE_COMPILE_INTERVALS", "0")
    L = 256
    g = torch.Generator(device="cuda").manual_seed(0)
    docs = torch.cat([torch.full((n,), i) for i, n in enumerate((40, 100, 116))]).cuda()
    docs = torch.stack([docs, docs.flip(0)])
    q, k, v = (torch.randn(2, H, L, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(2, H, L, 64, device="cuda", generator=g)
    mm = lambda b, h, q_, kv: (docs[b, q_] == docs[b, kv]) & (q_ >= kv)  # noqa: E731
    bm = create_block_mask(mm, 2, 1, L, L, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=SCORE_MODS[score], block_mask=bm, return_lse=True)

    report = _served_and_matches(fn, q, k, v, dout)
    assert "materialize_mask" in report.code()


PREFIX_MASKS = {
    "kv_lt_or_causal": lambda P: (lambda b, h, q, kv: (kv < P) | (q >= kv)),
    "causal_or_gt": lambda P: (lambda b, h, q, kv: (kv <= q) | (P > kv)),
}


@pytest.mark.parametrize("spelling", list(PREFIX_MASKS))
@pytest.mark.parametrize("L,S,P,hkv,bshd", [
    (256, 256, 64, H, False),   # tile-aligned prefix
    (256, 256, 100, H, False),  # a prefix that ends inside a tile
    (200, 256, 72, H, False),   # fewer queries than keys
    (256, 192, 50, H, False),   # more queries than keys
    (256, 256, 100, 2, True),   # GQA, BSHD layout (the model's transpose)
])
def test_prefix_lm_runs_as_two_native_calls(spelling, L, S, P, hkv, bshd, monkeypatch):
    """A prefix-LM mask (bidirectional over the first P keys, causal after them) on the graph path (the interval
    kernels off) runs as every query over the prefix keys plus the later queries over the later keys with native
    causal, merged by lse (te_compile.lowering.prefix), and matches eager flex: out, lse, and q/k/v gradients with a loss that
    reads the lse too (the dlse path of both calls)."""
    from te_compile.lowering import prefix

    monkeypatch.setenv("TE_COMPILE_INTERVALS", "0")

    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(h, n):
        if bshd:
            return torch.randn(2, n, h, 64, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
        return torch.randn(2, h, n, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    q, k, v = rnd(H, L), rnd(hkv, S), rnd(hkv, S)
    dout = torch.randn(2, H, L, 64, device="cuda", generator=g)
    dlse = torch.randn(2, H, L, device="cuda", generator=g)
    bm = create_block_mask(PREFIX_MASKS[spelling](P), 1, 1, L, S, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True, enable_gqa=hkv != H)

    torch._dynamo.reset()
    report = te_compile.explain(fn, q, k, v)
    assert [d.runs_on for d in report.decisions] == ["cudnn"], str(report)
    sp = prefix.split(report.decisions[0].spec, L, S)
    assert sp is not None and sp.keys == P, report.decisions[0].spec

    def run(f, args):
        args = [a.detach().requires_grad_() for a in args]
        out, lse = f(*args)
        ((out.float() * dout).sum() + (lse.float() * dlse).sum()).backward()
        return [out.detach().float(), lse.detach().float()] + [a.grad.float() for a in args]

    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager"), fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a reference fallback would warn
        got = run(compiled, [q, k, v])
    want = run(fn, [q.float(), k.float(), v.float()])
    errs = {"out": rel_err(got[0], want[0]), "lse": (got[1] - want[1]).abs().max().item()}
    errs.update({n: rel_err(a, b) for n, a, b in zip("qkv", got[2:], want[2:])})
    assert max(errs.values()) <= TOL * 2.5, errs


def _cudnn_alibi(heads: int):
    """ALiBi with cuDNN's slopes for ``heads`` heads, computed from h in the score_mod (attention-gym's formula
    for a power of two; the ALiBi paper's interleaved slopes for the rest)."""
    n = 1 << (heads.bit_length() - 1)
    if n == heads:
        return lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / heads)) * (kv - q)
    return lambda s, b, h, q, kv: s + torch.where(
        h < n, torch.exp2(-(h + 1) * 8.0 / n), torch.exp2(-(2 * (h - n) + 1) * 4.0 / n)) * (kv - q)


@pytest.mark.parametrize("heads,hkv,L,S", [(8, 8, 256, 256), (12, 12, 384, 384), (8, 2, 200, 200),
                                           (16, 16, 1024, 1024), (8, 8, 256, 384)])
def test_alibi_causal_with_cudnn_slopes(heads, hkv, L, S):
    """ALiBi + causal whose slopes are cuDNN's: served by cuDNN's built-in ALiBi (use_alibi_mask) where queries
    and keys are as many, emitted otherwise; forward and backward match eager flex either way."""
    from te_compile.lowering import lower as lowering

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(2, heads, L, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(2, hkv, S, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn(2, heads, L, 64, device="cuda", generator=g)
    bm = create_block_mask(MASK_MODS["causal"], 1, 1, L, S, device="cuda")
    score_mod = _cudnn_alibi(heads)

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, return_lse=True, enable_gqa=hkv != heads)

    report = _served_and_matches(fn, q, k, v, dout, tol=TOL)
    spec = report.decisions[0].spec
    assert spec.alibi_heads == heads, spec
    assert lowering.lower(spec, (L, S), heads=heads).alibi == (L == S)


@pytest.mark.parametrize("off", [1e-3, -1e-3])
def test_alibi_with_near_miss_slopes_uses_the_users_slopes(off):
    """Slopes 1e-3 (relative) off cuDNN's own are not served by built-in ALiBi (which would use cuDNN's slopes): the
    emitted score_mod uses the user's. The lse tells them apart (bf16 out cannot): eager float32 with cuDNN's slopes
    is >= 1e-3 away from eager with the user's (2.6e-3 here), te_compile within 3e-4 of the user's."""
    from te_compile.lowering import lower as lowering

    heads, L = 16, 512
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(2, heads, L, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(2, heads, L, 64, device="cuda", generator=g)
    bm = create_block_mask(MASK_MODS["causal"], 1, 1, L, L, device="cuda")

    def attention(factor):
        def fn(q, k, v):
            return flex_attention(q, k, v, block_mask=bm, return_lse=True, score_mod=lambda s, b, h, q_, kv: (
                s + torch.exp2(-((h + 1) * 8.0 / heads)) * factor * (kv - q_)))
        return fn
    report, (out, lse, grads), (ref_out, ref_lse, ref_grads) = _on_cudnn_and_eager(attention(1.0 + off), q, k, v, dout)
    spec = report.decisions[0].spec
    assert spec.alibi_heads == 0 and not lowering.lower(spec, (L, L), heads=heads).alibi, spec
    with torch.no_grad():
        _, native_lse = attention(1.0)(q.float(), k.float(), v.float())
    assert (native_lse - ref_lse).abs().max().item() >= 1e-3  # the test can see built-in ALiBi's slopes
    assert (lse - ref_lse).abs().max().item() <= 3e-4
    assert rows_err(out, ref_out) <= ROWS_TOL
    for name, a, b in zip("qkv", grads, ref_grads):
        assert rows_err(a, b) <= ROWS_TOL, name
