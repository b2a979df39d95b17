"""GPU: the native call path (te_compile.cudnn.native) serves repeated calls in C++, with eager's numbers.

Each case compiles a model-style function with te_compile, runs it (forward and backward) five times, and
checks every run against eager float32 (later runs replay the CUDA graphs the runners captured), and that the
last run's calls ran in C++ (the native path's hit count) where the signature is one cuDNN graph on the call's
own tensors, or in Python where it is not (the prefix-LM split's two calls and merge; a backward with a gradient
through lse).

Run on the GPU machine:  python3 -m pytest -q -m cuda tests/test_cuda_native.py
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile import counters
from te_compile.cudnn import native
from te_compile.runtime import kernels

from forms import ROWS_TOL, rel_err
from forms import rows_err as _rows_err

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]

H = 8
BF16_TOL = 2e-2


def _flex(score=None, mask=None, L=1000, lse_in_loss=False, gqa=False):
    """A flex_attention call as a model makes it (the BlockMask built once, outside the compiled function)."""
    bm = create_block_mask(mask, 1, 1, L, L, device="cuda") if mask is not None else None

    def fn(q, k, v):
        if lse_in_loss:
            out, lse = flex_attention(q, k, v, score_mod=score, block_mask=bm, return_lse=True, enable_gqa=gqa)
            return out + lse.unsqueeze(-1).to(out.dtype) * 0.01
        return flex_attention(q, k, v, score_mod=score, block_mask=bm, enable_gqa=gqa)
    return fn, L


def _softcap(s, b, h, q, kv):
    return 30.0 * torch.tanh(s / 30.0)


def _causal(b, h, q, kv):
    return q >= kv


def _slopes():
    return torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32, device="cuda") * 8.0 / H)


#: name -> (a function building (fn, L), kv heads, which calls of the third run run in C++)
CASES = {
    "flex_softcap_ragged": (lambda: _flex(_softcap, L=1000), H, "both"),
    "flex_softcap_causal": (lambda: _flex(_softcap, _causal, L=255), H, "both"),
    "flex_sliding_window": (lambda: _flex(None, lambda b, h, q, kv: (q >= kv) & (q - kv <= 100), L=1000), H, "both"),
    "flex_empty_rows": (lambda: _flex(None, lambda b, h, q, kv: (kv % 2 == 0) & (q >= 70), L=129), H, "both"),
    "flex_alibi_causal": (lambda: (lambda sl: _flex(lambda s, b, h, q, kv: s + sl[h] * (kv - q), _causal, L=512))(
        _slopes()), H, "both"),
    # the ALiBi cuDNN computes itself: the frontend copies its slopes into the workspace before each execute; the
    # native runner keeps them in a device buffer of its own
    "flex_builtin_alibi_causal": (lambda: _flex(lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / H)) * (kv - q),
                                               _causal, L=512), H, "both"),
    "flex_head_scale": (lambda: (lambda sc: _flex(lambda s, b, h, q, kv: s * sc[h], L=256))(
        torch.linspace(0.5, 1.5, H, device="cuda")), H, "both"),
    "flex_gqa_causal": (lambda: _flex(None, _causal, L=384, gqa=True), 2, "both"),
    "flex_prefix_lm": (lambda: _flex(None, lambda b, h, q, kv: (kv < 300) | (q >= kv), L=1024), H, "halves"),
    "flex_lse_in_loss": (lambda: _flex(_softcap, lse_in_loss=True, L=128), H, "forward"),
}


@pytest.fixture(autouse=True)
def _graph_path(monkeypatch):
    # the native call path serves the cuDNN graph path; the interval kernels (prefix-LM) are tested on their own
    monkeypatch.setenv("TE_COMPILE_INTERVALS", "0")


@pytest.fixture(autouse=True, scope="module")
def _native_on():
    assert native.enable() == "on", native.status()


def _run(fn, q, k, v, dout):
    args = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*args)
    out.backward(dout.to(out.dtype))
    return out.detach().float(), [a.grad.float() for a in args]


def _hits() -> int:
    return native.stats()["hits"]


@pytest.mark.parametrize("name", list(CASES))
def test_repeated_calls_run_natively_and_match_eager(name):
    make, hk, native_calls = CASES[name]
    fn, L = make()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, H, L, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, hk, L, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    dout = torch.randn(2, H, L, 64, device="cuda", generator=g)
    report = te_compile.explain(fn, q, k, v, serve="always")
    assert [d.runs_on for d in report.decisions] == ["cudnn"], str(report)
    assert "native call path: on" in report.table()
    want_out, want_grads = _run(fn, q.float(), k.float(), v.float(), dout)
    eager_out, eager_grads = _run(fn, q, k, v, dout)  # eager bf16: its own error, shown when the check fails
    eager = {"out": _rows_err(eager_out, want_out), **{n: _rows_err(a, b) for n, a, b in zip("qkv", eager_grads,
                                                                                           want_grads)}}
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", serve="always"), fullgraph=True)
    # runners of the same signatures made by earlier tests in this process (one declined, or one a forced failure
    # left to Python) would serve these calls without offering them again: every signature starts here
    kernels.clear_runners()
    hits = []
    declined = dict(counters.declined)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a reference fallback would warn
        for _ in range(5):
            before = _hits()
            out, grads = _run(compiled, q, k, v, dout)
            hits.append(_hits() - before)
            errs = {"out": _rows_err(out, want_out), **{n: _rows_err(a, b) for n, a, b in zip("qkv", grads, want_grads)}}
            assert max(errs.values()) <= ROWS_TOL, f"te_compile {errs}, eager bf16 {eager}"
            whole = [rel_err(out, want_out)] + [rel_err(a, b) for a, b in zip(grads, want_grads)]
            assert max(whole) <= BF16_TOL, whole
    # "halves": the prefix-LM split's outer call runs in Python, its two halves in C++ (forward and backward). A graph
    # the frontend runs on one of its Python engines (where its CuTe DSL is importable) has no plan C++ can load: it
    # stays with Python, declined with the engine's name
    new = {k: n - declined.get(k, 0) for k, n in counters.declined.items() if n != declined.get(k, 0)}
    python_engine = sum(n for k, n in new.items() if "Python engine" in k)
    want = {"both": 2, "none": 0, "forward": 1, "halves": 4}[native_calls] - python_engine
    assert hits[-1] == want, f"native calls per step {hits}, new declines {new}, {native.stats()}"


@pytest.mark.parametrize("L, learned", [(129, False), (1000, False), (1000, True)],
                         ids=["129-frozen", "1000-frozen", "1000-learned"])
def test_sdpa_bias_runs_natively_with_dbias(L, learned):
    """A float mask (with dBias when it is learned), at multi-tile and ragged lengths, BSHD q/k/v. (A learned
    bias at L = 129 is kept: cuDNN 9.19 has no backward plan for its dBias on an H100; tests/test_cuda.py
    pins that.)"""
    g = torch.Generator(device="cuda").manual_seed(1)
    B, D = 2, 64
    x = [torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]
    bias = (torch.randn(1, H, L, L, device="cuda", generator=g) * 0.5).to(torch.bfloat16).requires_grad_(learned)
    dout = torch.randn(B, H, L, D, device="cuda", generator=g)

    def fn(q, k, v, bias):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias)

    report = te_compile.explain(fn, *x, bias.detach().requires_grad_(learned), serve="always")
    assert [d.runs_on for d in report.decisions] == ["cudnn"], str(report)
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", serve="always"), fullgraph=True)

    def run(f, upcast):
        args = [t.detach().float() if upcast else t.detach() for t in x]
        args = [a.requires_grad_() for a in args]
        b = bias.detach().float() if upcast else bias.detach()
        b.requires_grad_(learned)
        out = f(*args, b)
        out.backward(dout.to(out.dtype))
        return [out.detach().float()] + [a.grad.float() for a in args] + ([b.grad.float()] if learned else [])

    want = run(fn, True)
    for i in range(3):
        before = _hits()
        got = run(compiled, False)
        errs = [_rows_err(a, b) for a, b in zip(got, want)]
        assert max(errs) <= ROWS_TOL, errs
    assert _hits() - before == 2, native.stats()


def test_blockmask_calls_run_natively_only_after_the_check():
    """A call carrying a BlockMask runs in C++ once te_compile has checked that BlockMask; a new BlockMask
    object of the same shape goes through the check (Python) first."""
    L = 256

    def causal(b, h, q, kv):
        return q >= kv

    def fn(q, k, v, bm):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0), block_mask=bm)

    q, k, v = (torch.randn(1, H, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", serve="always"), fullgraph=True)
    bm = create_block_mask(causal, 1, 1, L, L, device="cuda")
    with torch.no_grad():
        compiled(q, k, v, bm)
        before = _hits()
        compiled(q, k, v, bm)
        assert _hits() - before == 1
        bm2 = create_block_mask(causal, 1, 1, L, L, device="cuda")
        before, misses = _hits(), native.stats()["misses"]
        out = compiled(q, k, v, bm2)
        assert (_hits() - before, native.stats()["misses"] - misses) == (0, 1)
        torch.testing.assert_close(out.float(), fn(q.float(), k.float(), v.float(), bm2), atol=3e-2, rtol=3e-2)


def test_cuda_graph_replay_runs_the_native_kernels(monkeypatch):
    """mode="reduce-overhead": the te op the CUDA graph records is the native kernel (its hits count while the
    graph is warmed up and recorded), and replays agree with eager."""
    L = 512
    monkeypatch.setenv("TE_COMPILE_SERVE", "always")

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0))

    q, k, v = (torch.randn(2, H, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    compiled = torch.compile(fn, backend="te_compile", mode="reduce-overhead")
    want = fn(q.float(), k.float(), v.float())
    before = _hits()
    with torch.no_grad():
        for _ in range(4):
            out = compiled(q, k, v)
            assert _rows_err(out.float(), want) <= ROWS_TOL
    assert _hits() > before, native.stats()


def test_replays_launch_a_captured_graph_that_reads_each_calls_data():
    """A runner that sees the same pointers again launches the CUDA graph it captured for them: the counts show
    captures and replays, every call matches eager, and after q changes in place (same pointers) the replayed
    graph computes with the new q."""
    L = 384

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=_softcap, block_mask=bm)

    bm = create_block_mask(_causal, 1, 1, L, L, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, H, L, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    compiled = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", serve="always"), fullgraph=True)
    assert native.set_replay(True) is True  # on by default
    start = native.stats()
    with torch.no_grad():
        for step in range(8):
            if step == 5:  # new data at the same addresses
                q.copy_(torch.randn(q.shape, device="cuda", dtype=q.dtype, generator=g))
            want = fn(q.float(), k.float(), v.float())
            out = compiled(q, k, v)
            assert _rows_err(out.float(), want) <= ROWS_TOL, step
            del out
    end = native.stats()
    assert end["captures"] > start["captures"] and end["replays"] > start["replays"], (start, end)


def test_replays_off_executes_every_call():
    """``set_replay(False)``: calls run cuDNN's execute (no capture, no replay) and still match eager."""
    L = 256
    q, k, v = (torch.randn(1, H, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=_softcap),
                             backend=te_compile.backend(inner="aot_eager", serve="always"), fullgraph=True)
    native.set_replay(False)
    try:
        start = native.stats()
        with torch.no_grad():
            for _ in range(4):
                out = compiled(q, k, v)
                assert _rows_err(out.float(), flex_attention(q.float(), k.float(), v.float(), score_mod=_softcap)) \
                    <= ROWS_TOL
                del out
        end = native.stats()
        assert (end["captures"], end["replays"]) == (start["captures"], start["replays"])
        assert end["hits"] - start["hits"] >= 3
    finally:
        native.set_replay(True)


