"""GPU: torch.compile(mode="reduce-overhead") (CUDA graphs) with te_compile's ops: the graphs that
hold them are recorded into CUDA graphs (no cudagraph skip) and every replay matches eager.

Run on the GPU machine:  python3 -m pytest -q -m cuda tests
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from forms import rel_err

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


L = 256
_BM = None


def _flex(q, k, v):
    return flex_attention(q, k, v, block_mask=_BM, score_mod=lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0))


def _late_start(b, h, q_, kv):
    # rows q < 8 keep no key: te_compile sets them itself from a cached per-mask row table
    return (q_ >= kv) & (q_ >= 8)


def _flex_empty_rows(q, k, v):
    return flex_attention(q, k, v, block_mask=_BM)


_MASKS = {_sdpa: None, _flex: lambda b, h, q_, kv: q_ >= kv, _flex_empty_rows: _late_start}


@pytest.mark.parametrize("fn", [_sdpa, _flex, _flex_empty_rows],
                         ids=["sdpa_causal", "flex_softcap_causal", "flex_mask_empty_rows"])
def test_reduce_overhead_replays_match_eager(fn):
    """Several steps with new input values: te_compile's graphs are recorded (no cudagraph skip, a
    recorded tree), and every replay matches eager float32, forward and backward."""
    global _BM
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    mask = _MASKS[fn] or (lambda b, h, q_, kv: q_ >= kv)
    _BM = create_block_mask(mask, 1, 1, L, L, device="cuda")
    torch._dynamo.reset()
    counters.clear()
    backend = te_compile.backend(serve="always")
    compiled = torch.compile(fn, backend=backend, mode="reduce-overhead")
    from te_compile.cudnn import graphs
    graphs.cache.clear()  # the first execute of each cuDNN graph happens in the CUDA-graph warm-up
    g = torch.Generator(device="cuda").manual_seed(0)
    for step in range(4):
        q, k, v = (torch.randn(2, 4, L, 64, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(2, 4, L, 64, device="cuda", generator=g, dtype=torch.bfloat16)
        out = compiled(q, k, v)
        out.backward(dout)
        got = [out.detach().float().clone()] + [t.grad.float() for t in (q, k, v)]
        qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
        ref = fn(qf, kf, vf)
        ref.backward(dout.float())
        want = [ref.detach()] + [t.grad for t in (qf, kf, vf)]
        errs = [rel_err(a, b) for a, b in zip(got, want)]
        assert max(errs) < 2e-2, (step, errs)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    assert manager is not None and list(manager.get_roots()), "no CUDA graph was recorded"
    report = te_compile.explain(fn, *(torch.randn(2, 4, L, 64, device="cuda", dtype=torch.bfloat16),) * 3,
                                serve="always")
    assert [d.runs_on for d in report.decisions] == ["cudnn"], str(report)
