"""The default serve decision: one rule per site class, from measurements (no model, no fitted constants).

What the lowering decided for a site (a built-in band or window, an emitted score_mod or mask, built-in ALiBi, the
prefix-LM split, key intervals, a bias with or without dBias, an SDPA form) names its class (``site_class``). Each
class has one rule: keep it, or serve it from a number of query tokens on (forward-only steps as training steps);
under CUDA graphs the kernel ratio alone decides. Each rule cites the runs (``docs/data``) it was read from
(tests/test_rules.py checks it against them). ``te_compile.tune`` / ``mode="max-autotune"`` measure instead.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..lowering import prefix
from ..cudnn import native
from ..layout import size_hints
from ..lowering.lower import lower
from ..passes.decision import deciding_for_device
from ..reasons import SLOWER, Reason, rule_short
from ..spec import AttentionSpec

MEASURED_ON = "sm90 (H100, H200), cuDNN 9.19 and 9.27, training steps and forward-only steps"  #: what the rules rest on
#: keys per query below which a band is a "narrow window" (the sweeps' windows of 1024 serve, models' 512 do not)
NARROW_WINDOW = 1024
DECODING = 16  #: query tokens up to which a site is a decoding step (the decode sweep's 1 and 16 against a KV cache)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Serve a class from ``min_tokens`` query tokens on (None: keep it), ``graphs_min_tokens`` under CUDA graphs (None:
    keep it there too). ``why``: the evidence; ``short``: the report's one line; ``cites``: the runs (docs/data)."""

    min_tokens: Optional[int]
    graphs_min_tokens: Optional[int]
    why: str
    cites: tuple = ()
    short: str = ""


#: cited runs (docs/data), native call path: default-policy sweeps at 128-1024 tokens, sweeps, default-policy sweeps; HF Mistral
_SHORT = tuple(f"sweep-flex-default-h200-919-2026-11-29-{s}.json" for s in ("1x8x128x64", "1x8x128x64-rules", "16x16x128x64", "8x32x128x128x8", "16x16x128x64-infer", "1x1x256x64", "1x8x512x64", "8x16x1024x64"))
_NATIVE = ("sweep-flex-train-h200-919-2026-11-28.json", "sweep-flex-train-h100-919-2026-11-28-1x32x4096x128x8.json", "sweep-flex-infer-h200-919-2026-11-28.json")
_DEFAULT = tuple(f"sweep-flex-default-h200-919-2026-11-28-{s}.json" for s in ("2x16x4096x128", "1x32x4096x128x8", "1x16x16384x128-part1", "1x16x16384x128-part2"))
_WINDOW_512 = ("hf-flash-1x8192-h200-919-2026-11-27-mistral.json", "hf-flash-1x8192-h200-927-2026-11-27-mistral.json", "hf-model-check-h100-919-2026-11-27-mistral-1x8192.json", "hf-default-1x8192-h200-919-2026-11-28.json")
_FLEX = _SHORT + _NATIVE + _DEFAULT
_MASKS_STATIC = (tuple(f"masks-default-h200-919-2026-11-29-{s}.json" for s in ("2x16x4096x128", "1x8x32768x128")), ("flex prefix-LM", "flex sink+local"))
_LOADER = (tuple(f"sweep-flex-loader-h200-919-2026-11-29-{s}.json" for s in ("16x16x128x64", "1x8x512x64", "8x16x1024x64", "2x16x4096x128", "1x32x4096x128x8", "1x8x32768x128")), ("flex document (loader)",))  # new ids every step
_INTERVALS_SHORT = (("sweep-flex-default-h200-919-2026-11-29-1x8x128x64.json",) + tuple(f"sweep-flex-intervals-h200-919-2026-11-29-{s}.json" for s in ("16x16x128x64", "1x1x256x64", "1x1x256x64-rules", "1x8x512x64", "1x8x512x64-rules", "16x16x512x64", "8x16x1024x64", "4x16x1024x128", "2x16x2048x128", "1x32x4096x128x8")), ("flex prefix-LM",))
_DECODE = "decode-h200-919-2026-11-29.json"
_REPLAY = tuple(f"masks-replay-h200-919-2026-11-28-{s}.json" for s in ("2x16x4096x128", "1x8x32768x128"))  # the interval kernels launched from Python

