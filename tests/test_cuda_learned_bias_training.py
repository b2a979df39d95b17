"""Training with a learned relative-position table under the default policy (serve="fastest"): whatever the
rules decide, the model compiles and runs, and every gradient matches float64 math.

When Inductor cannot compile the graph with the site kept (its flex backward ran out of shared memory on an
H100), te_compile serves the site on cuDNN and compiles again (te_compile.backend.compile_graph).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import te_compile
from te_compile.report import Report, record_reports

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]

B, H, S, D = 2, 8, 256, 64


def _bucket(d):
    d = torch.abs(d)
    return torch.where(d < 16, d, 16 + torch.clamp((torch.log((d + 1).float() / 16) * 5).to(torch.int32), max=15))


def _table_index(kind: str):
    idx = torch.arange(S)
    rel = idx[:, None] - idx[None, :]
    return rel + S - 1 if kind == "relpos" else _bucket(rel)


@pytest.mark.parametrize("kind", ["relpos", "t5"])
def test_learned_table_training_default_policy(kind):
    g = torch.Generator().manual_seed(0)
    n = 2 * S - 1 if kind == "relpos" else 32
    table0 = torch.randn(H, n, generator=g)
    qkv0 = [torch.randn(B, H, S, D, generator=g) for _ in range(3)]
    dout = torch.randn(B, H, S, D, generator=g)

    table = torch.nn.Parameter(table0.cuda().bfloat16())
    q, k, v = (t.cuda().bfloat16().requires_grad_(True) for t in qkv0)
    if kind == "relpos":
        score_mod = lambda s, b, h, qi, ki: s + table[h, qi - ki + S - 1]  # noqa: E731
    else:
        score_mod = lambda s, b, h, qi, ki: s + table[h, _bucket(qi - ki)]  # noqa: E731
    torch._dynamo.reset()
    # the default policy (the test session's TE_COMPILE_SERVE=always does not apply to an explicit serve=)
    fn = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod),
                       backend=te_compile.backend(serve="fastest"))
    with record_reports() as reports:
        out = fn(q, k, v)
    out.backward(dout.cuda().bfloat16())
    print("\n" + Report(reports).table())

    # float64 math: the gathered table as a dense bias
    t64 = table0.double().cuda().requires_grad_(True)
    q64, k64, v64 = (t.double().cuda().requires_grad_(True) for t in qkv0)
    bias = t64[:, _table_index(kind).cuda()]
    want = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=bias)
    want.backward(dout.double().cuda())
    for got, ref in ((out, want), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad), (table.grad, t64.grad)):
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, err


def test_a_learned_float32_table_gets_a_float32_bias_and_its_gradient_on_every_step():
    """A learned [L, S] float32 table (the GPU fuzzer's near-tolerance class): the bias te_compile hands cuDNN stays
    in float32, and the table's gradient matches float64 math on the first step and on the next ones (the op's fast
    path, which once returned dBias in bf16 next to a float32 bias)."""
    L, S2 = 129, 200
    g = torch.Generator().manual_seed(0)
    table0 = torch.randn(L, S2, generator=g) * 2
    qkv0 = [torch.randn(1, 2, n, 64, generator=g) for n in (L, S2, S2)]
    dout = torch.randn(1, 2, L, 64, generator=g)
    table = torch.nn.Parameter(table0.cuda())
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + table[qi, ki]),
                       backend=te_compile.backend(serve="always"))
    t64 = table0.double().cuda().requires_grad_(True)
    q64, k64, v64 = (t.double().cuda().requires_grad_(True) for t in qkv0)
    F.scaled_dot_product_attention(q64, k64, v64, attn_mask=t64).backward(dout.double().cuda())
    for step in range(3):
        q, k, v = (t.cuda().bfloat16().requires_grad_(True) for t in qkv0)
        table.grad = None
        with record_reports() as reports:
            out = fn(q, k, v)
        out.backward(dout.cuda().bfloat16())
        if step == 0:
            (d,) = [d for r in reports for d in r.decisions]
            assert d.runs_on == "cudnn" and "float32 = True" in Report(reports).code()
        assert table.grad.dtype == torch.float32
        for got, ref in ((q.grad, q64.grad), (table.grad, t64.grad)):
            err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
            assert err < 1e-2, (step, err)
