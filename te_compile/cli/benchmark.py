"""Attention benchmark: te_compile vs torch SDPA backends vs torch.compile (SDPA and flex), fwd and bwd.

    te-compile bench [--suite sdpa|flex|all] [--shape 2,16,4096,128] [--iters 50] [--out results.md]
    python3 bench/attention.py ...   (the same)

Runs every implementation side by side in one process on random (never zero) bf16 inputs,
after warm-up; reports the median of ``--iters`` back-to-back calls (CUDA events) in ms and TFLOP/s
(FLOPs of the unmasked part: causal counts half). The backward is timed as
``autograd.grad`` of a retained graph, so it excludes the forward.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .cli_parser import Parser


def _median_ms(fn: Callable[[], object], iters: int, warmup: int = 25) -> float:
    """Median device time per call, calls issued back to back (as in a training loop).

    Each call sits between two CUDA events and nothing synchronizes inside the loop, so the
    host runs ahead and its per-call overhead is hidden whenever it is shorter than the
    kernels (``triton.testing.do_bench`` measures the same way). bench/host_time.py measures
    the host side separately.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in events:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def _flops(B: int, H: int, L: int, S: int, D: int, causal: bool) -> float:
    f = 4.0 * B * H * L * S * D
    return f / 2 if causal else f


def measure(fn: Callable, args: list[torch.Tensor], grads_of: list[int], iters: int) -> tuple[float, float]:
    """(fwd ms, bwd ms) of ``fn(*args)``."""
    out = fn(*args)
    dout = torch.randn_like(out)
    fwd = _median_ms(lambda: fn(*args), iters)
    inputs = [args[i] for i in grads_of]
    out = fn(*args)
    bwd = _median_ms(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True), iters)
    return fwd, bwd


def cases(B: int, H: int, L: int, D: int, dtype: torch.dtype):
    """(name, fn, args, grads_of, causal, torch_backends that accept the case)."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape: int, rg: bool = True) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g).requires_grad_(rg)

    q, k, v = rnd(B, H, L, D), rnd(B, H, L, D), rnd(B, H, L, D)
    bias = (rnd(1, H, L, L, rg=False) * 0.5).requires_grad_()

    def plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def learned_bias(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    all_backends = ["cudnn", "flash", "efficient"]
    return [
        ("no mask", plain, [q, k, v], [0, 1, 2], False, all_backends),
        ("causal", causal, [q, k, v], [0, 1, 2], True, all_backends),
        ("learned float bias", learned_bias, [q, k, v, bias], [0, 1, 2, 3], False, ["cudnn", "efficient"]),
    ]


def flex_cases(B: int, H: int, L: int, D: int, dtype: torch.dtype):
    """flex_attention variants: (name, fn, args, grads_of, density)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    causal = lambda b, h, q_, kv: q_ >= kv  # noqa: E731
    window = lambda b, h, q_, kv: (q_ >= kv) & (q_ - kv <= 1024)  # noqa: E731
    bm_causal = create_block_mask(causal, 1, 1, L, L, device="cuda")
    bm_window = create_block_mask(window, 1, 1, L, L, device="cuda")
    softcap = lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0)  # noqa: E731
    alibi = lambda s, b, h, q_, kv: s + torch.exp2(-((h + 1) * 8.0 / H)) * (kv - q_)  # noqa: E731

    def mk(score_mod, bm):
        def fn(q, k, v):
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
        return fn
    w = min(1.0, (1024 + 1) / L)  # sliding-window density (approx.)
    return [
        ("flex none", mk(None, None), [q, k, v], [0, 1, 2], 1.0),
        ("flex softcap 30", mk(softcap, None), [q, k, v], [0, 1, 2], 1.0),
        ("flex ALiBi", mk(alibi, None), [q, k, v], [0, 1, 2], 1.0),
        ("flex causal", mk(None, bm_causal), [q, k, v], [0, 1, 2], 0.5),
        ("flex sliding window 1024", mk(None, bm_window), [q, k, v], [0, 1, 2], w),
        ("flex softcap + causal", mk(softcap, bm_causal), [q, k, v], [0, 1, 2], 0.5),
    ]


