"""The custom ops pass torch.library.opcheck (schema, fake kernel, autograd, AOT dispatch)."""

import pytest
import torch

import te_compile  # noqa: F401
from te_compile.passes.inserted import mask_to_bias
from te_compile.spec import AttentionSpec

CASES = {
    "plain": dict(),
    "causal_bias": dict(mask="causal", bias=(1, 4, 6, 6)),
    "bias_2d": dict(bias=(6, 6)),
    "gqa": dict(hk=2, mask="causal"),
    "bshd": dict(bshd=True, bias=(2, 4, 6, 6)),
    "cross": dict(s=9, bias=(1, 1, 6, 9)),
}


def _args(case, dtype=torch.float64, rg=True):
    g = torch.Generator().manual_seed(0)
    B, H, L, D = 2, 4, 6, 8
    S, hk = case.get("s", L), case.get("hk", H)

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)
    if case.get("bshd"):
        q, k, v = t(B, L, H, D).transpose(1, 2), t(B, S, hk, D).transpose(1, 2), t(B, S, hk, D).transpose(1, 2)
    else:
        q, k, v = t(B, H, L, D), t(B, hk, S, D), t(B, hk, S, D)
    bias = t(*case["bias"]) if "bias" in case else None
    for x in (q, k, v, bias):
        if x is not None:
            x.requires_grad_(rg)
    spec = AttentionSpec(scale=0.3, mask=case.get("mask", "none"), impl="reference").key()
    return q, k, v, bias, spec


@pytest.mark.parametrize("name", CASES)
def test_opcheck_fwd(name):
    q, k, v, bias, spec = _args(CASES[name])
    torch.library.opcheck(torch.ops.te_compile.attn_fwd.default, (q, k, v, bias, [], spec))


@pytest.mark.parametrize("with_dlse", [False, True])
@pytest.mark.parametrize("need_dbias", [False, True])
@pytest.mark.parametrize("name", ["causal_bias", "bshd", "gqa"])
def test_opcheck_bwd(name, need_dbias, with_dlse):
    q, k, v, bias, spec = _args(CASES[name], rg=False)
    out, lse = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_dlse else None
    torch.library.opcheck(torch.ops.te_compile.attn_bwd.default,
                          (dout, q, k, v, out, lse, bias, [], spec, need_dbias, dlse))


def test_gradcheck_through_the_op():
    """Both outputs are differentiated: out's and lse's gradients enter the backward."""
    q, k, v, bias, spec = _args(CASES["causal_bias"])
    fn = lambda q, k, v, b: torch.ops.te_compile.attn_fwd(q, k, v, b, [], spec)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, bias))


def _dense(q, k, v, bias, causal):
    """out and lse of eager attention in float64 dense math (scale 0.3, top-left causal, query head h reads kv head
    h // (Hq // Hkv)), differentiable by autograd."""
    g = q.shape[1] // k.shape[1]
    s = (q @ k.repeat_interleave(g, 1).transpose(-1, -2)) * 0.3
    if bias is not None:
        s = s + bias
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v.repeat_interleave(g, 1), torch.logsumexp(s, -1)


@pytest.mark.parametrize("name", ["causal_bias", "bias_2d", "gqa", "bshd", "cross"])
def test_forward_and_backward_with_dlse_match_dense_math(name):
    """The op's out, lse and its backward for a loss on out and lse (dout and dlse) against float64 dense math
    differentiated by autograd: dq, dk, dv and dbias."""
    q, k, v, bias, spec = _args(CASES[name])
    inputs = [t for t in (q, k, v, bias) if t is not None]
    out, lse = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec)
    want_out, want_lse = _dense(q, k, v, bias, CASES[name].get("mask") == "causal")
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)
    g = torch.Generator().manual_seed(1)
    dout = torch.randn(out.shape, generator=g, dtype=out.dtype)
    dlse = torch.randn(lse.shape, generator=g, dtype=lse.dtype)
    got = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), inputs)
    want = torch.autograd.grad((want_out * dout).sum() + (want_lse * dlse).sum(), inputs)
    for name_, a, b in zip("qkvb", got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"d{name_}")


