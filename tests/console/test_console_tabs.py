"""The console's attention tabs count what their names say over the whole store: the
**failed** tab holds the failed sessions, never a cancelled or completed one (docs/ui.md)."""

from __future__ import annotations

import os
import time

import pytest

try:
    import starlette  # noqa: F401
except ImportError:  # CI installs the extra: there a missing one is a failure, never a skip
    if os.environ.get("CI"):
        raise
    pytest.skip("the console's extra is not installed: pip install -e '.[ui]'", allow_module_level=True)

from flowscope.console import api  # noqa: E402
from flowscope.console.live import ChangeFeed  # noqa: E402
from flowscope.events import NodeStarted, RunFinished, RunStarted  # noqa: E402
from flowscope.store import SqliteEventStore  # noqa: E402
from flowscope.store.testing import ev, node_ev  # noqa: E402


def test_the_failed_tab_counts_and_lists_the_failed_sessions_only(tmp_path):
    now = time.time()
    with SqliteEventStore(tmp_path / "tabs.db") as store:
        for sid, status in (("f", "failed"), ("c", "cancelled"), ("d", "completed")):
            store.append(
                sid,
                [
                    ev(RunStarted, sid=sid, workflow="wf", ts=now),
                    node_ev(NodeStarted, "wf@1", ts=now, sid=sid, kind="workflow"),
                    ev(RunFinished, sid=sid, status=status, final=status == "cancelled", ts=now),
                ],
                0,
            )
        feed = ChangeFeed(store, interval=60.0)
        rows, total, tabs = api.list_sessions(feed, api.SessionFilter(attention="failed"))
    assert tabs["failed"] == 1 and total == 1 and [r["session_id"] for r in rows] == ["f"]
