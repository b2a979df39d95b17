"""Serve only where faster: a cost model of one attention site, te_compile (cuDNN) vs plain torch.compile.

A site that cuDNN can serve is rewritten only when the model says te_compile's step is faster, by ``MARGIN``, than
what torch.compile runs for it (aten SDPA for SDPA calls, Inductor's flex kernel for flex_attention).
Per site and per step (forward + backward when gradients are needed, else forward only):

    time = max(host time, kernel time)            # the slower of the two sides gates the step
    te_compile kernel = effective FLOPs / TE_TFLOPS
    torch.compile kernel = te_compile kernel * SPEED_RATIO[site class]

These constants are the built-in calibration (``te_compile.cudnn.calibration``: refits for other GPUs and
cuDNN versions replace them where they match the running one). Every constant was measured on the H200 of this project (torch 2.11, cuDNN 9.19, FE 1.32; bf16;
``bench/sweep.py``, 2026-11-26; docs/benchmarks.md). Host times are per training step of a
one-site graph (te_compile's ops run Python per call, aten's and Inductor's do not); the speed
ratios are torch.compile's kernel time over te_compile's at 2x16x4096x128. The model is deliberately
coarse: its job is to keep the sites that measured slower (plain SDPA, where torch runs the same
class of kernel with less host time; short sequences; sliding windows; emitted masks) and to serve
the ones that measured faster (score_mods, learned biases, long full or causal attention).

``te_compile.backend(serve="always")`` (or ``TE_COMPILE_SERVE=always``) serves every site cuDNN can
serve, whatever the model says (the tests and the fuzzer check cuDNN's numbers that way).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..layout import size_hints
from ..reasons import SLOWER, Reason
from ..spec import AttentionSpec
from . import calibration, graph_work, prefix
from .lowering import lower

#: cuDNN SDPA throughput te_compile reaches (fwd+bwd FLOPs / time; 2x16x4096x128 no mask: 962 GFLOP in 1.84 ms)
TE_TFLOPS = 520.0
#: host time per step of a one-site compiled graph, ms (bench/sweep.py medians):
#: training step (forward + backward) and forward only
HOST_MS = {"te_compile": {"train": 1.10, "infer": 0.26}, "torch.compile": {"train": 0.70, "infer": 0.12}}
#: backward FLOPs relative to the forward's (dQ, dK, dV and the recomputed scores)
BWD_FLOPS = 2.5

#: torch.compile's kernel time / te_compile's, by site class (H200, 2x16x4096x128, fwd+bwd)
SPEED_RATIO = {
    # aten SDPA runs a cuDNN / flash kernel of its own: never faster on te_compile (sweep 0.58-1.02x)
    "sdpa": 1.0,
    # a float bias that needs a gradient: torch falls back to the efficient kernel (2.17 / 7.65 ms vs
    # cuDNN with dBias 0.86 / 3.20 ms)
    "sdpa learned bias": 2.2,
    # a bool mask or a frozen float bias: torch can run its own cuDNN kernel with the bias (not measured
    # apart: assumed equal, so such sites are kept)
    "sdpa mask": 1.0,
    "flex plain": 1.30,  # no score_mod, no mask: 2.39 vs 1.84 ms
    "flex native band": 1.36,  # causal / sliding window as cuDNN's diagonal band: 1.47 vs 1.08, 0.80 vs 0.57
    "flex score_mod": 2.37,  # a non-linear score_mod (softcap): 4.73 vs 2.00, + causal 2.89 vs 1.22
    "flex additive score_mod": 1.34,  # an additive score_mod (ALiBi): 2.46 vs 1.84
    "flex additive score_mod + mask": 0.80,  # ALiBi + causal: cuDNN computes every tile (1.95 vs 1.56 step)
    # ALiBi + causal with cuDNN's own slopes (use_alibi_mask, which skips the masked tiles): Inductor's step
    # 1.56 ms vs cuDNN's kernels 0.30 + 0.79 ms (te_compile.alibi)
    "flex native ALiBi + causal": 1.43,
    "flex emitted mask": 0.27,  # a mask cuDNN cannot skip tiles for (prefix-LM: 5.55 vs 1.49 step)
    "flex gathered bias": 2.2,  # a relative-position table materialized as a bias (2.2x)
    # a prefix-LM mask as two native calls and an lse merge (te_compile.cudnn.prefix): 1.63 ms per step vs
    # Inductor's 1.49 (H200, 2x16x4096x128, mode="reduce-overhead"; the emitted mask was 5.5 ms): kept
    "flex prefix split": 0.91,
    # Inductor's step over te_compile's full-square estimate for such a band: inferred from the same
    # measurement (the row split, mostly this band, 1.64 ms vs Inductor's 1.49 on the prefix-LM mask): kept
    "flex band without tile skipping": 0.9,
}
#: the table above as a calibration (te_compile.cudnn.calibration: refits for other GPUs / cuDNN versions)
BUILTIN = calibration.Calibration("NVIDIA H200", 91900, TE_TFLOPS, HOST_MS, SPEED_RATIO,
                                  "hand-fitted to bench/sweep.py and per-call measurements, 2026-11-26 (te_compile/cudnn/cost.py)",
                                  "sm90")


def ratio(cal: "calibration.Calibration", cls: str) -> float:
    """torch.compile's kernel time / te_compile's for ``cls`` (the built-in ratio where ``cal`` did not fit it)."""
    return cal.speed_ratio.get(cls, SPEED_RATIO[cls])


#: extra host time of the prefix split per step (two op calls and the row copies instead of one op), ms: the
#: training value is the median over nine tuned flex sweeps (H100 and H200, cuDNN 9.19 and 9.27) of its host
#: time per step over the other variants' median in the same sweep
SPLIT_HOST_MS = {"train": 1.1, "infer": 0.08}
#: te_compile's estimate must beat torch.compile's by this fraction for the model to serve a site: replayed on
#: measured sweeps (te_compile.cudnn.replay) its estimates are off by this much and more, so closer calls are kept
MARGIN = 0.05


def serves(te_ms: float, tc_ms: float) -> bool:
    """Does the model serve a site estimated at ``te_ms`` on te_compile and ``tc_ms`` on torch.compile?"""
    return te_ms * (1.0 + MARGIN) < tc_ms


def site_class(spec: AttentionSpec, bias: Optional[torch.Tensor], need_dbias: bool, L: int, S: int,
               H: int = 0) -> tuple[str, float]:
    """(class name, fraction of the score matrix te_compile computes)."""
    if spec.source != "flex":
        if bias is None:
            return "sdpa", 0.5 if spec.is_causal else 1.0
        return ("sdpa learned bias" if need_dbias else "sdpa mask"), 1.0
    sp = prefix.split(spec, L, S) if bias is None else None
    if sp is not None:
        P = sp.keys
        m = min(L, S) - P
        # every row sees the P prefix keys (call A); rows q >= P see a causal triangle of the rest (call B)
        seen = L * P + m * (m + 1) // 2 + max(0, L - S) * (S - P)
        return "flex prefix split", seen / (L * S)
    lw = lower(spec, (L, S), heads=H)
    if bias is not None and not spec.empty_rows:
        return "flex gathered bias", 1.0
    if lw.alibi:
        return "flex native ALiBi + causal", 0.5
    if lw.band is not None:
        left, right = lw.band
        if left is None and right > 0 and L < S:
            # kv <= q + right with fewer queries than keys (bottom-right causal): cuDNN 9.19 computes about
            # every tile of it (cudnn-notes "Prefix-LM on cuDNN": a 3584x4096 band with right bound 512
            # took what the full square takes)
            return "flex band without tile skipping", 1.0
        width = min(S, (left or S) + right)
        return "flex native band", min(1.0, width / S if left else (0.5 + right / (2 * S)))
    if lw.score is None and lw.mask is None:
        return "flex plain", 1.0
    if lw.score is None or (lw.mask is not None and lw.mask_first is None):
        return "flex emitted mask", 1.0
    additive = lw.deriv is not None and lw.deriv.is_const(1.0)
    if lw.mask is None:
        return ("flex additive score_mod" if additive else "flex score_mod"), 1.0
    return ("flex additive score_mod + mask" if additive else "flex score_mod"), 0.5


def estimate(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool,
             cuda_graphs: bool = False) -> Optional[dict]:
    """{"class", "te_compile", "torch.compile"} step times in ms, or None (symbolic shapes).

    ``cuda_graphs``: the graph runs under CUDA graphs (mode="reduce-overhead"): a replay issues no
    per-call host work on either side, so only the kernels count."""
    # symbolic sizes (dynamic shapes) are judged at the size this compile saw, without specializing on it
    shape = size_hints((q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]))
    if shape is None:
        return None
    B, H, L, S, D, Dv = shape
    cls, density = site_class(spec, bias, need_dbias, L, S, H)
    cal, how = calibration.current(BUILTIN)
    te, tc = step_ms(cal, cls, density, shape, needs_grad, cuda_graphs)
    return {"class": cls, "te_compile": te, "torch.compile": tc, "calibration": _calibration_note(cal, how, cls)}


def step_ms(cal: "calibration.Calibration", cls: str, density: float, shape: tuple, needs_grad: bool,
            cuda_graphs: bool = False) -> tuple[float, float]:
    """(te_compile, torch.compile) ms per step of a one-site graph: a site of class ``cls`` computing ``density``
    of its score matrix, ``shape`` = (B, H, L, S, D, Dv), under calibration ``cal``."""
    B, H, L, S, D, Dv = shape
    flops = 2.0 * B * H * L * S * (D + Dv) * density * ((1.0 + BWD_FLOPS) if needs_grad else 1.0)
    # the per-length fit comes from training steps (te_compile.cudnn.refit): forward-only sites keep the class ratio
    efficiency, speed = (cal.at(cls, L, density) if needs_grad else None) or (1.0, ratio(cal, cls))
    kernel_te = flops / (cal.te_tflops * 1e9) / efficiency
    kernel_tc = kernel_te * speed
    mode = "train" if needs_grad else "infer"
    host = ({"te_compile": 0.0, "torch.compile": 0.0} if cuda_graphs
            else {n: cal.host_ms[n][mode] for n in ("te_compile", "torch.compile")})
    if cls == "flex prefix split" and not cuda_graphs:
        host["te_compile"] += SPLIT_HOST_MS[mode]
    # The graph's other GPU work is not credited here: it would hide host time only where the rest of the graph
    # has little host time of its own, which the FX graph does not tell (a model at 4 x 1024 tokens served that
    # way ran slower, docs/cudnn-notes.md). Measuring (te_compile.tuning) runs it, and checks the whole graph.
    return max(host["te_compile"], kernel_te), max(host["torch.compile"], kernel_tc)


def _rest(cls: str, density: float, needs_grad: bool, tflops: float) -> float:
    """The graph's other GPU work a measurement of this site runs first, ms (graph_work.rest_ms). Not for bands
    narrower than causal (sliding windows): served in Hugging Face models' training steps they measured slower
    than Inductor with that work around them (docs/cudnn-notes.md, "A per-site max(host, kernel)")."""
    return 0.0 if cls == "flex native band" and density < 0.5 else graph_work.rest_ms(needs_grad, tflops)


def rest_ms(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool) -> float:
    """This site's share of the graph's other GPU work, ms (0: none, or symbolic shapes). te_compile.tuning runs
    that much GPU work before each timed call of both candidates."""
    shape = size_hints((q.shape[2], k.shape[2], q.shape[1]))
    if shape is None:
        return 0.0
    L, S, H = shape
    cls, density = site_class(spec, bias, need_dbias, L, S, H)
    return _rest(cls, density, needs_grad, calibration.current(BUILTIN)[0].te_tflops)


def _calibration_note(cal, how: str, cls: str) -> str:
    fitted = "" if cls in cal.speed_ratio else f"; its '{cls}' ratio is the built-in one"
    return f"calibrated on {cal.label()}, {how}{fitted}"


def slower_reason(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool,
                  cuda_graphs: bool = False) -> Optional[str]:
    """Why te_compile would be slower than torch.compile for this site (it is kept), or None (served)."""
    if spec.impl != "cudnn":
        return None
    est = estimate(q, k, v, bias, spec, needs_grad, need_dbias, cuda_graphs)
    if est is None or serves(est["te_compile"], est["torch.compile"]):
        return None
    what = ("training step" if needs_grad else "forward") + (" under CUDA graphs" if cuda_graphs else "")
    close = (f", not {100 * MARGIN:.0f}% less (the model's margin)" if est["te_compile"] < est["torch.compile"]
             else "")
    return Reason(f"kept for speed: the cost model estimates {est['te_compile']:.2f} ms per {what} on te_compile vs "
            f"{est['torch.compile']:.2f} ms on torch.compile{close} ({est['class']}; te_compile.cudnn.cost, {est['calibration']}; "
            "not measured here: te-compile tune or mode='max-autotune' measures it); "
            "te_compile.backend(serve='always') serves it anyway", SLOWER)


__all__ = ["estimate", "step_ms", "serves", "MARGIN", "slower_reason", "site_class", "ratio", "BUILTIN", "SPEED_RATIO", "HOST_MS", "SPLIT_HOST_MS",
           "TE_TFLOPS"]
