from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flowscope.store import MemoryEventStore

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def store():
    return MemoryEventStore()


def of_type(events, type_name):
    return [e for e in events if e.type == type_name]
