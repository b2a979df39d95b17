"""Class 3, next bisect step: which compile-time action flips 'raises like plain' into 'segfault'.

Each variant counts the graphs its backend gets (and whether Dynamo's lazy GraphModule was already
recompiled), so a difference in the number or shape of compiled graphs shows."""
import faulthandler, sys, os, traceback
faulthandler.enable()
import torch, transformers
variant = sys.argv[1]
cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                               num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=512)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).cuda().to(torch.bfloat16).eval()
model.generation_config.disable_compile = variant.endswith("_nohf") or "_hf" not in variant
variant = variant.replace("_hf", "")
ids = torch.randint(0, 1000, (1, 16), device="cuda")
ref = model.generate(ids, max_new_tokens=32, do_sample=False, cache_implementation="static")
from torch._inductor import list_mode_options
calls = []


def describe(gm, ex, tag):
    lazy = getattr(type(gm), "_needs_recompile", None)
    calls.append(tag)
    print(f"[backend {len(calls)} {tag}] nodes={len(gm.graph.nodes)} inputs={len(ex)} "
          f"lazy_needs_recompile={lazy() if lazy else None} shapes={[tuple(e.shape) for e in ex if hasattr(e, 'shape')][:6]}",
          flush=True)


def wrapper_backend(read_code=False, real_recompile=False):
    def be(gm, ex, mode=None, options=None):
        describe(gm, ex, "wrapper")
        if read_code:
            _ = gm.code
        if real_recompile:
            gm.real_recompile()
        return torch._TorchCompileInductorWrapper(None, list_mode_options("reduce-overhead"), None)(gm, ex)
    return be


import te_compile
import importlib
B = importlib.import_module("te_compile.backend")
if variant == "wrapper":
    be = wrapper_backend()
elif variant == "wrapper_code":
    be = wrapper_backend(read_code=True)
elif variant == "wrapper_recompile":
    be = wrapper_backend(real_recompile=True)
elif variant.startswith("te"):
    if variant in ("te_only_report", "te_only_report_nocode"):
        B._copy_graph = lambda g: g
        B.rewrite_graph = lambda gm, *a, **k: []
        B._checker = lambda *a, **k: None
    if variant.endswith("_nocode"):
        class _NoCode:
            def __init__(self, gm):
                self.gm = gm
            def __getattr__(self, k):
                if k == "code":
                    return ""
                return getattr(self.gm, k)
        real_finish = B._finish
        B._finish = lambda gm, d, o: real_finish(_NoCode(gm), d, o)
    real_compile = B.compile_graph

    def counted(gm, ex, *a, **k):
        describe(gm, ex, "te")
        return real_compile(gm, ex, *a, **k)
    B.compile_graph = counted
    be = "te_compile"
model.forward = torch.compile(model.forward, backend=be, mode="reduce-overhead")
try:
    out = model.generate(ids, max_new_tokens=32, do_sample=False, cache_implementation="static")
    agree = (out[:, ids.shape[1]:] == ref[:, ids.shape[1]:]).float().mean().item()
    print(f"HF {variant}: ok, token agreement {agree:.3f}", flush=True)
except Exception as e:
    traceback.print_exc()
    print(f"HF {variant}: raised {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
print(f"HF {variant}: backend calls {len(calls)}, HF auto-compiled: {hasattr(model, '_compiled_call')}", flush=True)
