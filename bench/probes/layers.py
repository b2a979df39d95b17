"""Host µs per call of each layer under a compiled flex causal forward (no syncs in the loops).

    python3 bench/probes/layers.py
"""

from __future__ import annotations

import time

import torch


def host_us(fn, n=300):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return dt


def print_profile(fn, n: int = 200, sort: str = "tottime", limit: int = 25) -> None:
    """cProfile ``n`` calls of ``fn`` (then a sync) and print the top ``limit`` rows."""
    import cProfile
    import pstats
    import sys

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr, stream=sys.stdout).sort_stats(sort).print_stats(limit)


def main() -> None:
    import te_compile  # noqa: F401
    from te_compile import blockmask, kernels
    from te_compile.cudnn import graphs
    from te_compile.spec import AttentionSpec
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, L, D = 2, 16, 1024, 128  # short kernels so the GPU never gates the host
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bm = create_block_mask(lambda b, h, q_, kv: q_ >= kv, 1, 1, L, L, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm)

    te = torch.compile(fn, backend="te_compile")
    ind = torch.compile(fn)
    rows = []
    rows.append(("compiled te_compile flex causal (requires_grad)", lambda: te(q, k, v)))
    rows.append(("compiled inductor flex causal (requires_grad)", lambda: ind(q, k, v)))
    with torch.no_grad():
        te(q, k, v)
        ind(q, k, v)
    def te_ng():
        with torch.no_grad():
            return te(q, k, v)
    def ind_ng():
        with torch.no_grad():
            return ind(q, k, v)
    rows.append(("compiled te_compile flex causal (no_grad)", te_ng))
    rows.append(("compiled inductor flex causal (no_grad)", ind_ng))
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    sdpa_spec = AttentionSpec(mask="causal").key()
    spec = AttentionSpec(mask="none", source="flex", mask_mod="(ge q_idx kv_idx)").key()
    s = AttentionSpec.from_key(spec)
    rows.append(("op eager autograd (sdpa causal spec)", lambda: torch.ops.te_compile.attn_fwd(q, k, v, None, [], sdpa_spec)))
    rows.append(("op no-grad tensors (sdpa causal spec)", lambda: torch.ops.te_compile.attn_fwd(qd, kd, vd, None, [], sdpa_spec)))
    rows.append(("op no-grad tensors (flex mask_mod spec)", lambda: torch.ops.te_compile.attn_fwd(qd, kd, vd, None, [], spec)))
    rows.append(("kernels.attn_fwd_cuda direct", lambda: kernels.attn_fwd_cuda(qd, kd, vd, None, [], spec)))
    rows.append(("graphs.forward direct", lambda: graphs.forward(qd, kd, vd, None, s, [])))
    out, lse = graphs.forward(qd, kd, vd, None, s, [])
    plan = next(iter(graphs.plans().values()))
    built = plan.built
    ws = torch.empty(max(built.workspace, 1), dtype=torch.uint8, device="cuda")
    h = graphs.handle(q.device)
    bufs = [qd, kd, vd, out, lse]
    rows.append(("graph.execute only", lambda: built.graph.execute(bufs, ws, handle=h, tensor_uids=built.uids)))
    rows.append(("handle (set_stream)", lambda: graphs.handle(q.device)))
    rows.append(("3 x torch.empty", lambda: (torch.empty(B, H, L, D, dtype=torch.bfloat16, device="cuda"),
                                             torch.empty(B, H, L, dtype=torch.float32, device="cuda"),
                                             torch.empty(1, dtype=torch.uint8, device="cuda"))))
    rows.append(("signature", lambda: graphs.signature("fwd", s, None, (qd, kd, vd, None))))
    rows.append(("from_key", lambda: AttentionSpec.from_key(spec)))
    blocks = [bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices]
    bs = AttentionSpec(mask="none", source="flex", mask_mod="(ge q_idx kv_idx)", block_q=128, block_kv=128, block_full=True)
    rows.append(("blockmask.check_call (cached)", lambda: blockmask.check_call(bs, qd, kd, [], blocks)))

    @torch.library.custom_op("te_bench::nop6", mutates_args=())
    def nop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
            extra: list[torch.Tensor], spec: str) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty_like(q), q.new_empty(q.shape[:3])
    rows.append(("bare python custom op, same schema", lambda: nop(qd, kd, vd, None, [], spec)))
    for name, f in rows:
        print(f"{name:52s} {host_us(f):8.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
