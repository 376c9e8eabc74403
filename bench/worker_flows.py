"""The chains a ``flowscope worker`` serves in ``targets.py``'s worker figures, by name
(``chain10``, ``chain20``, ...): ``worker_flows:WORKFLOWS``. The lengths are
``$FLOWSCOPE_BENCH_CHAINS`` (comma-separated; default 10,20,200,2000), which ``targets.py``
sets to the lengths it submits."""

from __future__ import annotations

import os

from workflows import chain

__all__ = ["WORKFLOWS", "LENGTHS"]

LENGTHS = tuple(int(n) for n in os.environ.get("FLOWSCOPE_BENCH_CHAINS", "10,20,200,2000").split(","))
WORKFLOWS = [chain(n, name=f"chain{n}") for n in LENGTHS]
