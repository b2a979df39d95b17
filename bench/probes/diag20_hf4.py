"""Class 3: does a warm Inductor cache turn plain torch.compile's RuntimeError into the segfault too, and is the
stale tensor already stale when the compiled forward is called (so a check before the call can raise)?

    python3 bench/probes/diag20_hf4.py {plain|te} RUN_TAG     (TORCHINDUCTOR_CACHE_DIR set by the caller)"""
import faulthandler, sys, traceback
faulthandler.enable()
import torch, transformers
which, tag = sys.argv[1], sys.argv[2]
cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                               num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=512)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).cuda().to(torch.bfloat16).eval()
model.generation_config.disable_compile = True
ids = torch.randint(0, 1000, (1, 16), device="cuda")
ref = model.generate(ids, max_new_tokens=32, do_sample=False, cache_implementation="static")
kw = {} if which == "plain" else {"backend": "te_compile"}
compiled = torch.compile(model.forward, mode="reduce-overhead", **kw)
step = [0]


def stale(v):
    try:
        v.data_ptr()
        return False
    except RuntimeError:
        return True


def forward(*args, **kwargs):
    step[0] += 1
    bad = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and stale(v)]
    bad += [i for i, v in enumerate(args) if isinstance(v, torch.Tensor) and stale(v)]
    if bad:
        print(f"[{tag}] step {step[0]}: stale before the call: {bad}", flush=True)
    return compiled(*args, **kwargs)


model.forward = forward
try:
    out = model.generate(ids, max_new_tokens=32, do_sample=False, cache_implementation="static")
    print(f"HF {which} {tag}: ok, agreement {(out[:, 16:] == ref[:, 16:]).float().mean().item():.3f}", flush=True)
except Exception as e:
    traceback.print_exc()
    print(f"HF {which} {tag}: raised at step {step[0]} {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
