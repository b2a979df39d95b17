"""The prefix-LM split (te_compile.prefix) is exact: its two calls and lse merge, run on the reference
math in float64, give the full prefix-LM mask's out, lse and gradients (the GPU test runs it on cuDNN)."""

import pytest
import torch

from te_compile import reference
from te_compile import prefix
from te_compile.spec import AttentionSpec


def _fwd(q, k, v, bias, spec):
    return reference.attention_forward(q, k, v, bias, spec)


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
    want_out, want_lse = reference.attention_forward(q, k, v, None, spec)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)

    got = prefix.backward(_bwd, dout, q, k, v, out, lse, sp, dlse)
    want = reference.attention_backward(dout, q, k, v, want_out, want_lse, None, spec, False, (), dlse)
    for name, a, b in zip("qkv", got[:3], want[:3]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"d{name}")
