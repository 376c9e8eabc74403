"""Bounded metric labels (R13, docs/design.md): what an ``error_code`` label may be, and
how many label sets one metric keeps.

A label value comes from user code (an exception's ``error_code``, a node named at run
time), so a metric could grow a series per value. :func:`code_label` keeps codes to
the shape of a code; :class:`LabelBudget` caps the label sets of each metric, folding
new ones into one ``_other`` set and counting each fold
(``flowscope_metrics_overflow_total{metric}``). The event keeps the code (an identifier).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..errors import INVALID_ERROR_CODE

__all__ = ["INVALID_ERROR_CODE", "OTHER", "MAX_CODE_LABEL", "DEFAULT_MAX_SERIES", "code_label", "LabelBudget"]

#: The label value a metric's label sets beyond its budget are folded into.
OTHER = "_other"
MAX_CODE_LABEL = 64
DEFAULT_MAX_SERIES = 2000
_CODE = re.compile(r"[A-Z][A-Z0-9_]*")


def code_label(code: str | None) -> str:
    """``code`` as a metric label: itself if it looks like a code (``[A-Z][A-Z0-9_]*``, at
    most 64 characters), else ``INVALID_ERROR_CODE``. Stricter than what an event keeps
    (:func:`~flowscope.errors.error_code_or_invalid`): a label is a series of its own."""
    if code and len(code) <= MAX_CODE_LABEL and _CODE.fullmatch(code):
        return code
    return INVALID_ERROR_CODE


class LabelBudget:
    """At most ``max_series`` label sets per metric; beyond that, new sets are folded into
    ``(_other, ...)`` and ``on_overflow(metric)`` is called once per folded observation."""

    __slots__ = ("max_series", "on_overflow")

    def __init__(
        self, max_series: int = DEFAULT_MAX_SERIES, on_overflow: Callable[[str], None] | None = None
    ) -> None:
        if max_series < 1:
            raise ValueError("max_series must be at least 1")
        self.max_series = max_series
        self.on_overflow = on_overflow

    def admit(self, metric: str, values: tuple[str, ...], known: int) -> tuple[str, ...]:
        """The label set to record a new ``values`` under, for a metric that holds ``known``
        label sets: ``values`` itself while there is room, else the ``_other`` set."""
        if known < self.max_series:
            return values
        if self.on_overflow is not None:
            self.on_overflow(metric)
        return (OTHER,) * len(values)