@pytest.mark.parametrize("name", ["sdpa_causal", "flex_none", "flex_softcap_causal", "flex_sliding_window"])
def test_a_compiled_attention_alone_runs_without_inductor_and_matches_eager(name):
    """``torch.compile(attention)`` with Inductor: the served graph is te_compile's op alone, called directly
    (te_compile.runtime.direct), its backward recorded by the op's own autograd; forward and gradients against eager
    float32, over repeated calls (replays), and the calls run in C++."""
    L = 1000
    if name == "sdpa_causal":
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    else:
        mask = {"flex_none": None, "flex_softcap_causal": _causal,
                "flex_sliding_window": lambda b, h, q, kv: (q >= kv) & (q - kv <= 100)}[name]
        fn, _ = _flex(_softcap if "softcap" in name else None, mask, L=L)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, H, L, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    dout = torch.randn(2, H, L, 64, device="cuda", generator=g)
    want_out, want_grads = _run(fn, q.float(), k.float(), v.float(), dout)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=te_compile.backend(serve="always"))
    from te_compile.report import Report, record_reports
    with record_reports() as graphs, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a reference fallback would warn
        for _ in range(4):
            before = _hits()
            out, grads = _run(compiled, q, k, v, dout)
            errs = {"out": _rows_err(out, want_out), **{n: _rows_err(a, b) for n, a, b in zip("qkv", grads, want_grads)}}
            assert max(errs.values()) <= ROWS_TOL, errs
            assert max([rel_err(out, want_out)] + [rel_err(a, b) for a, b in zip(grads, want_grads)]) <= BF16_TOL
    head = Report(list(graphs)).table().splitlines()[0]
    assert "1 on cuDNN" in head and "called without Inductor" in head, head
    assert _hits() - before == 2, (counters.declined, native.stats())


