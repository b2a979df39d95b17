"""Reasons with a category and a short form: the report prints the short form, code reads the category.

A ``Reason`` is a ``str`` (every existing caller that prints or compares it keeps working: the string is the long
form, with the evidence) that also carries ``category``, one of ``CATEGORIES``, and may carry ``short``, one line
of at most ``MAX_SHORT`` characters (the rule or fact and, where useful, the action). Modules on both sides of the
passes / cuDNN boundary import it from here, so neither imports the other. Code that asks what kind of reason a
site got (the benchmarks, the distributed check, the tests) compares ``category(reason)`` with these constants,
never the text. ``short(reason)`` is what the site report shows: the reason's own short form, else the row of
``SHORT_FORMS`` that matches its text, else the text cut at a clause boundary.
"""

from __future__ import annotations

import re
from typing import Optional

#: te_compile cannot reproduce eager's numbers for this form (cuDNN computes something else there)
NOT_EXACT = "not-exact"
#: cuDNN has no way to run it: dtype, head dim, shape or rank, an op or construct of the score_mod / mask_mod
NOT_ON_CUDNN = "not-on-cudnn"
#: arguments (or used outputs) te_compile does not take: dropout, non-constant flags or scale, a mask of
#: the wrong dtype / shape, values it could not read from the graph
UNSUPPORTED_ARGS = "unsupported-args"
#: inputs on CPU (or another non-CUDA device) under target "auto"
DEVICE = "device"
#: a captured tensor needs a gradient te_compile does not compute there
NEEDS_GRAD = "needs-grad"
#: a BlockMask te_compile cannot honour: hand-built / not matching its mask_mod, or unreadable
BLOCK_MASK = "block-mask"
#: a gathering (document-style) mask too sparse to run dense: Inductor's flex skips the masked blocks
SPARSE_MASK = "sparse-mask"
#: the bias te_compile would materialize is over te_compile.passes.flex.MAX_BIAS_BYTES
TOO_LARGE = "too-large"
#: q / k / v / mask / captured tensors are DTensors or other tensor subclasses (sharded)
DISTRIBUTED = "distributed"
#: a site kept because a rule (te_compile.tuning.rules) or a measurement says torch.compile is faster: cuDNN
#: could serve it exactly
SLOWER = "slower"
#: a site cuDNN could serve, kept because the running cuDNN version is not checked for its form
#: (te_compile.cudnn.versions)
CUDNN_VERSION = "cudnn-version"
#: the cuDNN frontend is not installed, or fails to load (te_compile.cudnn.install)
CUDNN_UNAVAILABLE = "cudnn-unavailable"
#: a site served although the speed decision would keep it: Inductor could not compile the graph with it
SERVED_AFTER_INNER_FAILURE = "served-after-inner-failure"
#: te_compile raised while deciding: a bug, reported as such
INTERNAL_ERROR = "internal-error"
#: last resort: a reason no category above describes (a plain string reads as this)
OTHER = "other"
CATEGORIES = (NOT_EXACT, NOT_ON_CUDNN, UNSUPPORTED_ARGS, DEVICE, NEEDS_GRAD, BLOCK_MASK, SPARSE_MASK, TOO_LARGE,
              DISTRIBUTED, SLOWER, CUDNN_VERSION, CUDNN_UNAVAILABLE, SERVED_AFTER_INNER_FAILURE, INTERNAL_ERROR,
              OTHER)


class Reason(str):
    """A readable reason with a ``category`` and, optionally, its ``short`` form (one line for the report)."""

    category: str
    short: Optional[str]

    def __new__(cls, text: str, category: str = OTHER, short: Optional[str] = None) -> "Reason":
        if category not in CATEGORIES:
            raise ValueError(f"unknown reason category {category!r}; expected one of {CATEGORIES}")
        obj = super().__new__(cls, text)
        obj.category = category
        obj.short = short
        return obj


def category(reason: str) -> str:
    """The category of a reason (a plain string is ``OTHER``)."""
    return getattr(reason, "category", OTHER)


#: the longest short form: a site's reason in the report is one line of at most this many characters
MAX_SHORT = 100

