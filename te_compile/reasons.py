"""Reasons with a category: the report prints the sentence, code reads the category.

A ``Reason`` is a ``str`` (every existing caller that prints or compares it keeps working) that also
carries ``category``, one of ``CATEGORIES``. Modules on both sides of the passes / cuDNN boundary
import it from here, so neither imports the other.
"""

from __future__ import annotations

#: a site kept because te_compile's cost model (or a measurement) says torch.compile is faster: cuDNN
#: could serve it exactly
SLOWER = "slower"
#: any other reason (not exact, not on cuDNN, distributed, ...)
OTHER = "other"
#: a site served although the cost model would keep it: Inductor could not compile the graph with it
SERVED_AFTER_INNER_FAILURE = "served-after-inner-failure"
#: a site cuDNN could serve, kept because the running cuDNN version is not checked for its form
#: (te_compile.cudnn.versions)
CUDNN_VERSION = "cudnn-version"
CATEGORIES = (SLOWER, OTHER, SERVED_AFTER_INNER_FAILURE, CUDNN_VERSION)


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
