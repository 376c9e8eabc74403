"""The owner the listings show (``stuck``, ``show``, ``runs --format json``): ``alive`` is the
one liveness rule, so an owner whose process is gone from this host is not alive, however
long its lease still runs."""

from __future__ import annotations

import time

from flowscope.cli.rowparts import owner_row
from flowscope.ownership import this_process
from flowscope.store.base import SessionInfo
from flowscope.store.testing.helpers import dead_owner


def _info(owner, lease_expires_at: float) -> SessionInfo:
    now = time.time()
    return SessionInfo("s", "w", "running", now, now, 2, 1, owner, 1, lease_expires_at)


def test_an_owner_whose_process_is_gone_is_not_alive_while_its_lease_runs():
    later = time.time() + 60.0
    assert owner_row(_info(dead_owner(), later))["alive"] is False
    assert owner_row(_info(this_process("me"), later))["alive"] is True
    assert owner_row(_info(this_process("me"), time.time() - 1.0))["alive"] is False  # its lease ran out