#: (pattern over a long reason, its short form with the pattern's named groups): the reasons whose text runs past
#: MAX_SHORT, as te_compile words them (the long form stays in the JSON, ``--verbose`` and TORCH_LOGS)
SHORT_FORMS: tuple[tuple[str, str], ...] = (
    (r"^(?P<what>.+?) is a (?P<cls>\w+)\b.*no DTensor / tensor-subclass rule",
     "{what} is a {cls}: torch runs it by its sharding; pass local tensors to serve it"),
    (r"^inputs on (?P<dev>\w+): target 'auto' rewrites CUDA sites only",
     "inputs on {dev}: cuDNN serves CUDA inputs (target='reference' runs the reference kernel)"),
    (r"^attn_mask together with is_causal=True",
     "attn_mask with is_causal=True: eager differs by backend; fold the causal mask into attn_mask"),
    (r"^a negative scale with is_causal", "a negative scale with is_causal: torch's own kernels disagree there"),
    (r"^the mask_mod gathers, so it is added as a -inf bias",
     "a gathering mask_mod with a score_mod that can be NaN where the mask hides it"),
    (r"^score_mod/mask_mod .*not score-independent-additive",
     "the score_mod gathers from a tensor and is not additive, so it cannot become a bias"),
    (r"^captured tensor (?P<name>\S+) requires grad",
     "captured tensor {name} requires grad: te_compile computes it only in an additive term"),
    (r"^the (?P<what>.+?) would be materialized as a (?P<gib>[\d.]+) GiB bias",
     "the {what} would be a {gib} GiB bias: over te_compile's limit (MAX_BIAS_BYTES)"),
    (r"^the max_scores output", "the max_scores output is used: te_compile returns out and lse only"),
    (r"^the mask_mod is not pointwise on cuDNN \(document-style mask",
     "sparse document-style mask: Inductor's flex skips its masked blocks, cuDNN would not"),
    (r"^the BlockMask was not built by create_block_mask",
     "the BlockMask does not match its mask_mod: build it with create_block_mask"),
    (r"^a learned additive table \(dBias\) together with a score_mod",
     "a learned table with a score_mod whose derivative is not 1: cuDNN's dBias differs there"),
    (r"^a score_mod with index terms at (?P<S>\d+) <= \d+ keys with grads",
     "a score_mod with index terms at {S} keys with grads: cuDNN's dQ overflows there"),
    (r"^the score_mod applies (?P<op>\S+) to a remainder of the score",
     "the score_mod applies {op} to a remainder of the score: its gradient blows up on cuDNN"),
    (r"^the score_mod applies (?P<op>\S+) to a function of the score that is not affine",
     "the score_mod applies {op} to a non-affine function of the score: cuDNN's grad is inexact"),
    (r"^the score_mod applies (?P<op>\S+) to a function of the score that may reach 0",
     "{op} of a score that may reach 0 has an infinite derivative: cuDNN's gradient is inexact"),
    (r"reads a captured tensor at an index that depends on q_idx / kv_idx",
     "the score_mod / mask_mod gathers from a captured tensor by q_idx / kv_idx: not pointwise in cuDNN"),
    (r"^the emitted graph has an op on captured tensors and constants alone",
     "an op on captured tensors and constants alone: cuDNN crashes on it"),
    (r"^softmax scale (?P<scale>\S+) <= 0", "softmax scale {scale} <= 0: cuDNN's padded keys go wrong with it"),
    (r"^head dim (?P<d>\d+) > (?P<max>\d+)", "head dim {d} > {max}: no cuDNN kernel serves forward and backward"),
    (r"^cuDNN support check: ", "cuDNN's support check rejects this graph (--verbose: its message)"),
    (r"^cuDNN (?P<ver>\S+) builds no (?P<dir>forward|backward) plan",
     "cuDNN {ver} builds no {dir} plan for this graph on this GPU (--verbose: its message)"),
    (r"^cuDNN (?P<ver>\S+) (?:has not been checked|.*; emitted score_mod / mask_mod graphs are served on)",
     "cuDNN {ver} is not checked with emitted score_mod graphs (TE_COMPILE_UNCHECKED_CUDNN=serve)"),
    (r"^cuDNN frontend not installed", "cuDNN frontend not installed: pip install 'nvidia-cudnn-frontend>=1.32'"),
    (r"^cuDNN frontend unavailable", "cuDNN frontend fails to load: pip install 'nvidia-cudnn-frontend>=1.32'"),
    (r"^could not trace the (?P<kind>score|mask)_mod to aten",
     "could not trace the {kind}_mod to aten (data-dependent control flow?)"),
    (r"^te_compile internal error while deciding \((?P<exc>\w+)", "te_compile error while deciding ({exc}): a bug, "
     "please report it"),
    (r"^served although the speed decision keeps it",
     "served although slower: Inductor could not compile the graph with the call kept"),
    (r"^kept while its graph is measured", "kept while its graph is measured (te-compile tune)"),
)
_SHORT_FORMS = tuple((re.compile(p, re.S), t) for p, t in SHORT_FORMS)


def clip(text: str, limit: int = MAX_SHORT) -> str:
    """``text`` in at most ``limit`` characters: whole, else without its parenthesized asides, else up to a clause
    boundary (``; `` / ``, ``), else cut at a word with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    bare = re.sub(r" \([^()]*\)", "", text)
    if len(bare) <= limit:
        return bare
    for sep in ("; ", ", "):
        cut = bare.rfind(sep, 0, limit)
        if cut >= limit // 3:
            return bare[:cut]
    cut = bare.rfind(" ", 0, limit - 1)
    return bare[:cut if cut > 0 else limit - 1] + "\u2026"


def short(reason: str) -> str:
    """The reason as the report shows it: one line of at most MAX_SHORT characters."""
    own = getattr(reason, "short", None)
    if own:
        return clip(own)
    text = str(reason)
    if len(text) <= MAX_SHORT and "\n" not in text:
        return text
    for pattern, template in _SHORT_FORMS:
        m = pattern.search(text)
        if m:
            return clip(template.format(**m.groupdict()))
    return clip(text)


def rule_short(what: str, serve: bool, L: int, need: Optional[int], cuda_graphs: bool = False) -> str:
    """The one-line reason of a speed rule's decision (te_compile.tuning.rules; ``what``: the rule's ``short``)."""
    where = " under CUDA graphs" if cuda_graphs else ""
    if serve:
        return f"served{where}: {what}, cuDNN faster from {need} tokens"
    if need is None:
        return f"kept for speed{where}: cuDNN is no faster for {what}"
    return f"kept for speed{where}: {what}, {L} tokens (cuDNN faster from {need})"