def test_outputs_follow_input_layout():
    q, k, v, bias, spec = _args(CASES["bshd"], dtype=torch.float32, rg=False)
    out, lse = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec)
    # q is a [B, L, H, D] buffer viewed as [B, H, L, D]: the output is laid out the same way
    assert out.stride() == q.stride()
    assert out.transpose(1, 2).is_contiguous()
    assert lse.shape == (2, 4, 6) and lse.dtype == torch.float32 and lse.is_contiguous()
    dq, dk, dv, db = torch.ops.te_compile.attn_bwd(torch.ones_like(out), q, k, v, out, lse, bias, [], spec, False)
    assert dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride()
    assert db.numel() == 0


def test_no_dbias_requested_when_bias_frozen():
    q, k, v, bias, spec = _args(CASES["causal_bias"])
    bias.requires_grad_(False)
    out = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec)[0]
    out.sum().backward()
    assert bias.grad is None and q.grad is not None


def test_score_expr_with_extra_input_and_opcheck():
    from te_compile.passes.inserted import bh_input

    q, k, v, _, _ = _args(CASES["plain"])
    slopes = torch.rand(4, dtype=torch.float64)
    inp = bh_input(q, "(index (buf 0) h)", slopes)
    assert inp.shape == (1, 4, 1, 1) and inp.dtype == torch.float64  # a float term keeps its dtype
    assert bh_input(q, "(mul h 2)", slopes).dtype == torch.float32  # an integer term becomes float32
    spec = AttentionSpec(scale=0.3, impl="reference", source="flex", n_inputs=1,
                         score="(add score (mul (in 0) (sub kv_idx q_idx)))", mask_mod="(ge q_idx kv_idx)").key()
    out = torch.ops.te_compile.attn_fwd(q, k, v, None, [inp.double()], spec)[0]
    s = (q @ k.transpose(-1, -2)) * 0.3 + slopes.view(1, 4, 1, 1) * (torch.arange(6) - torch.arange(6).view(-1, 1))
    s = s.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v)
    torch.library.opcheck(torch.ops.te_compile.attn_fwd.default, (q, k, v, None, [inp.double()], spec))


def test_captured_tensor_grads_are_refused_not_dropped():
    q, k, v, _, _ = _args(CASES["plain"])
    extra = torch.rand(1, 4, 1, 1, dtype=torch.float64, requires_grad=True)
    spec = AttentionSpec(scale=0.3, impl="reference", n_inputs=1, score="(mul score (in 0))").key()
    out = torch.ops.te_compile.attn_fwd(q, k, v, None, [extra], spec)[0]
    with pytest.raises(RuntimeError, match="captured score_mod tensors"):
        out.sum().backward()


def test_mask_to_bias():
    m = torch.tensor([[True, False], [False, False]])
    b = mask_to_bias(m, torch.bfloat16)
    assert b.dtype == torch.bfloat16
    assert b.tolist() == [[0.0, float("-inf")], [float("-inf"), float("-inf")]]


def test_double_backward_is_refused_not_silently_wrong():
    q, k, v, bias, spec = _args(CASES["causal_bias"])
    out, _ = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec)
    (g,) = torch.autograd.grad(out.sum(), q, create_graph=False)
    assert g.grad_fn is None and torch.isfinite(g).all()
    out, _ = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_autograd_kernel_reads_the_backward_tensors_from_the_schema():
    """The Autograd kernel of attn_bwd finds its tensor arguments by the schema's positions, so a schema change
    cannot leave it checking the wrong arguments for requires_grad."""
    from te_compile.runtime import ops

    schema = ops._bwd_op._schema
    names = [a.name for a in schema.arguments]
    (head, tail), (extra,) = ops._BWD_TENSORS
    assert names[head] + names[tail] == ["dout", "q", "k", "v", "out", "lse", "bias", "dlse"]
    assert names[extra] == "extra"
    for i, a in enumerate(schema.arguments):  # every tensor argument is covered, nothing else is
        covered = i in range(head.start, head.stop) or i in range(tail.start, tail.stop) or i == extra
        assert covered == ("Tensor" in str(a.type)), a


def test_backward_grads_follow_needs_input_grad():
    """Each input gets its gradient only when it needs one (q frozen here), dBias only for a bias that needs it."""
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(3))
    k.requires_grad_(True)
    v.requires_grad_(True)
    bias = torch.randn(1, 2, 8, 8, dtype=torch.float64, requires_grad=True)
    spec = AttentionSpec(mask="none").key()
    out, _ = torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec)
    out.sum().backward()
    assert q.grad is None and k.grad is not None and v.grad is not None and bias.grad is not None
    assert bias.grad.shape == bias.shape
