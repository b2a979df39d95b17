"""GPU numerics: every SDPA form through cuDNN, forward and backward, vs eager float32.

Run on the GPU machine:  python3 -m pytest -m cuda tests
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import te_compile
from forms import FORMS, FORMS_BY_NAME, ROWS_TOL, make_fn, make_inputs, rel_err, rows_err, run

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]

TOL = 2e-2


def _compiled(fn, inner="aot_eager", serve=None):
    torch._dynamo.reset()
    opts = {} if serve is None else {"serve": serve}
    return torch.compile(fn, backend=te_compile.backend(inner=inner, **opts), fullgraph=True)


def _check_form(form, dtype, inner="aot_eager", **shape):
    inputs = make_inputs(form, "cuda", dtype, **shape)
    fn = make_fn(form)
    report = te_compile.explain(fn, **{n: t.detach().requires_grad_(t.requires_grad) for n, t in inputs.items()})
    assert [d.runs_on for d in report.decisions] == ["cudnn"], str(report)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a reference fallback would warn
        out, grads = run(_compiled(fn, inner), inputs)
    ref_out, ref_grads = run(fn, inputs, upcast=torch.float32)
    assert not out.isnan().any()
    errs = {"out": rel_err(out, ref_out)}
    for n in ref_grads:
        assert grads[n] is not None, n
        assert not grads[n].isnan().any(), n
        assert grads[n].shape == inputs[n].shape
        errs[n] = rel_err(grads[n], ref_grads[n])
    assert max(errs.values()) <= TOL, errs
    return errs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("form", FORMS, ids=[f.name for f in FORMS])
def test_form_matches_eager_fp32(form, dtype):
    _check_form(form, dtype)


@pytest.mark.parametrize("L", [129, 255, 1000], ids=lambda n: f"L{n}")
@pytest.mark.parametrize("form", ["causal", "float_bias_learned", "gqa_causal", "bshd_causal", "bool_mask"])
def test_forms_at_ragged_and_multi_tile_lengths(form, L):
    """Multi-tile and ragged lengths (a partial last tile), head dim 64, errors per row as well as overall. Each
    site is served (serve="always"), except a learned bias at a length whose dBias cuDNN has no backward plan for
    (on an H100 with cuDNN 9.19: S = 129), which must be kept with that reason."""
    f = FORMS_BY_NAME[form]
    inputs = make_inputs(f, "cuda", torch.bfloat16, L=L, D=64)
    fn = make_fn(f)
    report = te_compile.explain(fn, **{n: t.detach().requires_grad_(t.requires_grad) for n, t in inputs.items()},
                                serve="always")
    (d,) = report.decisions
    if d.runs_on != "cudnn":
        assert f.learned and L % 8 and "builds no backward plan" in d.reason, str(report)
    out, grads = run(_compiled(fn, serve="always"), inputs)
    ref_out, ref_grads = run(fn, inputs, upcast=torch.float32)
    errs = {"out": (rel_err(out, ref_out), rows_err(out, ref_out))}
    errs.update({n: (rel_err(grads[n], ref_grads[n]), rows_err(grads[n], ref_grads[n])) for n in ref_grads})
    assert all(whole <= TOL and rows <= ROWS_TOL for whole, rows in errs.values()), errs


@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_head_dims(d):
    _check_form(FORMS_BY_NAME["causal"], torch.bfloat16, D=d)


def test_inductor_end_to_end():
    _check_form(FORMS_BY_NAME["float_bias_learned"], torch.bfloat16, inner="inductor", L=256)


def test_fully_masked_rows_are_zero():
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mask = torch.ones(64, 64, dtype=torch.bool, device="cuda")
    mask[5:9] = False

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    out = _compiled(fn)(q, k, v, mask)
    assert out[:, :, 5:9].abs().max().item() == 0.0
    out.float().square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


def _eager(q, k, v, bias, causal, scale=0.125):
    """Attention in float32 as eager computes it: (out, natural-log lse)."""
    s = (q.float() @ k.float().transpose(-1, -2)) * scale + bias.float()
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.float(), torch.logsumexp(s, -1)


def test_op_direct_matches_eager_and_caches():
    from te_compile.cudnn import graphs
    from te_compile.spec import AttentionSpec

    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, 4, 128, 128, device="cuda", dtype=torch.bfloat16)
    for mask in ("none", "causal"):
        spec = AttentionSpec(scale=0.125, mask=mask)
        builds = graphs.cache.builds
        o1, l1 = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec.key())
        want_o, want_l = _eager(q, k, v, bias, mask == "causal")
        assert rel_err(o1, want_o) < TOL
        assert (l1 - want_l).abs().max().item() < 1e-2
        torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec.key())
        assert graphs.cache.builds == builds + 1  # the second call hit the cache


def test_dbias_only_when_needed_on_gpu():
    from te_compile.cudnn import graphs
    from te_compile.spec import AttentionSpec

    q, k, v, do = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    bias = torch.randn(1, 4, 128, 128, device="cuda", dtype=torch.bfloat16)
    spec = AttentionSpec(scale=0.125).key()
    o, lse = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec)
    *g0, db0 = torch.ops.te_compile.attn_bwd(do, q, k, v, o, lse, bias, [], spec, False)
    *g1, db1 = torch.ops.te_compile.attn_bwd(do, q, k, v, o, lse, bias, [], spec, True)
    assert db0.numel() == 0 and db1.shape == bias.shape
    for a, b in zip(g0, g1):
        assert rel_err(a, b) < 1e-3
    b32 = bias.float().requires_grad_()
    out, _ = _eager(q, k, v, b32, False)
    out.backward(do.float())
    assert rel_err(db1, b32.grad) < TOL  # against eager's float32 gradient
    keys = [key for key in graphs.cache._entries if key[0] == "bwd"]
    assert {key[6] for key in keys} == {False, True}  # key[6] is need_dbias: two graphs, one with dBias


def test_verify_option_checks_cudnn_against_the_reference():
    from te_compile.runtime import verify

    form = FORMS_BY_NAME["float_bias_learned"]
    inputs = make_inputs(form, "cuda", torch.bfloat16, L=128)
    fn = make_fn(form)
    torch._dynamo.reset()
    before = len(verify._done)
    compiled = te_compile.compile(fn, inner="aot_eager", verify=True)
    out, grads = run(compiled, inputs)  # raises VerificationError if cuDNN disagreed
    assert len(verify._done) == before + 2  # forward and backward were checked once each
    run(compiled, inputs)
    assert len(verify._done) == before + 2  # and not again


@pytest.mark.parametrize("bias,mods", [(False, False), (True, False), (False, True)],
                         ids=["plain", "learned_bias", "softcap_causal"])
def test_the_python_and_the_native_executor_agree(bias, mods):
    """The two executors of a runner: Python's (the frontend's public execute: the native path off, or a signature C++
    does not hold) and C++'s (the serialized plan) give the same forward bitwise (same plan, same kernel) and the
    same gradients within bf16 tolerance, and each runs where it should (C++ every call after the first)."""
    from te_compile.cudnn import native
    from te_compile.spec import AttentionSpec

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    b = torch.randn(1, 4, 256, 256, device="cuda", dtype=torch.bfloat16, generator=g) if bias else None
    spec = AttentionSpec(mask="causal").key()
    if mods:
        spec = AttentionSpec(source="flex", scale=0.125, score="(mul (tanh (div score 30.0)) 30.0)",
                             mask_mod="(ge q_idx kv_idx)").key()
    results, hits = {}, {}
    try:
        for on in (False, True):
            if on:
                native.enable()
            else:
                native.disable()
            assert native.active() == on, native.status()
            start = native.stats().get("hits", 0)
            for _ in range(3):
                out, lse = torch.ops.te_compile.attn_fwd(q, k, v, b, [], spec)
                grads = torch.ops.te_compile.attn_bwd(do, q, k, v, out, lse, b, [], spec, bias)
            torch.cuda.synchronize()
            hits[on] = native.stats().get("hits", 0) - start
            results[on] = [out.clone(), lse.clone()] + [t.clone() for t in grads[: 3 + int(bias)]]
    finally:
        native.enable()
    assert hits == {False: 0, True: 4}, hits  # forward and backward: C++ from the second call on
    assert torch.equal(results[True][0], results[False][0]) and torch.equal(results[True][1], results[False][1])
    for a, r in zip(results[True][2:], results[False][2:]):
        assert rel_err(a, r) < 1e-2
