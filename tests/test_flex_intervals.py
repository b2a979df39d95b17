"""Flex sites on cuDNN's interval-mask kernels: which sites take the path, and the numbers of the path's op (the
reference target on the CPU: the same rewrite, the op's reference math) against eager flex and float64 dense math,
forward and backward with lse in the loss."""

import pytest
import torch
import torch.nn.attention.flex_attention as fa
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile.spec import AttentionSpec

B, H, L, D = 2, 4, 96, 16


@pytest.fixture(autouse=True)
def _cpu_flex_with_grad(monkeypatch):
    # eager/compiled flex refuse CPU inputs that require grad; the math path itself is fine
    monkeypatch.setattr(fa, "_validate_device", lambda *a, **k: None)


def _ids() -> torch.Tensor:
    doc = torch.zeros(B, L, dtype=torch.int64)
    doc[0] = torch.tensor([0] * 30 + [1] + [2] * 40 + [3] * 25)  # a length-1 document
    doc[1] = torch.tensor([7] * 10 + [9] * 86)  # another packing; ids need not be 0..n
    return doc


DOC = _ids()
LENS = torch.tensor([50, 0])  # row 1 sees no key at all; rows q >= 50 of batch 0 neither


def _hf_packed():
    """Hugging Face's packed-sequence mask_mod, as transformers.masking_utils builds it for flex from position ids
    that restart per document: and_masks(causal, same packed sequence), the cache position's first entry (a 0-dim
    tensor) added to q_idx."""
    pos = torch.cat([torch.arange(n) for n in (30, 1, 40, 25)]).expand(B, L).clone()
    pos[1] = torch.cat([torch.arange(10), torch.arange(86)])
    seq = (torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1) != 1).cumsum(-1)
    q_offset = torch.arange(L)[0]

    def causal(b, h, q, kv):
        return kv <= q

    def packed(b, h, q, kv):
        return seq[b, q] == seq[b, kv]
    inner = fa.and_masks(causal, packed)
    return lambda b, h, q, kv: inner(b, h, q + q_offset, kv + 0)

MASKS = {
    "documents + causal": lambda b, h, q, kv: (DOC[b, q] == DOC[b, kv]) & (q >= kv),
    "documents": lambda b, h, q, kv: DOC[b, q] == DOC[b, kv],
    "prefix-LM": lambda b, h, q, kv: (kv < 8) | (q >= kv),
    "sink + local": lambda b, h, q, kv: (q >= kv) & ((kv < 4) | (q - kv <= 20)),
    "padding": lambda b, h, q, kv: (kv < LENS[b]) & (q < LENS[b]),
    "Hugging Face packed sequences": _hf_packed(),
}


def _spec(rep) -> AttentionSpec:
    site = rep.to_dict()["sites"][0]
    return AttentionSpec.from_key(site["spec"]) if site["spec"] else None