def bias_cases(B: int, H: int, L: int, D: int, dtype: torch.dtype):
    """The bias suite's cases: (name, [(impl, fn or compiled, args, grads_of, sdpa backend or None)])."""
    from torch.nn.attention.flex_attention import flex_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    frozen = torch.randn(1, H, L, L, device="cuda", dtype=dtype, generator=g) * 0.5
    learned = frozen.clone().requires_grad_()
    table = (torch.randn(H, 2 * L - 1, device="cuda", generator=g) * 0.5).requires_grad_()
    rel = torch.arange(L, device="cuda")[:, None] - torch.arange(L, device="cuda")[None, :] + L - 1

    def sdpa_bias(q, k, v, b):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=b)

    def flex_table(q, k, v, table):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + table[h, q_ - kv + L - 1])

    small = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16,
             "num_stages": 1, "num_warps": 4}

    def flex_table_small(q, k, v, table):  # Inductor's default blocks run out of shared memory here
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + table[h, q_ - kv + L - 1],
                              kernel_options=small)

    def sdpa_table(q, k, v, table):  # the table gathered into a dense bias by torch, then SDPA
        return F.scaled_dot_product_attention(q, k, v, attn_mask=table[:, rel].to(q.dtype).unsqueeze(0))

    def impls(fn, args, grads_of, backends, flex=False):
        out = [("te_compile", torch.compile(fn, backend="te_compile", fullgraph=True), args, grads_of, None),
               ("torch.compile flex (inductor)" if flex else "torch.compile (inductor)",
                torch.compile(fn, fullgraph=True), args, grads_of, None)]
        return out + [(f"torch SDPA {b}", sdpa_table if flex else fn, args, grads_of, b) for b in backends]

    return [
        ("frozen float bias", impls(sdpa_bias, [q, k, v, frozen], [0, 1, 2], ["cudnn", "efficient"])),
        ("learned float bias", impls(sdpa_bias, [q, k, v, learned], [0, 1, 2, 3], ["efficient"])),
        ("learned rel-pos table", impls(flex_table, [q, k, v, table], [0, 1, 2, 3], ["efficient"], flex=True)
         + [("torch.compile flex (inductor, small blocks)", torch.compile(flex_table_small, fullgraph=True),
             [q, k, v, table], [0, 1, 2, 3], None)]),
        _document_case(B, H, L, D, q, k, v, impls),
    ]


