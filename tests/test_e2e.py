"""torch.compile with te_compile (reference target) equals eager, output and every grad."""

import pytest
import torch

import te_compile
from forms import FORMS, FORMS_BY_NAME, make_fn, make_inputs, run


def _compare(form, inner, dtype=torch.float32, tol=1e-5):
    inputs = make_inputs(form, "cpu", dtype)
    fn = make_fn(form)
    compiled = torch.compile(fn, backend=te_compile.backend(inner=inner, target="reference"), fullgraph=True)
    out, grads = run(compiled, inputs)
    ref_out, ref_grads = run(fn, inputs)
    torch.testing.assert_close(out, ref_out, rtol=tol, atol=tol)
    assert grads.keys() == ref_grads.keys()
    for n in ref_grads:
        assert grads[n] is not None, f"no grad for {n}"
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=tol, atol=tol, msg=n)


@pytest.mark.parametrize("form", FORMS, ids=[f.name for f in FORMS])
def test_form_aot_eager(form):
    _compare(form, "aot_eager")


@pytest.mark.parametrize("name", ["float_bias_learned", "bool_mask"])
def test_form_inductor(name):
    _compare(FORMS_BY_NAME[name], "inductor")


def test_every_site_was_rewritten():
    for form in FORMS:
        report = te_compile.explain(make_fn(form), **make_inputs(form, "cpu", torch.float32), target="reference")
        assert [d.runs_on for d in report.decisions] == ["reference"], (form.name, str(report))


def test_model_with_mixed_sites_and_dynamic_shapes():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 96)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.proj(x).view(B, T, 3, 2, 16).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            b = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
            return (a + b).transpose(1, 2).reshape(B, T, 32)

    torch.manual_seed(0)
    m = M()
    compiled = torch.compile(m, backend=te_compile.backend(inner="aot_eager", target="reference"), dynamic=True)
    for T in (8, 12):
        x = torch.randn(2, T, 32)
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-5, atol=1e-5)
