"""cuDNN's interval-mask kernels (te_compile.cudnn.flexkernel) against eager flex in float32 on the GPU: packed
documents (a different packing per row, length-1 documents, one document spanning the row), ids that are not runs,
prefix-LM, sink + local, padding (rows that see no key), GQA; forward, lse and gradients with lse in the loss."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile.runtime import kernels
from te_compile.spec import AttentionSpec

pytestmark = pytest.mark.cuda


def _available() -> str:
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    from te_compile.cudnn import flexkernel

    t = torch.empty(1, 2, 128, 64, dtype=torch.bfloat16, device="cuda")
    return flexkernel.unavailable(t, t, t) or ""


def _packing(B: int, L: int, docs: list[int]) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(docs))
    rows = []
    for n in docs:
        cuts = (torch.randperm(L - 1, generator=g)[: n - 1] + 1).sort().values.tolist()
        lengths = [b - a for a, b in zip([0] + cuts, cuts + [L])]
        rows.append(torch.repeat_interleave(torch.arange(n), torch.tensor(lengths)))
    return torch.stack(rows).cuda()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(got)), "non-finite entries differ"
    return float((got.float()[fin] - want[fin]).abs().max() / want[fin].abs().max().clamp(min=1e-6))


def _case(mm, B=2, H=4, Hkv=4, L=384, D=64, name=""):
    bm = create_block_mask(mm, B, 1, L, L, device="cuda")
    gqa = {"enable_gqa": True} if Hkv != H else {}

    def f(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, return_lse=True, **gqa)

    g = torch.Generator(device="cuda").manual_seed(0)
    # [B, L, H, D] projections viewed as flex's layout, as models make them
    q = torch.randn(B, L, H, D, device="cuda", generator=g).transpose(1, 2)
    k, v = (torch.randn(B, L, Hkv, D, device="cuda", generator=g).transpose(1, 2) for _ in range(2))
    return f, q, k, v


def _check(f, q, k, v, expect_plans=True, native_hits=True):
    from te_compile.cudnn import flexkernel

    builds = flexkernel.plans.builds
    rep = te_compile.explain(f, q.bfloat16(), k.bfloat16(), v.bfloat16())
    spec = AttentionSpec.from_key(rep.to_dict()["sites"][0]["spec"])
    assert spec.intervals, str(rep)
    cf = torch.compile(f, backend=te_compile.backend(serve="always"))
    from te_compile.cudnn import native

    hits = native.stats().get("hits", 0) if native.active() else None
    # the first call records the kernels' launches, the second replays them on new inputs (in C++ where the native
    # call path is on), the third runs them again
    for it in range(3):
        if it:
            q, k, v = (torch.randn_like(t) for t in (q, k, v))
        qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
        q32, k32, v32 = (t.detach().requires_grad_() for t in (q, k, v))
        out, lse = cf(qb, kb, vb)
        eo, el = f(q32, k32, v32)
        do = torch.randn_like(eo)
        dl = torch.where(torch.isfinite(el), torch.randn_like(el), 0)
        if it < 2:  # lse in the loss: the backward gets a dlse
            got = torch.autograd.grad((out.float() * do).sum() + (torch.nan_to_num(lse, neginf=0) * dl).sum(),
                                      (qb, kb, vb))
            want = torch.autograd.grad((eo * do).sum() + (torch.nan_to_num(el, neginf=0) * dl).sum(), (q32, k32, v32))
        else:  # out only: no dlse (the backward the native call path serves)
            got = torch.autograd.grad((out.float() * do).sum(), (qb, kb, vb))
            want = torch.autograd.grad((eo * do).sum(), (q32, k32, v32))
        assert _rel(out, eo) < 2e-2, it
        assert _rel(lse, el) < 1e-2, it
        for a, b in zip(got, want):
            assert _rel(a, b) < 3e-2, it
    kept = list(flexkernel.plans.static.values()) + [e[0] for e in flexkernel.plans.data.values()]
    assert not any(r is False for p in kept for r in p.launches.values()), "a launch was not recorded"
    if expect_plans:
        assert flexkernel.plans.builds > builds  # the interval kernels ran, not another path
        if hits is not None and native_hits:  # the later calls ran in C++: two forwards, the backward without dlse
            st = native.stats()
            assert not any("interval" in why for why in st["declined"]), st["declined"]
            assert st["hits"] >= hits + 3, (st["declined"], st)
    assert not kernels.runtime_fallbacks()


@pytest.fixture(autouse=True)
def _needs_kernels():
    why = _available()
    if why:
        pytest.skip(f"cuDNN's interval kernels: {why}")


@pytest.mark.parametrize("docs", [[1, 1], [4, 4], [16, 3], [384, 2]])  # one document ... every token its own
@pytest.mark.parametrize("causal", [True, False])
def test_packed_documents(docs, causal):
    ids = _packing(2, 384, docs)
    if causal:
        mm = lambda b, h, q, kv: (ids[b, q] == ids[b, kv]) & (q >= kv)  # noqa: E731
    else:
        mm = lambda b, h, q, kv: ids[b, q] == ids[b, kv]  # noqa: E731
    _check(*_case(mm))


def test_ids_that_are_not_runs_still_give_flex_numbers():
    ids = torch.tensor([0, 0, 1, 1, 0, 0, 2, 2] * 48, device="cuda").expand(2, 384).contiguous()
    _check(*_case(lambda b, h, q, kv: (ids[b, q] == ids[b, kv]) & (q >= kv)), native_hits=False)


@pytest.mark.parametrize("name", ["prefix-LM", "sink + local", "padding", "global tokens"])
def test_static_interval_masks(name):
    lens = torch.tensor([200, 0], device="cuda")
    mm = {
        "prefix-LM": lambda b, h, q, kv: (kv < 100) | (q >= kv),
        "sink + local": lambda b, h, q, kv: (q >= kv) & ((kv < 4) | (q - kv <= 64)),
        "padding": lambda b, h, q, kv: (kv < lens[b]) & (q < lens[b]),
        "global tokens": lambda b, h, q, kv: (kv < 3) | (q < 3) | ((q >= kv) & (q - kv <= 50)),
    }[name]
    _check(*_case(mm))


def test_hugging_face_packed_sequences():
    """transformers' flex mask for position ids that restart per document: causal and the same packed sequence, the
    cache position's first entry (a 0-dim tensor) added to q_idx."""
    pos = torch.cat([torch.arange(n) for n in (100, 1, 200, 83)]).cuda().expand(2, 384).clone()
    pos[1] = torch.cat([torch.arange(n) for n in (50, 334)]).cuda()
    seq = (torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1) != 1).cumsum(-1)
    off = torch.arange(384, device="cuda")[0]
    _check(*_case(lambda b, h, q, kv: (kv <= q + off) & (seq[b, q + off] == seq[b, kv])))


