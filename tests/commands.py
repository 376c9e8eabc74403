"""The commands the tests run as a user runs them: one place that says where they are."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["FLOWSCOPE"]

#: The ``flowscope`` console script that ``pip install`` put beside the interpreter running
#: the tests: this checkout's, not whichever one comes first on ``PATH``.
FLOWSCOPE = str(Path(sys.executable).parent / "flowscope")