RULES: dict[str, Rule] = {
    "sdpa": Rule(None, None, "torch runs a cuDNN or flash kernel of its own for it: te_compile's steps were 0.58-1.02x of torch.compile's at 512-16384 tokens", (("sweep-sdpa-before-h200-2026-11-26.json", ("sdpa none", "sdpa causal")),),
        short="plain SDPA (torch's own cuDNN/flash kernel)"),
    "sdpa mask": Rule(None, None, "torch runs its own cuDNN kernel with a bool mask or a frozen bias (not measured apart from SDPA without one: taken as equal)",
        short="SDPA with a mask (torch's own cuDNN kernel)"),
    "sdpa learned bias": Rule(4096, 4096, "torch falls back to its efficient kernel for a bias with a gradient: 1.80-2.07x steps from 4096 tokens, none faster at 1024", (("sweep-sdpa-h200-2026-11-26.json", ("sdpa learned bias",)),),
        short="a learned SDPA bias"),
    "flex plain": Rule(128, 512, "cuDNN's kernels 1.26-1.44x Inductor's from 1024 tokens (0.95-1.04x at 128-512); training steps 1.28-2.43x from 128 tokens (native call path: less host time per call)", ((_FLEX, ("flex none",)),),
        short="flex without a mask"),
    "flex native band": Rule(128, 1024, "a causal band on cuDNN's diagonal band: training steps 1.15-1.78x from 128 tokens (native call path); kernels 1.26-1.63x from 1024 tokens, 0.81-1.01x at 128-512", ((_FLEX, ("flex causal",)),),
        short="a causal band"),
    "flex narrow band": Rule(4096, 1024, "a band narrower than causal (a sliding window): training steps 1.01-1.55x from 4096 tokens, kernels 1.28-1.51x; the sweeps' window of 1024 keys is a causal band up to 2048 tokens (steps 1.33-1.82x at 128-1024); not measured between 2048 and 4096", ((_FLEX, ("flex sliding <=", "flex sliding <")),),
        short="a sliding window"),
    "flex narrow window": Rule(None, None, "a sliding window of fewer than 1024 keys per query (Mistral's and "
                               "Gemma-3's 512): whole Mistral models at 8192 tokens with every such site served ran "
                               "0.94-1.02x of torch.compile in training and 0.95-1.05x in inference (H100, H200); not "
                               "measured under CUDA graphs", ((_WINDOW_512, ("mistral",)),),
        short="a window of fewer than 1024 keys"),
    "flex score_mod": Rule(128, 128, "a non-linear score_mod (softcap): kernels 1.24-2.67x and training steps "
                           "1.10-2.58x from 128 tokens", ((_FLEX, ("flex softcap", "flex softcap + causal")),),
        short="a non-linear score_mod"),
    "flex additive score_mod": Rule(128, 1024, "an additive score_mod (ALiBi): training steps 0.96-1.29x from 128 "
                                    "tokens; kernels 1.17-1.36x from 1024, 0.88-0.99x at 128-512", ((_FLEX, ("flex ALiBi",)),),
        short="an additive score_mod"),
    "flex native ALiBi + causal": Rule(4096, 1024, "cuDNN's own ALiBi with causal masking: training steps 1.32-1.50x "
                                       "from 4096 tokens, 0.74-0.97x at 128-1024; kernels 1.29-1.53x from 1024 tokens",
                                       ((_FLEX, ("flex ALiBi + causal",)),), short="ALiBi + causal"),
    "flex prefix split": Rule(8192, 8192, "the prefix-LM split (two native calls and a merge): training steps "
                              "0.39-0.73x at 1024-4096 tokens (kernels 0.72-1.10x), 1.20x at 16384 (kernels 1.21x)",
                              ((_FLEX, ("flex prefix-LM",)),), short="the prefix-LM split"),
    "flex intervals": Rule(128, None, "cuDNN's interval kernels (prefix-LM, sink + local): prefix-LM (512 prefix keys: every key below 1024 tokens) steps 1.05-1.54x at 128-2048 tokens (kernels 1.17-1.31x from 512 tokens at 32-256 batch x heads; 0.76-0.87x at 1-8 batch x heads and at 128 tokens, where the step is host-bound), 1.54-1.57x at 4096, 1.42-1.54x at 32768; forward-only 1.68-1.85x", (_INTERVALS_SHORT, _MASKS_STATIC),
        short="a mask of key intervals"),
    "flex intervals, from Python": Rule(4096, None, "cuDNN's interval kernels launched from Python (no native call path): prefix-LM and sink + local steps 1.13-1.58x at 4096 tokens, 1.43-1.54x at 32768; not measured below 4096", ((_REPLAY, ("flex prefix-LM", "flex sink+local")),),
        short="a mask of key intervals, from Python"),
    "flex intervals, document ids": Rule(None, None, "document ids change with every packing a loader makes, and cuDNN's interval kernels need a new plan for new ids (a host synchronisation and the plan's own kernels: 7-8 ms per step at 128-4096 tokens, about 15 ms at 32768): one site with new ids every step ran 0.07-0.29x of torch.compile at 128-32768 tokens, a Llama-3-8B-dims model sharing one plan over 4 / 16 layers 0.99x / 1.03x; ids that never change run 1.5-1.7x at 4096-32768 tokens under serve='always'", (_LOADER,),
        short="document ids (a new plan for every packing)"),
    "flex emitted mask": Rule(None, None, "a mask cuDNN cannot skip tiles for (document masking): kernels "
                              "0.98-1.01x", ((_FLEX, ("flex document",)),),
        short="a mask cuDNN computes every tile of"),
    "flex additive score_mod + mask": Rule(None, None, "an additive score_mod with a mask cuDNN computes every tile "
                                           "of: 0.80x steps",
        short="an additive score_mod with a mask"),
    "sdpa decoding": Rule(1, None, "at most 16 query tokens against a KV cache, no mask: calls 1.50-2.71x of torch's at 1024-32768 keys (host time), 0.99x at 16 x 32768 (kernels)", ((_DECODE, ("sdpa",)),),
        short="SDPA decoding, no mask"),
    "flex decoding": Rule(1, 1, "at most 16 query tokens against a KV cache, no mask_mod: calls 2.96-3.08x of Inductor's flex decoding at 1024 keys, 6.1-28x at 32768 (kernels)", ((_DECODE, ("flex",)),),
        short="flex decoding, no mask"),
    "flex mask as a bias": Rule(None, None, "a mask_mod that gathers (document ids, a cache offset) where the interval kernels do not take it runs as a dense 0/-inf bias: cuDNN reads it and computes every tile; document ids at 16x16x128x64 (one tile, nothing to skip) steps 0.75x of torch.compile served, decoding with a bottom-right BlockMask 0.15-0.58x",
        short="a mask carried as a bias"),
    "flex gathered bias": Rule(4096, 4096, "a relative-position table gathered into a bias: 2.2x steps, as SDPA's learned bias (from 4096 tokens)",
        short="a gathered bias"),
    "flex band without tile skipping": Rule(None, None, "a bottom-right band over fewer queries than keys: cuDNN "
                                            "computes about every tile of it (0.9x)",
        short="a band over fewer queries than keys"),
}


