"""Goldens of the rewritten Dynamo graph for each SDPA form, and the reasons for kept nodes."""

import expecttest
import torch
import torch.nn.functional as F

import te_compile
from forms import FORMS_BY_NAME, make_fn, make_inputs


def _code(fn, *args, target="reference", **kwargs):
    report = te_compile.explain(fn, *args, target=target, **kwargs)
    assert len(report.graphs) == 1, report
    return report.graphs[0].code.strip(), report


def _form_code(name, dtype=torch.float32):
    form = FORMS_BY_NAME[name]
    return _code(make_fn(form), **make_inputs(form, "cpu", dtype))[0]


class TestRewriteGoldens(expecttest.TestCase):
    def test_no_mask(self):
        self.assertExpectedInline(_form_code("none"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    attn_fwd_default = torch.ops.te_compile.attn_fwd.default(l_q_, l_k_, l_v_, None, [], '{"impl":"reference","mask":"none","scale":null,"source":"sdpa"}');  l_q_ = l_k_ = l_v_ = None
    getitem = attn_fwd_default[0];  attn_fwd_default = None
    return (getitem,)""")

    def test_causal(self):
        self.assertExpectedInline(_form_code("causal"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    attn_fwd_default = torch.ops.te_compile.attn_fwd.default(l_q_, l_k_, l_v_, None, [], '{"impl":"reference","mask":"causal","scale":null,"source":"sdpa"}');  l_q_ = l_k_ = l_v_ = None
    getitem = attn_fwd_default[0];  attn_fwd_default = None
    return (getitem,)""")

    def test_bool_mask_becomes_bias(self):
        self.assertExpectedInline(_form_code("bool_mask"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor, L_mask_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    l_mask_ = L_mask_
    mask_to_bias = te_compile_passes_inserted_mask_to_bias(l_mask_, torch.float32);  l_mask_ = None
    attn_fwd_default = torch.ops.te_compile.attn_fwd.default(l_q_, l_k_, l_v_, mask_to_bias, [], '{"impl":"reference","mask":"none","scale":null,"source":"sdpa"}');  l_q_ = l_k_ = l_v_ = mask_to_bias = None
    getitem = attn_fwd_default[0];  attn_fwd_default = None
    return (getitem,)""")

    def test_float_bias(self):
        self.assertExpectedInline(_form_code("float_bias_learned"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor, L_mask_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    l_mask_ = L_mask_
    attn_fwd_default = torch.ops.te_compile.attn_fwd.default(l_q_, l_k_, l_v_, l_mask_, [], '{"impl":"reference","mask":"none","scale":null,"source":"sdpa"}');  l_q_ = l_k_ = l_v_ = l_mask_ = None
    getitem = attn_fwd_default[0];  attn_fwd_default = None
    return (getitem,)""")

    def test_float_bias_other_dtype_is_cast_in_graph(self):
        self.assertExpectedInline(_form_code("float_bias_LS_fp32_learned", torch.bfloat16), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor, L_mask_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    l_mask_ = L_mask_
    to = l_mask_.to(torch.bfloat16);  l_mask_ = None
    attn_fwd_default = torch.ops.te_compile.attn_fwd.default(l_q_, l_k_, l_v_, to, [], '{"impl":"reference","mask":"none","scale":null,"source":"sdpa"}');  l_q_ = l_k_ = l_v_ = to = None
    getitem = attn_fwd_default[0];  attn_fwd_default = None
    return (getitem,)""")

    def test_gqa_and_custom_scale(self):
        self.assertExpectedInline(_form_code("gqa_causal"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    attn_fwd_default = torch.ops.te_compile.attn_fwd.default(l_q_, l_k_, l_v_, None, [], '{"impl":"reference","mask":"causal","scale":null,"source":"sdpa"}');  l_q_ = l_k_ = l_v_ = None
    getitem = attn_fwd_default[0];  attn_fwd_default = None
    return (getitem,)""")
        self.assertExpectedInline(_form_code("custom_scale"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    attn_fwd_default = torch.ops.te_compile.attn_fwd.default(l_q_, l_k_, l_v_, None, [], '{"impl":"reference","mask":"none","scale":0.3,"source":"sdpa"}');  l_q_ = l_k_ = l_v_ = None
    getitem = attn_fwd_default[0];  attn_fwd_default = None
    return (getitem,)""")


def _reasons(fn, *args, target="reference"):
    return [(d.runs_on, d.reason) for d in te_compile.explain(fn, *args, target=target).decisions]


def _qkv(*shape, dtype=torch.float32):
    return [torch.randn(*shape, dtype=dtype) for _ in range(3)]


class TestKeptSites(expecttest.TestCase):
    def test_dropout_is_kept(self):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)  # noqa: E731
        self.assertExpectedInline(str(_reasons(fn, *_qkv(1, 2, 8, 8))), """[('kept', "dropout_p=0.1 > 0: cuDNN's dropout RNG cannot reproduce torch's")]""")

    def test_mask_with_is_causal_is_kept(self):
        fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=True)  # noqa: E731
        self.assertExpectedInline(str(_reasons(fn, *_qkv(1, 2, 8, 8), torch.zeros(8, 8))), """[('kept', 'attn_mask together with is_causal=True: eager behaviour differs by backend (error on math, AND on CPU flash); fold the causal mask into attn_mask')]""")

    def test_three_d_inputs_are_kept(self):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        self.assertExpectedInline(str(_reasons(fn, *_qkv(2, 8, 8))), """[('kept', 'inputs are 3-D: te_compile serves 4-D [B, H, S, D] attention')]""")

    def test_mixed_rank_inputs_name_each(self):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        q, k, v = torch.randn(1, 2, 8, 8), torch.randn(2, 8, 8), torch.randn(2, 8, 8)
        self.assertExpectedInline(str(_reasons(fn, q, k, v)), """[('kept', 'inputs are q 4-D, k 3-D, v 3-D: te_compile serves 4-D [B, H, S, D] attention')]""")

    def test_auto_target_keeps_cpu_sites(self):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        self.assertExpectedInline(str(_reasons(fn, *_qkv(1, 2, 8, 8), target="auto")), """[('kept', "inputs on cpu: target 'auto' rewrites CUDA sites only (target='reference' rewrites to the reference kernel)")]""")

    def test_kept_node_is_still_in_the_graph(self):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)  # noqa: E731
        code, _ = _code(fn, *_qkv(1, 2, 8, 8))
        assert "scaled_dot_product_attention" in code and "te_compile" not in code

