"""Attention inputs that reach the graph as DTensors (TP with use_local_output=False, context parallel) are
kept with a reason, and the answer is eager's (the te_compile op has no DTensor sharding rule: rewritten,
the compile failed with 'Operator te_compile.attn_fwd.default does not have a sharding strategy')."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import te_compile
from te_compile.report import Report, record_reports

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


@pytest.fixture
def mesh():
    from torch.distributed.device_mesh import init_device_mesh
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _sdpa(q, k, v, b):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=b)


@pytest.mark.parametrize("which", ["distribute_tensor", "from_local"])
def test_dtensor_inputs_are_kept_and_correct(mesh, which):
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    b = torch.randn(1, 4, 8, 8, dtype=torch.float64, requires_grad=True)
    ref = _sdpa(q, k, v, b)
    ref.sum().backward()
    dq, dk, dv, db = (t.detach().clone().requires_grad_() for t in (q, k, v, b))
    if which == "distribute_tensor":  # heads-sharded DTensors, as TP with use_local_output=False gives them
        args = [distribute_tensor(t, mesh, [Shard(1)]) for t in (dq, dk, dv, db)]
    else:  # from_local (what TP's use_local_output=False and CP's SDPA wrapper do), mask included
        args = [DTensor.from_local(t, mesh, [Shard(1)], run_check=False) for t in (dq, dk, dv, db)]
    fn = torch.compile(_sdpa, backend=te_compile.backend(target="reference", inner="aot_eager"), fullgraph=True)
    with record_reports() as reps:
        out = fn(*args)
    rows = Report(reps).rows()
    assert [r["runs_on"] for r in rows] == ["kept"], rows
    assert "DTensor" in rows[0]["reason"] and "Shard(dim=1)" in rows[0]["reason"], rows[0]["reason"]
    assert isinstance(out, DTensor)
    torch.testing.assert_close(out.full_tensor(), ref)
    out.sum().backward()
    # distribute_tensor makes new leaves; from_local is differentiable back to the local tensors
    grads = [a.grad.full_tensor() for a in args] if which == "distribute_tensor" else [t.grad for t in (dq, dk, dv, db)]
    for g, r in zip(grads, (q, k, v, b)):
        torch.testing.assert_close(g, r.grad)


def test_plain_tensors_still_served():
    q, k, v = (torch.randn(1, 2, 8, 16, requires_grad=True) for _ in range(3))
    fn = torch.compile(F.scaled_dot_product_attention, backend=te_compile.backend(target="reference", inner="aot_eager"))
    with record_reports() as reps:
        fn(q, k, v, is_causal=True).sum().backward()
    assert [r["runs_on"] for r in Report(reps).rows()] == ["reference"]