def _document_case(B: int, H: int, L: int, D: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   impls: Callable) -> tuple:
    """bias_cases' document + causal mask (4 documents of uneven length): flex with its BlockMask, the same
    forced through te_compile as a dense bias, and what a packed / ragged cuDNN path would cost."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cuts = [0, L * 17 // 100, L * 54 // 100, L * 76 // 100, L]  # 4 documents of uneven length
    docs = torch.cat([torch.full((b - a,), i, device="cuda") for i, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    doc_causal = lambda b, h, q_, kv: (docs[q_] == docs[kv]) & (q_ >= kv)  # noqa: E731
    bm_doc = create_block_mask(doc_causal, 1, 1, L, L, device="cuda")

    def flex_doc(q, k, v):
        return flex_attention(q, k, v, block_mask=bm_doc)

    def per_document(q, k, v):  # what a packed/ragged cuDNN path would cost: causal per document
        outs = [F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True)
                for a, b in zip(cuts, cuts[1:])]
        return torch.cat(outs, dim=2)

    cu = torch.tensor([b * L + c for b in range(B) for c in cuts[:-1]] + [B * L], device="cuda", dtype=torch.int32)
    longest = max(b - a for a, b in zip(cuts, cuts[1:]))

    def ragged(q, k, v):  # cuDNN's own varlen (THD) op from the frontend, with the layout copies
        import cudnn.sdpa.fwd.torch_op  # noqa: F401  (registers torch.ops.cudnn.sdpa_fwd)

        def thd(t):
            return t.transpose(1, 2).reshape(B * L, H, D)
        o, _ = torch.ops.cudnn.sdpa_fwd(thd(q), thd(k), thd(v), 1.0 / D ** 0.5, is_causal=True,
                                        cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                                        max_seqlen_kv=longest, return_lse=True)
        return o.reshape(B, L, H, D).transpose(1, 2)

    return ("document + causal mask", impls(flex_doc, [q, k, v], [0, 1, 2], [], flex=True)
            + [("te_compile, dense -inf bias forced", _forced_dense(flex_doc), [q, k, v], [0, 1, 2], None),
               ("per-document causal SDPA cudnn (ragged estimate)", per_document, [q, k, v], [0, 1, 2], "cudnn"),
               ("cuDNN varlen THD (frontend op, with layout copies)", ragged, [q, k, v], [0, 1, 2], None)])


def _forced_dense(fn: Callable) -> Callable:
    """fn compiled by te_compile with a sparse document mask served anyway (as a dense bias);
    compiled on its first call (after run_bias's dynamo reset)."""
    from te_compile.passes import flex

    f = torch.compile(fn, backend="te_compile", fullgraph=True)
    first = [True]

    def call(*args):
        if not first[0]:
            return f(*args)
        saved, flex.MIN_GATHER_MASK_DENSITY = flex.MIN_GATHER_MASK_DENSITY, 0.0
        torch._dynamo.reset()  # the default te_compile row compiled this function already
        try:
            out = f(*args)
        finally:
            flex.MIN_GATHER_MASK_DENSITY = saved
        first[0] = False
        return out
    return call


def run_bias(shape: tuple[int, int, int, int], iters: int, log: Callable[[str], None]) -> list[dict]:
    import te_compile  # noqa: F401

    B, H, L, D = shape
    rows = []
    for name, impls in bias_cases(B, H, L, D, torch.bfloat16):
        torch._dynamo.reset()
        for impl, f, args, grads_of, backend in impls:
            ctx = sdpa_kernel([_BACKENDS[backend]]) if backend else contextlib.nullcontext()
            rows.append(_measure_row(name, impl, f, args, grads_of, 4.0 * B * H * L * L * D, iters, log, ctx))
    return rows


def bias_summary(rows: list[dict]) -> str:
    """The bias suite's rows: frozen- vs learned-bias backward, a learned rel-pos table vs Inductor flex."""
    by = {(r["case"], r["impl"]): r for r in rows}
    out = []
    fz, ln = by.get(("frozen float bias", "te_compile")), by.get(("learned float bias", "te_compile"))
    if fz and ln and fz["bwd_ms"] and ln["bwd_ms"]:
        out.append(f"* te_compile frozen-bias backward {fz['bwd_ms']:.3f} ms vs learned-bias backward "
                   f"{ln['bwd_ms']:.3f} ms: {100 * (1 - fz['bwd_ms'] / ln['bwd_ms']):.0f}% faster (target >= 20%)")
    te = by.get(("learned rel-pos table", "te_compile"))
    ind = by.get(("learned rel-pos table", "torch.compile flex (inductor)"))
    if ind is None or ind["fwd_ms"] is None:  # default blocks found no config: the small-block run
        ind = by.get(("learned rel-pos table", "torch.compile flex (inductor, small blocks)"))
    if te and ind and te["fwd_ms"] and ind["fwd_ms"]:
        out.append(f"* learned rel-pos table fwd+bwd: te_compile {te['fwd_ms'] + te['bwd_ms']:.3f} ms vs Inductor flex "
                   f"{ind['fwd_ms'] + ind['bwd_ms']:.3f} ms: "
                   f"{(ind['fwd_ms'] + ind['bwd_ms']) / (te['fwd_ms'] + te['bwd_ms']):.2f}x (target >= 1.3x)")
    return "\n".join(out)


def run_flex(shape: tuple[int, int, int, int], iters: int, log: Callable[[str], None]) -> list[dict]:
    import te_compile  # noqa: F401

    B, H, L, D = shape
    rows = []
    for name, fn, args, grads_of, density in flex_cases(B, H, L, D, torch.bfloat16):
        flops = 4.0 * B * H * L * L * D * density
        torch._dynamo.reset()
        for impl, f in (("te_compile", torch.compile(fn, backend="te_compile", fullgraph=True)),
                        ("torch.compile flex (inductor)", torch.compile(fn, fullgraph=True))):
            rows.append(_measure_row(name, impl, f, args, grads_of, flops, iters, log))
    return rows


def _measure_row(name: str, impl: str, f: Callable, args: list, grads_of: list[int], flops: float, iters: int,
                 log: Callable[[str], None], ctx=None) -> dict:
    """One table row; an implementation that refuses the case is an n/a row, not a failure."""
    t0 = time.perf_counter()
    try:
        with ctx or contextlib.nullcontext():
            fwd, bwd = measure(f, args, grads_of, iters)
    except Exception as e:  # noqa: BLE001
        log(f"  {name:26s} {impl:30s} n/a ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
        return {"case": name, "impl": impl, "fwd_ms": None, "bwd_ms": None}
    row = {"case": name, "impl": impl, "fwd_ms": fwd, "bwd_ms": bwd,
           "fwd_tflops": flops / fwd / 1e9, "bwd_tflops": 2.5 * flops / bwd / 1e9}
    log(f"  {name:26s} {impl:30s} fwd {fwd:7.3f} ms {row['fwd_tflops']:6.0f} TF/s | "
        f"bwd {bwd:7.3f} ms {row['bwd_tflops']:6.0f} TF/s  ({time.perf_counter() - t0:.1f}s)")
    return row


def speedups(rows: list[dict]) -> str:
    """te_compile vs Inductor flex per case (fwd, bwd, fwd+bwd) and the geometric mean of fwd+bwd."""
    by = {}
    for r in rows:
        by.setdefault(r["case"], {})[r["impl"]] = r
    out, logs = ["| case | fwd speedup | bwd speedup | fwd+bwd speedup |", "|---|---|---|---|"], []
    for case, d in by.items():
        te, ind = d.get("te_compile"), d.get("torch.compile flex (inductor)")
        if not te or not ind or te["fwd_ms"] is None or ind["fwd_ms"] is None:
            continue
        tot = (ind["fwd_ms"] + ind["bwd_ms"]) / (te["fwd_ms"] + te["bwd_ms"])
        logs.append(tot)
        out.append(f"| {case} | {ind['fwd_ms'] / te['fwd_ms']:.2f}x | {ind['bwd_ms'] / te['bwd_ms']:.2f}x | {tot:.2f}x |")
    if logs:
        import math
        out.append(f"| **geometric mean** | | | **{math.exp(sum(map(math.log, logs)) / len(logs)):.2f}x** |")
    return "\n".join(out)


_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}


def run(shape: tuple[int, int, int, int], iters: int, log: Callable[[str], None]) -> list[dict]:
    import te_compile  # noqa: F401  (registers the ops; the backend is found by name)

    B, H, L, D = shape
    rows = []
    for name, fn, args, grads_of, is_causal, backends in cases(B, H, L, D, torch.bfloat16):
        flops = _flops(B, H, L, L, D, is_causal)
        impls: list[tuple[str, Callable, Optional[str]]] = []
        torch._dynamo.reset()
        impls.append(("te_compile", torch.compile(fn, backend="te_compile", fullgraph=True), None))
        impls.append(("torch.compile (inductor)", torch.compile(fn, fullgraph=True), None))
        for b in backends:
            impls.append((f"torch SDPA {b}", fn, b))
        for impl, f, backend in impls:
            ctx = sdpa_kernel([_BACKENDS[backend]]) if backend else contextlib.nullcontext()
            rows.append(_measure_row(name, impl, f, args, grads_of, flops, iters, log, ctx))
    return rows


def to_markdown(rows: list[dict]) -> str:
    out = ["| case | implementation | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["fwd_ms"] is None:
            out.append(f"| {r['case']} | {r['impl']} | n/a | | n/a | |")
        else:
            out.append(f"| {r['case']} | {r['impl']} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.0f} | "
                       f"{r['bwd_ms']:.3f} | {r['bwd_tflops']:.0f} |")
    return "\n".join(out)


def _warm_gpu(seconds: float = 2.0) -> None:
    """Run matmuls for a while so the first measured case does not pay for clock ramp-up."""
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            x @ x
        torch.cuda.synchronize()


def environment() -> str:
    import cudnn

    return (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {cudnn.backend_version()}, "
            f"cuDNN frontend {getattr(cudnn, '__version__', '?')}")


def parser() -> Parser:
    p = Parser("te-compile bench", __doc__.splitlines()[0])
    p.add_argument("--shape", default="2,16,4096,128", help="B,H,S,D of q, k and v (bf16)")
    p.add_argument("--iters", type=int, default=50, help="timed calls per row (after warm-up); the median is kept")
    p.add_argument("--out", help="write the markdown table here")
    p.add_argument("--json", help="write the raw rows here")
    p.add_argument("--suite", choices=["sdpa", "flex", "bias", "all"], default="all",
                   help="sdpa: SDPA forms; flex: flex_attention variants vs Inductor flex; "
                        "bias: frozen / learned bias and a learned relative-position table; all: everything")
    p.add_argument("--traceback", action="store_true", help="on a failure, print the whole traceback too")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    a = parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("te-compile bench: needs a CUDA GPU with cuDNN (torch.cuda.is_available() is False here); "
              "docs/benchmarks.md has measured results", file=sys.stderr)
        return 1
    shape = tuple(int(x) for x in a.shape.split(","))
    # Inductor's compile worker processes start in the background on the first compile and slow
    # the host side of whatever is measured next (1.5-2x measured for the te_compile row that
    # followed; docs/cudnn-notes.md): compile in-process so every row is timed on a quiet machine
    import torch._inductor.config as inductor_config
    inductor_config.compile_threads = 1
    _warm_gpu()
    print(f"# attention benchmark, B,H,S,D = {shape}, bf16 — {environment()}", flush=True)
    rows = []
    if a.suite in ("sdpa", "all"):
        rows += run(shape, a.iters, lambda s: print(s, flush=True))
    flex_rows = run_flex(shape, a.iters, lambda s: print(s, flush=True)) if a.suite in ("flex", "all") else []
    bias_rows = run_bias(shape, a.iters, lambda s: print(s, flush=True)) if a.suite in ("bias", "all") else []
    table = to_markdown(rows + flex_rows + bias_rows)
    if flex_rows:
        table += "\n\n" + speedups(flex_rows)
    if bias_rows:
        table += "\n\n" + bias_summary(bias_rows)
    rows = rows + bias_rows
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(f"{environment()}\n\n{table}\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": environment(), "shape": shape, "rows": rows + flex_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
