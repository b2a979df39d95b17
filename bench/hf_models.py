"""Hugging Face models (random configs, no downloads): training step and inference forward,
te_compile (default serve policy) vs plain torch.compile, side by side in one process (GPU).

    python3 bench/hf_models.py [--json hf.json] [--batch 4 --seq 1024]

4 layers, hidden 1024, 16 heads, head dim 64, bf16. Each model is compiled with both backends, warmed,
then measured in alternating rounds (best median kept); the te_compile report's counts say how many
attention sites were served on cuDNN and how many were kept (and why).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402


MODELS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "gpt2", "bert", "bart")


def _model(kind: str, impl: str):
    """(model, extra inputs) for one architecture: random config, 4 layers, hidden 1024, 16 heads of 64."""
    import transformers

    common = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                  num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096, head_dim=64)
    extra = {}
    if kind == "llama":
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    elif kind == "mistral":
        cfg, cls = transformers.MistralConfig(**common, sliding_window=512), transformers.MistralForCausalLM
    elif kind == "qwen2":
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    elif kind == "qwen3":
        cfg, cls = transformers.Qwen3Config(**common), transformers.Qwen3ForCausalLM
    elif kind == "gemma2":
        cfg = transformers.Gemma2Config(**common, attn_logit_softcapping=50.0, sliding_window=512,
                                        query_pre_attn_scalar=64)
        cls = transformers.Gemma2ForCausalLM
    elif kind == "gemma3":
        cfg = transformers.Gemma3TextConfig(**common, sliding_window=512, query_pre_attn_scalar=64)
        cls = transformers.Gemma3ForCausalLM
    elif kind == "phi3":
        c = dict(common)
        c.pop("head_dim")
        cfg, cls = transformers.Phi3Config(**c, pad_token_id=0), transformers.Phi3ForCausalLM
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=32000, n_embd=1024, n_layer=4, n_head=16, n_positions=4096)
        cls = transformers.GPT2LMHeadModel
    elif kind == "bert":  # padded batch: an attention mask with padding
        cfg = transformers.BertConfig(vocab_size=32000, hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                                      intermediate_size=2816, max_position_embeddings=4096)
        cls = transformers.BertForMaskedLM
        extra["padded"] = True
    elif kind == "bart":
        cfg = transformers.BartConfig(vocab_size=32000, d_model=1024, encoder_layers=2, decoder_layers=2,
                                      encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=2816,
                                      decoder_ffn_dim=2816, max_position_embeddings=4096)
        cls = transformers.BartForConditionalGeneration
    else:
        raise ValueError(kind)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    return cls(cfg).cuda().to(torch.bfloat16), extra


def _inputs(ids: torch.Tensor, extra: dict, labels: bool) -> dict:
    kw = {"input_ids": ids}
    if extra.get("padded"):  # the second half of the batch padded to 3/4 of the length
        mask = torch.ones_like(ids)
        mask[ids.shape[0] // 2:, 3 * ids.shape[1] // 4:] = 0
        kw["attention_mask"] = mask
    if labels:
        kw["labels"] = ids
    return kw


def _time(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def _tune(model, ids, extra) -> dict:
    """te_compile.tune the model for training and for inference (fills the measurement cache, so the te_compile
    column's default policy decides from measurements): per mode, the graph measurements (te_compile.tuning.graph_ab:
    each class's times with it on cuDNN and on torch.compile, and whether it was served), the seconds, and the
    whole-model check (te_compile.api.model_check)."""
    import te_compile
    from te_compile.api.model_check import model_log
    out = {}
    for mode, grad in (("train", True), ("infer", False)):
        t0, nm = time.perf_counter(), len(model_log)
        with torch.set_grad_enabled(grad):
            _, made = te_compile.tune(model, echo=lambda line: print(line, flush=True), **_inputs(ids, extra, grad))
        graphs = [{k: c[k] for k in ("class", "te_ms", "tc_ms", "served")} for c in made]
        models = [{k: c[k] for k in ("te_ms", "tc_ms", "served")} for c in model_log[nm:]]  # the whole-model check
        out[mode] = {"measured": len(made), "seconds": time.perf_counter() - t0, "graphs_measured": graphs,
                     "model_timed_whole": models}
        torch._dynamo.reset()
    return out


def bench(kind: str, impl: str, B: int, L: int, iters: int, rounds: int = 3, mode: str = "default",
          control: bool = False, tune: bool = False, always: bool = False, flash: bool = False) -> dict:
    import te_compile
    from te_compile.cudnn import native
    from te_compile.reasons import category

    from sweep import count_native
    model, extra = _model(kind, impl)
    ids = torch.randint(0, 32000, (B, L), device="cuda")
    torch._dynamo.reset()
    rep = te_compile.explain(model, **_inputs(ids, extra, False))  # decisions without CUDA graphs
    s = rep.summary()
    reasons = sorted({category(d.reason) for d in rep.decisions if d.reason})  # te_compile.reasons.CATEGORIES
    mode_arg = mode
    m = None if mode == "default" else mode
    tuned = _tune(model, ids, extra) if tune else None
    fns = {"te_compile": torch.compile(model, backend="te_compile", mode=m), "torch.compile": torch.compile(model, mode=m)}
    if control:  # plain torch.compile a second time: its ratio to the first is the noise floor (A/A)
        fns["control"] = torch.compile(model, mode=m)
    if always:  # the oracle is the faster of serve="always" and plain torch.compile
        fns["always"] = torch.compile(model, backend=te_compile.backend(serve="always"), mode=m)
    # FlexAttention's FLASH backend (FA4): plain torch.compile, the model's flex calls given kernel_options
    kwargs = {"FLASH": {"kernel_options": {"BACKEND": "FLASH"}}}
    if flash and impl == "flex_attention":
        fns["FLASH"] = torch.compile(model, mode=m)

    def train(f, name=""):
        def step():
            model.zero_grad(set_to_none=True)
            f(**_inputs(ids, extra, True), **kwargs.get(name, {})).loss.backward()
        return step

    def infer(f, name=""):
        def step():
            with torch.no_grad():
                f(**_inputs(ids, extra, False), **kwargs.get(name, {}))
        return step

    row = {"mode": mode, "model": kind, "impl": impl, "sites": s["sites"], "cudnn": s["cudnn"], "kept": s["kept"],
           "reasons": reasons, "tune": tuned}
    from te_compile.report import Report, record_reports
    for mode, mk in (("train", train), ("infer", infer)):
        best = {}
        from torch._dynamo.utils import counters
        for name, f in list(fns.items()):
            skips = counters["inductor"]["cudagraph_skips"]
            t0 = time.perf_counter()
            with record_reports() as graphs:
                try:
                    mk(f, name)()  # compile
                except Exception as e:  # noqa: BLE001 - a FLASH column that does not run is a row entry
                    if name != "FLASH":
                        raise
                    row[mode + "_flash_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
                    print(f"FLASH {mode}: {row[mode + '_flash_error']}", flush=True)
                    continue
            print(f"  {kind} {impl} {mode}: {name} compiled and run once in {time.perf_counter() - t0:.0f} s", flush=True)
            if mode_arg != "default":  # graphs Inductor ran without CUDA graphs (0: all recorded)
                row[f"{mode}_cudagraph_skips_{name}"] = counters["inductor"]["cudagraph_skips"] - skips
            if name == "te_compile" and graphs:  # what the compiled model itself decided (mode included)
                got = Report(list(graphs)).summary()
                row[mode + "_sites"] = {k: got[k] for k in ("sites", "cudnn", "kept")}
        runs = {n: f for n, f in fns.items() if not (n == "FLASH" and mode + "_flash_error" in row)}
        calls: dict = {}  # te_compile's op calls in the measured rounds, per column (bench/sweep.py count_native)
        order = list(runs.items())
        for r in range(rounds):
            # each round starts with the next column, so none is always timed first (bench/sweep.py: the column
            # timed first measured the same compiled step slower on host-bound steps)
            for name, f in order[r % len(order):] + order[:r % len(order)]:
                s0 = native.stats()
                t = _time(mk(f, name), iters)
                s1 = native.stats()
                count_native(calls, name, s0, s1)
                best[name] = min(best.get(name, t), t)
            print(f"  {kind} {impl} {mode}: round {r + 1} of {rounds}: "
                  + ", ".join(f"{n} {t:.2f} ms" for n, t in best.items()), flush=True)
        row[mode] = best
        row[mode + "_native_calls"] = {n: c for n, c in calls.items() if any(c.values())}
        row[mode + "_ratio"] = best["torch.compile"] / best["te_compile"]
        if "control" in best:
            row[mode + "_aa"] = best["torch.compile"] / best["control"]
        if "always" in best:
            row[mode + "_vs_oracle"] = min(best["always"], best["torch.compile"]) / best["te_compile"]
        if "FLASH" in best:
            row[mode + "_vs_flash"] = best["FLASH"] / best["te_compile"]
    print(f"{kind:8s} {impl:15s} sites {s['sites']:2d} cudnn {s['cudnn']:2d} kept {s['kept']:2d}  "
          f"train te {row['train']['te_compile']:7.2f} tc {row['train']['torch.compile']:7.2f} ms "
          f"{row['train_ratio']:.2f}x | infer te {row['infer']['te_compile']:7.2f} tc "
          f"{row['infer']['torch.compile']:7.2f} ms {row['infer_ratio']:.2f}x  "
          + (f"A/A train {row['train_aa']:.2f}x infer {row['infer_aa']:.2f}x  " if control else "")
          + (f"default/oracle train {row['train_vs_oracle']:.2f}x infer {row['infer_vs_oracle']:.2f}x  " if always else "")
          + "".join(f"{md} FLASH {row[md]['FLASH']:7.2f} ms vs te {row[md + '_vs_flash']:.2f}x  "
                    for md in ("train", "infer") if md + "_vs_flash" in row)
          + f"{reasons} "
          f"compiled: train {row.get('train_sites')} infer {row.get('infer_sites')} "
          f"{ {k: v for k, v in row.items() if 'skips' in k} }", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", default="")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--mode", default="default", help="torch.compile mode for both (e.g. reduce-overhead)")
    p.add_argument("--impls", default="sdpa,flex_attention")
    p.add_argument("--control", action="store_true", help="a second plain torch.compile column (the A/A noise floor)")
    p.add_argument("--tune", action="store_true", help="te_compile.tune each model first (training and inference), "
                   "so the te_compile column decides from measurements")
    p.add_argument("--flash", action="store_true", help="flex_attention rows: a FLASH (FA4) column, plain "
                   "torch.compile with kernel_options={'BACKEND': 'FLASH'}")
    p.add_argument("--always", action="store_true", help="a serve='always' column; rows then show default / oracle")
    a = p.parse_args()
    import torch._inductor.config as ic
    ic.compile_threads = 1
    rows = []
    for kind in a.models.split(","):
        for impl in a.impls.split(","):
            try:
                rows.append(bench(kind, impl, a.batch, a.seq, a.iters, mode=a.mode, control=a.control, tune=a.tune,
                                  always=a.always, flash=a.flash))
            except Exception as e:  # noqa: BLE001 - report the row, go on
                print(f"{kind:8s} {impl:15s} error {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
                rows.append({"model": kind, "impl": impl, "error": f"{type(e).__name__}: {e}"[:300]})
            save(a.json, rows)  # after every row: a run cut short keeps what it measured
    for mode in ("train", "infer"):
        r = [x[mode + "_ratio"] for x in rows if mode + "_ratio" in x]
        if r:
            print(f"{mode}: geomean {math.exp(sum(map(math.log, r)) / len(r)):.2f}x, min {min(r):.2f}x over {len(r)}")
        vo = [x[mode + "_vs_oracle"] for x in rows if mode + "_vs_oracle" in x]
        if vo:
            print(f"{mode}: default / oracle geomean {math.exp(sum(map(math.log, vo)) / len(vo)):.2f}x, min {min(vo):.2f}x")
        vf = [x[mode + "_vs_flash"] for x in rows if mode + "_vs_flash" in x]
        if vf:
            print(f"{mode}: FLASH / te_compile geomean {math.exp(sum(map(math.log, vf)) / len(vf)):.2f}x, min {min(vf):.2f}x")
        aa = [x[mode + "_aa"] for x in rows if mode + "_aa" in x]
        if aa:
            print(f"{mode} A/A (torch.compile vs itself): {min(aa):.2f}-{max(aa):.2f}x")
    save(a.json, rows)
    return 0


def save(path: str, rows: list) -> None:
    if not path:
        return
    from te_compile.cudnn.versions import running
    record.write(path, {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": running(),
                        "date": datetime.date.today().isoformat(), "command": record.command("bench/hf_models.py"),
                        "rows": rows})


if __name__ == "__main__":
    raise SystemExit(main())
