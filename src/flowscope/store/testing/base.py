"""The fixtures the role contracts share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..log import EventLog

__all__ = ["ContractBase"]


class ContractBase:
    """The fixtures every role's contract shares: a fresh store per test from
    :meth:`create_store`, closed afterwards.

    ``create_store`` returns an :class:`EventLog` here, the least any role's contract
    needs; a contract that needs more (ownership, the inbox, upkeep) narrows it, so a
    log-only adapter's ``create_store() -> EventLog`` type-checks against
    ``EventLogContract``."""

    tmp_path: Path

    def create_store(self) -> EventLog:
        """A new, empty store for one test; ``self.tmp_path`` is a fresh directory."""
        raise NotImplementedError  # abstract

    @pytest.fixture(autouse=True)
    def _contract_tmp_path(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    @pytest.fixture
    def store(self, _contract_tmp_path: None) -> Iterator[EventLog]:
        s = self.create_store()
        try:
            yield s
        finally:
            s.close()
