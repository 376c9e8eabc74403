"""The fixtures the role contracts share."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from ..base import EventStore

__all__ = ["ContractBase"]

class ContractBase:
    """The fixtures every role's contract shares: a fresh store per test from
    :meth:`create_store`, closed afterwards."""

    tmp_path: Path

    def create_store(self) -> EventStore:
        """A new, empty store for one test; ``self.tmp_path`` is a fresh directory."""
        raise NotImplementedError  # abstract

    def open_again(self, store: EventStore) -> EventStore | None:
        """A second handle on ``store``'s data (another connection, as another process
        would have), or None if the store cannot have one (then the claim race runs
        on the one object from two threads). The caller closes it."""
        return None

    @pytest.fixture(autouse=True)
    def _contract_tmp_path(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    @pytest.fixture
    def store(self, _contract_tmp_path: None) -> Iterator[EventStore]:
        s = self.create_store()
        try:
            yield s
        finally:
            s.close()
