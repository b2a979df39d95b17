"""A graph of only te_compile's ops is called without Inductor (te_compile.runtime.direct): which graphs qualify, and that
the direct call gives eager's output and gradients."""

import operator
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.fx import Graph, GraphModule

import te_compile
from te_compile.runtime.direct import attention_only, direct_callable
from te_compile.report import Report, record_reports
from te_compile.spec import AttentionSpec

SPEC = AttentionSpec(mask="causal", impl="reference").key()
DIRECT = "called without Inductor"


def _graph(extra=None, dead=None) -> GraphModule:
    """q, k, v -> attn_fwd -> getitem 0 -> output; ``extra(graph, out)`` may add a live node after the op,
    ``dead(graph, q)`` a node no output uses."""
    g = Graph()
    q, k, v = (g.placeholder(n) for n in "qkv")
    res = g.call_function(torch.ops.te_compile.attn_fwd.default, (q, k, v, None, [], SPEC))
    out = g.call_function(operator.getitem, (res, 0))
    if extra is not None:
        out = extra(g, out)
    if dead is not None:
        dead(g, q)
    g.output((out,))
    return GraphModule(torch.nn.Module(), g)


def _qkv(requires_grad=False):
    return [torch.randn(1, 2, 16, 8, dtype=torch.float64, requires_grad=requires_grad) for _ in range(3)]


def test_a_graph_of_the_op_and_its_getitem_is_called_directly():
    gm = _graph()
    reduced = attention_only(gm)
    assert reduced is not None
    assert [n.op for n in reduced.graph.nodes] == ["placeholder"] * 3 + ["call_function"] * 2 + ["output"]
    q, k, v = _qkv()
    (out,) = direct_callable(gm)(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_dead_nodes_that_read_no_input_are_dropped():
    # flex's empty BlockMask, traced into a graph without one, is built from constants alone
    def dead(g, q):
        t = g.call_function(torch.zeros, ([1, 1, 2],))
        g.call_function(operator.setitem, (t, 0, 1.0))
    reduced = attention_only(_graph(dead=dead))
    assert reduced is not None
    assert all(n.target in (torch.ops.te_compile.attn_fwd.default, operator.getitem)
               for n in reduced.graph.nodes if n.op == "call_function")


@pytest.mark.parametrize("why,kw", [
    ("another op on the output", dict(extra=lambda g, out: g.call_function(torch.mul, (out, 2.0)))),
    ("a dead node that mutates an input", dict(dead=lambda g, q: g.call_method("add_", (q, 1.0)))),
    ("a dead node that draws random numbers", dict(dead=lambda g, q: g.call_function(torch.rand, ([2],)))),
    ("a dead in-place random fill", dict(dead=lambda g, q: g.call_method("uniform_", (g.call_function(
        torch.empty, ([2],)),)))),
])
def test_graphs_with_more_stay_with_inductor(why, kw):
    assert attention_only(_graph(**kw)) is None, why


def test_a_graph_without_a_te_op_stays_with_inductor():
    g = Graph()
    q = g.placeholder("q")
    g.output((q,))
    assert attention_only(GraphModule(torch.nn.Module(), g)) is None


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("TE_COMPILE_DIRECT", "0")
    assert direct_callable(_graph()) is None


def _compile_and_compare(fn):
    """Compile ``fn`` with te_compile (reference target); output and gradients against eager; the report."""
    q, k, v = _qkv(requires_grad=True)
    torch._dynamo.reset()
    with record_reports() as graphs:
        out = torch.compile(fn, backend=te_compile.backend(target="reference", serve="always"))(q, k, v)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = fn(q, k, v)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    torch.testing.assert_close(out, ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    return Report(list(graphs)).table().splitlines()[0]


def test_compiled_attention_alone_runs_directly_with_eager_gradients():
    head = _compile_and_compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert "1 on the reference kernel" in head and f"1 graph(s) of te_compile ops only, {DIRECT}" in head, head


def test_a_graph_with_other_ops_goes_through_inductor():
    head = _compile_and_compare(lambda q, k, v: F.scaled_dot_product_attention(q * 2, k, v, is_causal=True) + 1)
    assert "1 on the reference kernel" in head and DIRECT not in head, head


def test_under_cuda_graph_modes_inductor_compiles_it(monkeypatch):
    calls = []
    backend = sys.modules["te_compile.backend"]
    monkeypatch.setattr(backend, "direct_callable", lambda gm: calls.append(gm) or None)
    q, k, v = _qkv()
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    torch._dynamo.reset()
    torch.compile(fn, backend=te_compile.backend(target="reference", serve="always", cuda_graphs=True))(q, k, v)
    assert calls == []
    torch._dynamo.reset()
    torch.compile(fn, backend=te_compile.backend(target="reference", serve="always"))(q, k, v)
    assert len(calls) == 1


def _no_grad_region(q, k, v):
    with torch.no_grad():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _autocast_region(q, k, v):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("fn", [_no_grad_region, _autocast_region], ids=["no_grad", "autocast"])
def test_a_grad_mode_or_autocast_switch_around_the_op_keeps_eager_semantics(fn):
    """Dynamo records the switch as nodes no output reads: dropped, the op ran with grad on (its output required
    a gradient) or without autocast (float32 out): such a graph goes through Inductor."""
    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    with record_reports() as graphs:
        out = torch.compile(fn, backend=te_compile.backend(target="reference", serve="always"))(q, k, v)
    ref = fn(q, k, v)
    assert (out.dtype, out.requires_grad) == (ref.dtype, ref.requires_grad)
    tol = 2e-2 if ref.dtype == torch.bfloat16 else 1e-5  # bfloat16: each side rounds its own way
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    assert DIRECT not in Report(list(graphs)).table().splitlines()[0]