@pytest.mark.parametrize("D", [64, 128])
def test_gqa_and_head_dims(D):
    ids = _packing(1, 512, [5])
    _check(*_case(lambda b, h, q, kv: (ids[b, q] == ids[b, kv]) & (q >= kv), B=1, H=8, Hkv=2, L=512, D=D))


def test_a_new_packing_written_into_the_same_ids_tensor():
    """A training loop copies each step's packing into one ids buffer (same memory, a new version) and builds a new
    BlockMask: the plan, and the native call path's runner (launches for one version of the ids), follow the ids."""
    ids = _packing(2, 384, [4, 4])

    def mm(b, h, q, kv):
        return (ids[b, q] == ids[b, kv]) & (q >= kv)

    cf = torch.compile(lambda q, k, v, bm: flex_attention(q, k, v, block_mask=bm),
                       backend=te_compile.backend(serve="always"))
    g = torch.Generator(device="cuda").manual_seed(1)
    for step, docs in enumerate(([4, 4], [4, 4], [7, 2], [7, 2], [1, 16], [4, 4])):
        ids.copy_(_packing(2, 384, docs))
        bm = create_block_mask(mm, 2, 1, 384, 384, device="cuda")
        q, k, v = (torch.randn(2, 384, 4, 64, device="cuda", generator=g).transpose(1, 2) for _ in range(3))
        qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
        q32, k32, v32 = (t.detach().requires_grad_() for t in (q, k, v))
        got, want = cf(qb, kb, vb, bm), flex_attention(q32, k32, v32, block_mask=bm)
        do = torch.randn_like(want)
        assert _rel(got, want) < 2e-2, (step, docs)
        for a, b in zip(torch.autograd.grad((got.float() * do).sum(), (qb, kb, vb)),
                        torch.autograd.grad((want * do).sum(), (q32, k32, v32))):
            assert _rel(a, b) < 3e-2, (step, docs)
    assert not kernels.runtime_fallbacks()
