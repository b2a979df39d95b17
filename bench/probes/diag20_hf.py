"""Class 3: HF Llama greedy generate with a static cache under mode=reduce-overhead (one variant per process)."""
import faulthandler, sys, os
faulthandler.enable()
import torch, transformers
variant = sys.argv[1]
impl = sys.argv[2] if len(sys.argv) > 2 else "sdpa"
cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                               num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=512)
cfg._attn_implementation = impl
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).cuda().to(torch.bfloat16).eval()
ids = torch.randint(0, 1000, (1, 16), device="cuda")
nohf = variant.endswith("_nohf")  # Hugging Face's own auto-compile of the decode step off
if nohf:
    variant = variant[:-5]
    model.generation_config.disable_compile = True
ref = model.generate(ids, max_new_tokens=32, do_sample=False, cache_implementation="static")
print("HF auto-compiled the decode step:", hasattr(model, "_compiled_call"))
import te_compile
if variant == "plain":
    model.forward = torch.compile(model.forward, mode="reduce-overhead")
elif variant == "te":
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant == "te_always":
    model.forward = torch.compile(model.forward, backend=te_compile.backend(serve="always"), mode="reduce-overhead")
elif variant == "fx_direct":  # a custom backend that only calls compile_fx with the mode's patches (no rewrite)
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor import list_mode_options
    def be(gm, ex, mode=None, options=None):
        return compile_fx(gm, ex, config_patches=list_mode_options("reduce-overhead"))
    model.forward = torch.compile(model.forward, backend=be, mode="reduce-overhead")
elif variant == "fx_cudnn":  # fx_direct after the cuDNN frontend built and validated a graph on the CPU side
    import cudnn
    from te_compile.cudnn import check as _chk
    g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT)
    print("cudnn imported", cudnn.backend_version())
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor import list_mode_options
    def be(gm, ex, mode=None, options=None):
        return compile_fx(gm, ex, config_patches=list_mode_options("reduce-overhead"))
    model.forward = torch.compile(model.forward, backend=be, mode="reduce-overhead")
elif variant == "te_nocheck":  # te_compile with every site kept for speed without calling the cuDNN check
    import importlib
    B = importlib.import_module("te_compile.backend")
    from te_compile.reasons import Reason, SLOWER
    B._checker = lambda *a, **k: (lambda *x, **y: Reason("kept for speed: probe", SLOWER))
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant.startswith("te_bisect_"):
    import importlib
    B = importlib.import_module("te_compile.backend")
    what = variant[len("te_bisect_"):]
    if what == "nocopy":
        B._copy_graph = lambda g: g
    elif what == "nolazy":
        B.category = lambda r: "other"
    elif what == "noreport":
        B._finish = lambda *a, **k: None
    elif what == "passthrough":
        B.rewrite_graph = lambda gm, *a, **k: []
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant == "fx_wrapper":  # a custom backend that calls torch's Inductor wrapper with the mode's options
    from torch._inductor import list_mode_options
    def be(gm, ex, mode=None, options=None):
        return torch._TorchCompileInductorWrapper(None, list_mode_options("reduce-overhead"), None)(gm, ex)
    model.forward = torch.compile(model.forward, backend=be, mode="reduce-overhead")
elif variant == "te_nowrapper":  # te_compile calling compile_fx directly
    import importlib
    B = importlib.import_module("te_compile.backend")
    from torch._inductor.compile_fx import compile_fx
    B._inductor_wrapper = lambda cfg: (lambda gm, ex: compile_fx(gm, ex, config_patches=cfg))
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant == "te_all":  # te_compile with the copy, the rewrite, the report and the checker all removed
    import importlib
    B = importlib.import_module("te_compile.backend")
    B._copy_graph = lambda g: g
    B._finish = lambda *a, **k: None
    B.rewrite_graph = lambda gm, *a, **k: []
    B._checker = lambda *a, **k: None
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant == "fx_te_inner":  # a custom backend calling te_compile's _inner_compile
    from te_compile import backend as B
    def be(gm, ex, mode=None, options=None):
        return B._inner_compile("inductor", gm, ex, B._inductor_config("inductor", mode, options))
    model.forward = torch.compile(model.forward, backend=be, mode="reduce-overhead")
elif variant == "fx_named":  # fx_direct registered under a name, like te_compile's entry point
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor import list_mode_options
    from torch._dynamo import register_backend
    @register_backend(name="probe_named")
    def be(gm, ex, mode=None, options=None):
        return compile_fx(gm, ex, config_patches=list_mode_options("reduce-overhead"))
    model.forward = torch.compile(model.forward, backend="probe_named", mode="reduce-overhead")
elif variant == "te_nochecker":  # te_compile with only the checker removed (no cuDNN import at compile time)
    import importlib
    B = importlib.import_module("te_compile.backend")
    B._checker = lambda *a, **k: None
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant == "te_preimport":  # te_compile with its cuDNN modules imported before compiling
    import te_compile.cudnn.check, te_compile.cudnn.cost  # noqa: F401
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant == "te_norewrite_nocopy":
    import importlib
    B = importlib.import_module("te_compile.backend")
    B._copy_graph = lambda g: g
    B.rewrite_graph = lambda gm, *a, **k: []
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant in ("te_only_report", "te_only_rewrite", "te_only_copy"):  # te_all with one part put back
    import importlib
    B = importlib.import_module("te_compile.backend")
    keep = variant[len("te_only_"):]
    if keep != "copy":
        B._copy_graph = lambda g: g
    if keep != "report":
        B._finish = lambda *a, **k: None
    if keep != "rewrite":
        B.rewrite_graph = lambda gm, *a, **k: []
    B._checker = lambda *a, **k: None
    model.forward = torch.compile(model.forward, backend="te_compile", mode="reduce-overhead")
elif variant == "te_default_mode":
    model.forward = torch.compile(model.forward, backend="te_compile")
from te_compile.report import record_reports, Report
rr = record_reports(); reps = rr.__enter__()
try:
    out = model.generate(ids, max_new_tokens=32, do_sample=False, cache_implementation="static")
    agree = (out[:, ids.shape[1]:] == ref[:, ids.shape[1]:]).float().mean().item()
    print(f"HF {variant} {impl}: ok, token agreement {agree:.3f}")
except Exception as e:
    import traceback; traceback.print_exc()
    print(f"HF {variant} {impl}: raised {type(e).__name__}: {str(e).splitlines()[0][:300]}")
if variant.startswith("te"):
    print(Report(reps[:3]).table() if reps else "no reports")