def _dense(q, k, v, keep):
    """float64 masked softmax attention: (out, lse) with flex's fully-masked-row semantics (0, -inf)."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0, lse).unsqueeze(-1))
    p = torch.where(keep, p, 0)
    return p @ v, lse


def _keep(mm):
    b, q, kv = torch.arange(B).view(B, 1, 1, 1), torch.arange(L).view(1, 1, L, 1), torch.arange(L).view(1, 1, 1, L)
    return mm(b, 0, q, kv).expand(B, 1, L, L)


@pytest.mark.parametrize("name", sorted(MASKS))
def test_interval_masks_take_the_path_and_match_eager(name):
    mm = MASKS[name]
    bm = create_block_mask(mm, B, 1, L, L, device="cpu", BLOCK_SIZE=32)

    def f(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True)

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, L, D, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
    rep = te_compile.explain(f, q.detach(), k.detach(), v.detach(), target="reference")
    spec = _spec(rep)
    assert spec is not None and spec.intervals, rep
    assert "key intervals" in str(rep)
    torch._dynamo.reset()
    cf = torch.compile(f, backend=te_compile.backend(target="reference", inner="aot_eager"), fullgraph=True)
    out, lse = cf(q, k, v)
    with torch.no_grad():
        eo, el = f(q, k, v)  # eager flex (forward only on the CPU)
    torch.testing.assert_close(out, eo)
    torch.testing.assert_close(lse, el)
    do, dl = torch.randn_like(out), torch.randn_like(lse)
    dl = torch.where(torch.isinf(lse), 0, dl)
    grads = torch.autograd.grad((out * do).sum() + (torch.where(torch.isinf(lse), 0, lse) * dl).sum(), (q, k, v))
    ro, rl = _dense(q, k, v, _keep(mm))
    torch.testing.assert_close(out, ro)
    want = torch.autograd.grad((ro * do).sum() + (torch.where(torch.isinf(rl), 0, rl) * dl).sum(), (q, k, v))
    for got, w in zip(grads, want):
        torch.testing.assert_close(got, w)


@pytest.mark.parametrize("name,mm", [
    ("causal", lambda b, h, q, kv: q >= kv),
    ("sliding window", lambda b, h, q, kv: (q >= kv) & (q - kv <= 16)),
])
def test_bands_stay_on_the_graph_path(name, mm):
    bm = create_block_mask(mm, B, 1, L, L, device="cpu")
    q = torch.randn(B, H, L, D, dtype=torch.float64)
    rep = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, q, q, target="reference")
    spec = _spec(rep)
    assert spec is not None and not spec.intervals


def test_a_score_mod_keeps_the_graph_path():
    bm = create_block_mask(MASKS["prefix-LM"], B, 1, L, L, device="cpu")
    q = torch.randn(B, H, L, D, dtype=torch.float64)
    rep = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s * 0.5 + 1,
                                                            block_mask=bm), q, q, q, target="reference")
    spec = _spec(rep)
    assert spec is None or not spec.intervals


def test_the_environment_switch_turns_the_path_off(monkeypatch):
    monkeypatch.setenv("TE_COMPILE_INTERVALS", "0")
    bm = create_block_mask(MASKS["sink + local"], B, 1, L, L, device="cpu")
    q = torch.randn(B, H, L, D, dtype=torch.float64)
    rep = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, q, q, target="reference")
    spec = _spec(rep)
    assert spec is None or not spec.intervals


def test_a_hand_edited_block_mask_is_refused_on_the_path():
    mm = MASKS["documents + causal"]
    bm = create_block_mask(mm, B, 1, L, L, device="cpu", BLOCK_SIZE=32)
    bm.full_kv_num_blocks = bm.full_kv_num_blocks.clone()
    assert int(bm.full_kv_num_blocks[1, 0, 2]) == 1  # batch 1, queries 64-95: keys 32-63 are one full block
    bm.full_kv_num_blocks[1, 0, 2] = 0  # that block dropped: flex would skip it, the mask_mod keeps it
    q = torch.randn(B, H, L, D, dtype=torch.float64)
    cf = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=bm),
                       backend=te_compile.backend(target="reference", inner="aot_eager"))
    with pytest.raises(Exception, match="create_block_mask"):
        cf(q, q, q)


def test_the_cuda_check_names_what_the_kernels_cannot_take():
    from te_compile.cudnn import flexkernel

    t = torch.empty(1, 2, 8, 64, dtype=torch.float32, device="meta")
    assert "float16 and bfloat16" in flexkernel.unavailable(t, t, t)
    h = torch.empty(1, 2, 8, 160, dtype=torch.bfloat16, device="meta")
    assert "head dims 160/160" in flexkernel.unavailable(h, h, h)
    c = torch.empty(1, 2, 8, 64, dtype=torch.bfloat16)  # decided for a GPU from a CPU (explain's for_device)
    wide = torch.empty(1, 2, 8, 160, dtype=torch.bfloat16)
    assert flexkernel.unavailable(c, c, c) is None and "head dims 160/160" in flexkernel.unavailable(wide, wide, wide)


def test_plans_are_reused_only_for_the_same_unchanged_tensors(monkeypatch):
    """The interval kernels' plan cache (te_compile.cudnn.flexkernel._Plans): a plan is reused for the same captured
    tensor unchanged, rebuilt for an in-place write, another tensor or other shapes, and always rebuilt for inference
    tensors (no version counter); an entry holds its tensors, so their memory cannot pass to another tensor."""
    from te_compile.cudnn import flexkernel

    built = []
    monkeypatch.setattr(flexkernel, "_build", lambda spec, q, k, v, bufs, backward: built.append(1) or object())
    plans = flexkernel._Plans(per_data=2)
    spec = AttentionSpec(source="flex", mask_mod="(eq (index (buf 0) q_idx) (index (buf 0) kv_idx))", n_inputs=1,
                         intervals=True)
    q = torch.empty(1, 2, 8, 16)
    ids = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    p = plans.get(spec, q, q, q, [ids], True)
    assert plans.get(spec, q, q, q, [ids], True) is p and len(built) == 1
    assert plans.get(spec, q, q, q, [ids[:]], True) is p  # a view of the same memory and content
    ids[3] = 2  # an in-place write
    assert plans.get(spec, q, q, q, [ids], True) is not p and len(built) == 2
    plans.get(spec, q, q, q, [ids.clone()], True)
    assert len(built) == 3
    assert any(ids is t for _, refs in plans.data.values() for t in refs)  # held while its entry lives
    q2 = torch.empty(1, 2, 8, 32)
    plans.get(spec, q2, q2, q2, [ids], True)
    assert len(built) == 4
    with torch.inference_mode():
        frozen = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    plans.get(spec, q, q, q, [frozen], True)
    plans.get(spec, q, q, q, [frozen], True)
    assert len(built) == 6
    static = AttentionSpec(source="flex", mask_mod="(or (lt kv_idx 2) (ge q_idx kv_idx))", intervals=True)
    assert plans.get(static, q, q, q, [], True) is plans.get(static, q, q, q, [], True) and len(built) == 7
