"""Reasons with a category: the report prints the sentence, code reads the category.

A ``Reason`` is a ``str`` (every existing caller that prints or compares it keeps working) that also
carries ``category``, one of ``CATEGORIES``. Modules on both sides of the passes / cuDNN boundary
import it from here, so neither imports the other. Code that asks what kind of reason a site got
(the benchmarks, the distributed check, the tests) compares ``category(reason)`` with these
constants, never the text.
"""

from __future__ import annotations

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
#: a site kept because a rule (te_compile.rules) or a measurement says torch.compile is faster: cuDNN
#: could serve it exactly
SLOWER = "slower"
#: a site cuDNN could serve, kept because the running cuDNN version is not checked for its form
#: (te_compile.cudnn.versions)
CUDNN_VERSION = "cudnn-version"
#: the cuDNN frontend is not installed, or fails to load (te_compile.install)
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
    """A readable reason with a ``category``."""

    category: str

    def __new__(cls, text: str, category: str = OTHER) -> "Reason":
        if category not in CATEGORIES:
            raise ValueError(f"unknown reason category {category!r}; expected one of {CATEGORIES}")
        obj = super().__new__(cls, text)
        obj.category = category
        return obj


def category(reason: str) -> str:
    """The category of a reason (a plain string is ``OTHER``)."""
    return getattr(reason, "category", OTHER)
