"""The prefix-LM split (te_compile.lowering.prefix) is exact: its two calls and lse merge, run on the reference
math in float64, give the full prefix-LM mask's out, lse and gradients (dout and dlse), checked against float64
dense attention differentiated by autograd (the GPU test runs the split on cuDNN)."""

import pytest
import torch

from te_compile import reference
from te_compile.lowering import prefix
from te_compile.spec import AttentionSpec


def _fwd(q, k, v, bias, spec):
    return reference.attention_forward(q, k, v, bias, spec)


def _dense(q, k, v, P, dout, dlse):
    """out, lse and (dq, dk, dv) of ``kv < P | q >= kv`` in float64 dense math (query head h reads kv head
    h // (Hq // Hkv)), the gradients of ``sum(out * dout) + sum(lse * dlse)`` by autograd."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    L, S = q.shape[2], k.shape[2]
    keep = (torch.arange(S)[None, :] < P) | (torch.arange(L)[:, None] >= torch.arange(S)[None, :])
    s = (q @ k.repeat_interleave(g, 1).transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1) @ v.repeat_interleave(g, 1)
    loss = (out * dout).sum() + ((lse * dlse).sum() if dlse is not None else 0.0)
    return out.detach(), lse.detach(), torch.autograd.grad(loss, (q, k, v))


def _bwd(dout, q, k, v, out, lse, bias, spec, need_dbias, inputs=(), dlse=None):
    dq, dk, dv, _ = reference.attention_backward(dout, q, k, v, out, lse, bias, spec, need_dbias, inputs, dlse)
    return dq, dk, dv, q.new_empty((0,))


@pytest.mark.parametrize("L,S,P,hkv,with_dlse", [
    (64, 64, 16, 4, False), (64, 64, 23, 4, True), (40, 64, 9, 4, True), (64, 40, 9, 2, True),
])
def test_split_equals_the_full_mask(L, S, P, hkv, with_dlse):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, L, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, hkv, S, 16, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(2, 4, L, 16, generator=g, dtype=torch.float64)
    dlse = torch.randn(2, 4, L, generator=g, dtype=torch.float64) if with_dlse else None
    spec = AttentionSpec(source="flex", mask_mod=f"(or (lt kv_idx {P}) (ge q_idx kv_idx))")
    sp = prefix.split(spec, L, S)
    assert sp is not None and sp.keys == P

    out, lse = prefix.forward(_fwd, q, k, v, sp)
    want_out, want_lse, want = _dense(q, k, v, P, dout, dlse)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)

    got = prefix.backward(_bwd, dout, q, k, v, out, lse, sp, dlse)
    for name, a, b in zip("qkv", got[:3], want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"d{name}")


@pytest.mark.parametrize("mask", [
    "(or (lt kv_idx 16) (and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 5)))",  # prefix + a sliding window
    "(or (lt kv_idx 16) (ge q_idx (sub kv_idx 2)))",  # prefix + causal shifted by 2
])
def test_a_prefix_with_another_band_is_not_split(mask):
    """Only prefix + top-left causal splits: the causal half is a plain causal call, so a window (or a shifted
    diagonal) after the prefix would be lost."""
    assert prefix.split(AttentionSpec(source="flex", mask_mod=mask), 64, 64) is None
