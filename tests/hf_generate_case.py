"""One Hugging Face generation run for tests/test_cuda_generate.py, in its own process (a crash must not take
the test session down): greedy ``generate`` with a static cache, ``model.forward`` compiled with plain
torch.compile or te_compile (``te_compile-always``: with serve="always"). Prints one JSON line: {"ok", "agree",
"error", "decisions"}; ``decisions``: for te_compile, each attention site's [runs_on, reason category, reason or
note] as its graphs were compiled.

    python3 tests/hf_generate_case.py {plain|te_compile|te_compile-always} {sdpa|flex_attention} {default|reduce-overhead|reduce-overhead-called}

``reduce-overhead-called``: the compiled forward is called from a plain Python function (as a user's wrapper
would). Under reduce-overhead plain torch.compile's process can die with a segfault on torch 2.11 (an overwritten
CUDA-graph output reaches Inductor's static launcher) rather than raise; te_compile must raise
(docs/cudnn-notes.md, "A segfault under CUDA graphs").
"""

import contextlib
import faulthandler
import json
import sys

faulthandler.enable()


def main(which: str, impl: str, mode: str) -> None:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                                   num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                   max_position_embeddings=512)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, 1000, (1, 16), device="cuda")
    kw = dict(max_new_tokens=32, do_sample=False, cache_implementation="static")
    # generate compiles the decode step itself (plain Inductor, reduce-overhead) when the cache is static; off, so
    # that the forward compiled here is what runs each step
    model.generation_config.disable_compile = True
    ref = model.generate(ids, **kw)
    compile_kw = {} if mode == "default" else {"mode": mode.replace("-called", "")}
    if which.startswith("te_compile"):
        import te_compile
        compile_kw["backend"] = te_compile.backend(serve="always") if which == "te_compile-always" else "te_compile"
    compiled = torch.compile(model.forward, **compile_kw)
    if mode.endswith("-called"):
        def forward(*args, **kwargs):
            return compiled(*args, **kwargs)
        model.forward = forward
    else:
        model.forward = compiled
    res = {"ok": False, "agree": None, "error": None, "decisions": []}
    graphs: list = []
    if which.startswith("te_compile"):  # (the plain runs do not import te_compile)
        from te_compile.report import record_reports
        recording = record_reports()
    else:
        recording = contextlib.nullcontext(graphs)
    with recording as graphs:
        try:
            out = model.generate(ids, **kw)
            res["ok"] = True
            res["agree"] = (out[:, 16:] == ref[:, 16:]).float().mean().item()
        except Exception as e:  # noqa: BLE001 - the test compares this with plain torch.compile's
            res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if graphs:
        from te_compile.reasons import category
        res["decisions"] = [[d.runs_on, category(d.reason) if d.reason else "", str(d.reason or d.note)[:300]]
                            for g in graphs for d in g.decisions]
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
