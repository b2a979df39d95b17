"""The reference kernel equals eager SDPA (math) forward and backward, for every form."""

import pytest
import torch
import torch.nn.functional as F

from forms import FORMS, make_fn, make_inputs, run
from te_compile import reference
from te_compile.spec import AttentionSpec


def _spec(form):
    return AttentionSpec(scale=form.scale, mask="causal" if form.is_causal else "none", impl="reference")


def _ref_fn(form):
    spec = _spec(form)

    def fn(q, k, v, mask=None):
        bias = None
        if mask is not None:
            bias = torch.where(mask, 0.0, float("-inf")).to(q.dtype) if mask.dtype == torch.bool else mask
        return torch.ops.te_compile.attn_fwd(q, k, v, bias, [], spec.key())[0]
    return fn


@pytest.mark.parametrize("form", FORMS, ids=[f.name for f in FORMS])
def test_reference_op_matches_eager_fp64(form):
    inputs = make_inputs(form, "cpu", torch.float64)
    out, grads = run(_ref_fn(form), inputs)
    ref_out, ref_grads = run(make_fn(form), inputs)
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-9)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-9, atol=1e-9, msg=n)


def test_fully_masked_rows_give_zero_and_minus_inf_lse():
    q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    bias = torch.zeros(6, 6, dtype=torch.float64)
    bias[2] = float("-inf")
    out, lse = reference.attention_forward(q, k, v, bias, AttentionSpec(scale=0.5))
    assert torch.all(out[:, :, 2] == 0)
    assert torch.all(lse[:, :, 2] == float("-inf"))
    assert torch.isfinite(out).all()
    dq, dk, dv, db = reference.attention_backward(torch.ones_like(out), q, k, v, out, lse, bias,
                                                  AttentionSpec(scale=0.5), True)
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert torch.all(dq[:, :, 2] == 0)
    assert db.shape == bias.shape and torch.isfinite(db[:2]).all()


def test_lse_is_natural_log_logsumexp():
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))
    _, lse = reference.attention_forward(q, k, v, None, AttentionSpec(scale=0.3, mask="causal"))
    s = (q @ k.transpose(-1, -2)) * 0.3
    s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))


def test_gqa_head_mapping_matches_repeat_interleave():
    q = torch.randn(1, 6, 4, 8, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64) for _ in range(2))
    out, _ = reference.attention_forward(q, k, v, None, AttentionSpec(scale=None))
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1))
    torch.testing.assert_close(out, want)
