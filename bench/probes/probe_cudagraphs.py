"""Why do te_compile's ops not record in CUDA graphs (mode="reduce-overhead")? (diagnostic)

    TE_COMPILE_CUDAGRAPH_UNSAFE=0 python3 bench/probes/probe_cudagraphs.py [--variant NAME] [--no-asserts]

Drops the ops' cudagraph_unsafe tag (env, read at import), runs a few training steps of one
attention call under mode="reduce-overhead", and on a cudagraph-pool error prints the history of
every storage involved (which op made or received it, in which step and cudagraph phase).
Each step is checked against eager float32.
"""

import argparse
import os
import sys
import traceback

os.environ.setdefault("TE_COMPILE_CUDAGRAPH_UNSAFE", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import te_compile  # noqa: E402
import te_compile.ops as ops  # noqa: E402
from te_compile import kernels  # noqa: E402
from torch._inductor import cudagraph_trees  # noqa: E402

history: dict[int, list[str]] = {}
state = {"step": -1, "phase": "?"}


def note(ptr, what):
    if ptr:
        history.setdefault(ptr, []).append(f"step {state['step']} {state['phase']}: {what}")


def wrap(name, f):
    def g(*a, **k):
        for i, t in enumerate(x for x in a if isinstance(x, torch.Tensor)):
            note(t.untyped_storage().data_ptr(), f"{name} input {i} {tuple(t.shape)} {t.dtype}")
        out = f(*a, **k)
        for i, t in enumerate(out if isinstance(out, tuple) else (out,)):
            if isinstance(t, torch.Tensor):
                note(t.untyped_storage().data_ptr(), f"{name} output {i} {tuple(t.shape)} {t.dtype}")
        return out
    return g


def where(ptr):
    """(pool id, stream, thread) of the allocator segment holding ptr."""
    import threading
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return (f"pool {seg.get('segment_pool_id')} stream {seg.get('stream')} "
                    f"cur_stream {torch.cuda.current_stream().cuda_stream} thread {threading.get_ident() % 10000}")
    return "not in any allocator segment"


def wrap_located(name, f):
    def g(*a, **k):
        out = f(*a, **k)
        for i, t in enumerate(out if isinstance(out, tuple) else (out,)):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr():
                note(t.untyped_storage().data_ptr(), f"{name} output {i} {tuple(t.shape)}: {where(t.data_ptr())}")
        return out
    return g


ops.attn_fwd_cuda = kernels.attn_fwd_cuda = wrap("attn_fwd", kernels.attn_fwd_cuda)
ops.attn_bwd_cuda = kernels.attn_bwd_cuda = wrap("attn_bwd", kernels.attn_bwd_cuda)
# under a dispatch mode (cudagraph warm-up has one) the dispatcher calls the registered CUDA kernel,
# not the names patched above; the cuDNN entry points are looked up at call time
from te_compile.cudnn import graphs  # noqa: E402
graphs.forward = wrap_located("graphs.forward", graphs.forward)
graphs.backward = wrap_located("graphs.backward", graphs.backward)

for cls, phase in ((cudagraph_trees.CUDAWarmupNode, "warmup"), (cudagraph_trees.CUDAGraphNode, "record")):
    for meth in ("run", "_record") if phase == "record" else ("run",):
        if hasattr(cls, meth):
            orig_m = getattr(cls, meth)

            def m(self, *a, _orig=orig_m, _phase=f"{phase}.{meth}", **k):
                prev = state["phase"]
                state["phase"] = f"{_phase} node{getattr(self, 'id', '?')}"
                try:
                    return _orig(self, *a, **k)
                finally:
                    state["phase"] = prev
            setattr(cls, meth, m)

orig_check = cudagraph_trees.check_memory_pool


def check(device, pool_id, live):
    try:
        return orig_check(device, pool_id, live)
    except RuntimeError as e:
        import re
        print("CHECK FAILED in phase", state["phase"], "step", state["step"])
        for p in re.findall(r"\{([0-9, ]+)\}", str(e))[0].split(","):
            p = int(p)
            print("  NOT IN POOL:", p)
            for h in history.get(p, ["(no op saw it)"]):
                print("     ", h)
            for seg in torch.cuda.memory_snapshot():
                if seg["address"] <= p < seg["address"] + seg["total_size"]:
                    addr = seg["address"]
                    for blk in seg["blocks"]:
                        if addr <= p < addr + blk["size"]:
                            print(f"      now: segment pool {seg.get('segment_pool_id')} stream {seg.get('stream')}"
                                  f" block at {addr} (+{p - addr}) size {blk['size']} state {blk['state']}")
                        addr += blk["size"]
            for w in live:
                if w.data_ptr() == p:
                    print("      weakref alive:", w() is not None)
        print("  live storages checked:", [w.data_ptr() for w in live])
        raise


cudagraph_trees.check_memory_pool = check


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# --variant toy: a plain Python custom op with te_compile's shape of outputs (out, lse) and a backward
# that reads the saved lse; is the pool error ours or any such op's?
@torch.library.custom_op("te_probe::fwd", mutates_args=())
def toy_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5, -1)
    return (p @ v.float()).to(q.dtype), torch.logsumexp(q.float() @ k.float().transpose(-1, -2), -1)


@toy_fwd.register_fake
def _(q, k, v):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("te_probe::bwd", mutates_args=())
def toy_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (do * lse.unsqueeze(-1).to(do.dtype)), k * 1, v * 1


@toy_bwd.register_fake
def _(do, q, k, v, lse):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[1])


def _backward(ctx, dout, dlse):
    q, k, v, lse = ctx.saved_tensors
    return toy_bwd(dout, q, k, v, lse)