def site_class(spec: AttentionSpec, has_bias: bool, need_dbias: bool, L: int, S: int, H: int = 0) -> str:
    """The rule's class of a site, from what the lowering decided for it."""
    if spec.intervals:
        return "flex intervals, document ids" if spec.n_inputs else "flex intervals"
    if spec.source != "flex":
        if not has_bias:
            return "sdpa decoding" if L <= DECODING and spec.mask == "none" else "sdpa"
        return "sdpa learned bias" if need_dbias else "sdpa mask"
    if spec.empty_rows:  # a gathering mask_mod materialized as a dense 0/-inf bias (te_compile.passes.flex)
        return "flex mask as a bias"
    if not has_bias and prefix.split(spec, L, S) is not None:
        return "flex prefix split"
    lw = lower(spec, (L, S), heads=H)
    if has_bias and not spec.empty_rows:
        return "flex gathered bias"
    if lw.alibi:
        return "flex native ALiBi + causal"
    if lw.band is not None:
        left, right = lw.band
        if left is None and right > 0 and L < S:
            return "flex band without tile skipping"
        if left is not None and left + right < NARROW_WINDOW:  # keys per query (the diagonal counts in left)
            return "flex narrow window"
        return "flex narrow band" if left is not None and (left + right) < S // 2 else "flex native band"
    if lw.score is None and lw.mask is None:
        unmasked = not (spec.mask_mod or spec.block_q or spec.empty_rows or has_bias)  # no mask, not even as a bias
        return "flex decoding" if L <= DECODING and unmasked else "flex plain"
    if lw.score is None or (lw.mask is not None and lw.mask_first is None):
        return "flex emitted mask"
    additive = lw.deriv is not None and lw.deriv.is_const(1.0)
    if lw.mask is None:
        return "flex additive score_mod" if additive else "flex score_mod"
    return "flex additive score_mod + mask" if additive else "flex score_mod"


def decide(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool,
           cuda_graphs: bool = False) -> tuple[bool, str]:
    """(serve?, one sentence naming the rule) for a site cuDNN can serve."""
    shape = size_hints((q.shape[1], q.shape[2], k.shape[2]))
    if shape is None:
        return True, "served: symbolic shapes (the rules decide at the size this compile saw)"
    H, L, S = shape
    cls = site_class(spec, bias is not None, need_dbias, L, S, H)
    if cls == "flex intervals" and not native.possible() and deciding_for_device() is None:
        cls += ", from Python"  # without C++ launches such a step is host-bound at short lengths
    rule = RULES[cls]
    need = rule.graphs_min_tokens if cuda_graphs else rule.min_tokens
    where = " under CUDA graphs" if cuda_graphs else ""
    if need is not None and L >= need:
        return True, Reason(f"served by the rule for {cls}{where} (from {need} tokens): {rule.why}",
                            short=rule_short(rule.short or cls, True, L, need, cuda_graphs))
    short = "" if need is None else f"{L} tokens, served from {need}: "
    return False, Reason(f"kept for speed by the rule for {cls}{where}: {short}{rule.why}",
                         short=rule_short(rule.short or cls, False, L, need, cuda_graphs))


def slower_reason(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool,
                  cuda_graphs: bool = False) -> Optional[str]:
    """Why the rules keep this site (torch.compile is faster), or None (served)."""
    if spec.impl != "cudnn":
        return None
    serve, why = decide(q, k, v, bias, spec, needs_grad, need_dbias, cuda_graphs)
    return None if serve else Reason(f"{why} ({MEASURED_ON}; not measured here: te-compile tune or "
                                     "mode='max-autotune' measures it); te_compile.backend(serve='always') serves "
                                     "it anyway", SLOWER, short=getattr(why, "short", None))