def test_a_failed_execute_warns_once_with_cudnns_status_and_the_call_still_matches_eager():
    """An execute cuDNN refuses (forced through the test hook) surfaces once, with the status, and the runner is
    not tried again: its calls go through Python and still return eager's numbers."""
    L = 256
    q, k, v = (torch.randn(1, H, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=_softcap),
                             backend=te_compile.backend(inner="aot_eager", serve="always"), fullgraph=True)
    want = flex_attention(q.float(), k.float(), v.float(), score_mod=_softcap)
    with torch.no_grad():
        compiled(q, k, v)  # builds the runner and hands it to C++
        start = native.stats()
        native.fail_next(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = [compiled(q, k, v) for _ in range(4)]
        end = native.stats()
    native.fail_next(0)
    said = [str(w.message) for w in caught if "native call path could not run" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "cudnnBackendExecute" in said[0] and "5000" in said[0], said[0]
    assert end["failed_runners"] - start["failed_runners"] == 1
    assert end["hits"] == start["hits"], (start, end)  # never tried in C++ again
    for out in outs:
        assert _rows_err(out.float(), want) <= ROWS_TOL


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_runners_that_leave_their_tables_destroy_their_plans():
    """Every runner the tables drop (what an eviction from the graph cache does: te_compile.runtime.kernels
    clear_runners) destroys its cuDNN execution plan: 1000 drops and reloads leave as many plans alive as one,
    and the process's memory does not grow with them."""
    L = 256
    q, k, v = (torch.randn(1, H, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=_softcap),
                             backend=te_compile.backend(inner="aot_eager", serve="always"), fullgraph=True)
    want = flex_attention(q.float(), k.float(), v.float(), score_mod=_softcap)
    with torch.no_grad():
        compiled(q, k, v)
        for i in range(1000):
            if i == 100:
                torch.cuda.synchronize()
                rss = _rss_mb()
            kernels.clear_runners()  # every runner of this process, this test's and any other's
            assert native.stats()["plans"] == 0, (i, native.stats())
            out = compiled(q, k, v)  # Python's runner, handed to C++ again: a new plan
            assert native.stats()["plans"] == 1, (i, native.stats())
        torch.cuda.synchronize()
        grew = _rss_mb() - rss
    assert _rows_err(out.float(), want) <= ROWS_TOL
    assert grew < 16, f"the process grew {grew:.1f} MB over 900 plan drops and reloads"


def test_a_graph_leaving_the_cache_destroys_only_its_runners_plans():
    """te_compile.cudnn.graphs' cache evicts its least recently used graph alone: C++ drops that graph's runner (its
    plan destroyed) and keeps running the others."""
    from te_compile.cudnn import runners
    cache = runners.graphs.cache
    compiled = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=_softcap),
                             backend=te_compile.backend(inner="aot_eager", serve="always"), dynamic=False)
    qkv = {L: [torch.randn(1, H, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for L in (256, 512, 768)}
    size = cache.maxsize
    try:
        with torch.no_grad():
            kernels.clear_runners()
            cache.clear()
            for L in (256, 512):
                compiled(*qkv[L])
            assert native.stats()["plans"] == 2, native.stats()
            cache.maxsize = len(cache)  # each length put as many graphs in it (the compile's check, the call)
            compiled(*qkv[768])  # as many again: the 256-token ones, the least recently used, leave the cache
            s = native.stats()
            assert s["plans"] == 2 and s["forward_runners"] == 2, s
            hits = s["hits"]
            out = compiled(*qkv[512])  # still in C++
            assert native.stats()["hits"] == hits + 1
    finally:
        cache.maxsize = size
    q, k, v = qkv[512]
    assert _rows_err(out.float(), flex_attention(q.float(), k.float(), v.float(), score_mod=_softcap)) <= ROWS_TOL