toy_fwd.register_autograd(_backward, setup_context=_setup)


def toy(q, k, v):
    return toy_fwd(q, k, v)[0]


# --variant cudnn_op: te_compile's cuDNN path (graphs.forward / graphs.backward) inside a plain
# @custom_op pair: is the pool error in the cuDNN execute path or in how te_compile's ops are registered?
@torch.library.custom_op("te_probe::cfwd", mutates_args=())
def cudnn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from te_compile.spec import AttentionSpec
    if os.environ.get("PROBE_FWD") == "torch":  # the same outputs from torch's own cuDNN SDPA
        o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True)[:2]
        return o.clone(), lse.reshape(q.shape[:3]).float().clone()
    return graphs.forward(q, k, v, None, AttentionSpec(mask="causal"))


@cudnn_fwd.register_fake
def _(q, k, v):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("te_probe::cbwd", mutates_args=())
def cudnn_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from te_compile.spec import AttentionSpec
    if os.environ.get("PROBE_BWD") == "torch":  # no cuDNN in the backward: gradients wrong, pool behaviour shown
        return do * lse.unsqueeze(-1).to(do.dtype), k * 1, v * 1
    dq, dk, dv, _ = graphs.backward(do, q, k, v, o, lse, None, AttentionSpec(mask="causal"), False)
    return dq, dk, dv


@cudnn_bwd.register_fake
def _(do, q, k, v, o, lse):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _csetup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)


def _cbackward(ctx, dout, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    return cudnn_bwd(dout, q, k, v, o, lse)


cudnn_fwd.register_autograd(_cbackward, setup_context=_csetup)


def cudnn_toy(q, k, v):
    return cudnn_fwd(q, k, v)[0]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="train", choices=["train", "infer", "toy", "te_ref", "cudnn_op", "infer_ref"])
    p.add_argument("--no-asserts", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prewarm", action="store_true", help="build the cuDNN graphs eagerly before compiling")
    p.add_argument("--public", action="store_true", help="FE public execute only (graphs.RAW_EXECUTE = False)")
    a = p.parse_args()
    if a.no_asserts:
        torch._inductor.config.triton.slow_path_cudagraph_asserts = False
    import inspect
    print(inspect.getsource(cudagraph_trees._use_cuda_memory_pool_manager))
    print("torch", torch.__version__, "tags", torch.ops.te_compile.attn_fwd.default.tags, "variant", a.variant,
          "asserts", torch._inductor.config.triton.slow_path_cudagraph_asserts)
    if a.variant == "toy":
        compiled = torch.compile(toy, mode="reduce-overhead")
        for step in range(3):
            state["step"] = step
            q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            try:
                compiled(q, k, v).backward(torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16))
                print("step", step, "ok")
            except Exception as e:  # noqa: BLE001
                print("step", step, "FAILED:", type(e).__name__, str(e)[:300])
                return 1
        print("RESULT toy ok")
        return 0
    if a.public:
        graphs.RAW_EXECUTE = False
    if a.prewarm:
        x = [torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
        (cudnn_toy if a.variant == "cudnn_op" else sdpa)(*x).sum().backward() if a.variant == "cudnn_op" else None
        if a.variant != "cudnn_op":
            from te_compile.spec import AttentionSpec
            xd = [t.detach() for t in x]
            o, lse = graphs.forward(*xd, None, AttentionSpec(mask="causal"))
            graphs.backward(torch.randn_like(o), *xd, o, lse, None, AttentionSpec(mask="causal"), False)
        torch.cuda.synchronize()
        print("prewarmed: cached graphs", len(graphs.cache))
    if a.variant == "cudnn_op":
        compiled = torch.compile(cudnn_toy, mode="reduce-overhead")
    elif a.variant == "te_ref":  # te_compile's ops and registration, the reference math inside
        compiled = torch.compile(sdpa, backend=te_compile.backend(serve="always", target="reference"),
                                 mode="reduce-overhead")
    else:
        compiled = torch.compile(sdpa, backend=te_compile.backend(serve="always"), mode="reduce-overhead")
    g = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for step in range(a.steps):
        state["step"] = step
        q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        try:
            if a.variant == "infer":
                with torch.no_grad():
                    out = compiled(q, k, v).float().clone()
                got, want = [out], [sdpa(q.float(), k.float(), v.float())]
            else:
                q, k, v = (t.requires_grad_() for t in (q, k, v))
                dout = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, generator=g)
                out = compiled(q, k, v)
                out.backward(dout)
                got = [out.detach().float().clone()] + [t.grad.float() for t in (q, k, v)]
                qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
                ref = sdpa(qf, kf, vf)
                ref.backward(dout.float())
                want = [ref.detach()] + [t.grad for t in (qf, kf, vf)]
            errs = [((x - y).abs().max() / y.abs().max()).item() for x, y in zip(got, want)]
            worst = max(worst, *errs)
            print("step", step, "ok, rel errs", [f"{e:.1e}" for e in errs], flush=True)
        except Exception as e:  # noqa: BLE001
            print("step", step, "FAILED:", type(e).__name__, str(e)[:300])
            traceback.print_exc(limit=12, file=sys.stdout)
            return 1
    stats = torch._inductor.cudagraph_trees.get_container(0).tree_manager if hasattr(
        torch._inductor.cudagraph_trees, "get_container") else None
    if stats is not None:
        print("cudagraph tree: recorded nodes", sum(1 for _ in stats.nodes.values()) if hasattr(stats, "nodes") else "?")
    print("RESULT", "ok" if worst < 2e-2 else "WRONG", "worst rel err", f"{worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
