"""The listings (stuck, show, runs) report the owner and classify runs by the owner rule."""

from __future__ import annotations

import json
import time

import pytest

from commands import cli_env, cli_ok
from flowscope.cli import views
from flowscope.events import NodeStarted, RunStarted
from flowscope.ownership import this_process
from flowscope.store import SqliteEventStore
from flowscope.store.testing import dead_owner, ev, node_ev


@pytest.mark.slow
def test_a_dead_owner_is_orphaned_at_once_and_every_listing_names_the_owner(tmp_path):
    db = tmp_path / "v.db"
    now = time.time()
    gone = dead_owner("w-killed")
    with SqliteEventStore(db) as store:
        lease = store.acquire("dead", gone, 3600.0, now=now)
        store.append(
            "dead",
            [
                ev(RunStarted, sid="dead", workflow="shop", ts=now - 1),
                node_ev(NodeStarted, "shop@1/charge@1", ts=now - 1, sid="dead"),
            ],
            0,
            epoch=lease.epoch,
        )
        me = this_process("w-live")
        live = store.acquire("live", me, 60.0, now=now)
        store.append(
            "live",
            [
                ev(RunStarted, sid="live", workflow="shop", ts=now - 7200),
                node_ev(NodeStarted, "shop@1/charge@1", ts=now - 7200, sid="live"),
            ],
            0,
            epoch=live.epoch,
        )
        rows = {r["session_id"]: r for r in views.stuck_rows(store, 0.0, 60.0, now=now, prefix="flowscope")}
        assert rows["dead"]["state"] == "orphaned"  # a fresh heartbeat, a current lease: its process is gone
        # no --force needed; the code, which the log does not name, is
        assert rows["dead"]["action"] == "flowscope resume dead --workflow MODULE:ATTR"
        assert rows["dead"]["owner"] == {
            "worker_id": "w-killed",
            "host": gone.host,
            "pid": gone.pid,
            "lease_expires_at": now + 3600.0,
            "alive": False,
        }
        assert rows["live"]["state"] == "running"  # a heartbeat two hours old, but the lease is held
        assert "w-live" in rows["live"]["action"]
        runs = {r["session_id"]: r for r in views.runs_rows(store)}
        assert runs["live"]["owner"] == {
            "worker_id": "w-live",
            "host": me.host,
            "pid": me.pid,
            "lease_expires_at": now + 60.0,
            "alive": True,
        }
        [show] = views.show_rows(views.load_session(store, "dead"), store.session_info("dead"))
        assert show["owner"] == rows["dead"]["owner"]
    # the CLI as an operator runs it: no --stale-after
    env = cli_env(FLOWSCOPE_DB=str(db))
    listed = {
        r["session_id"]: r
        for r in json.loads(
            cli_ok("stuck", "--db", str(db), "--older-than", "0s", "--format", "json", env=env)
        )
    }
    assert listed["dead"]["state"] == "orphaned" and listed["dead"]["owner"]["pid"] == gone.pid
    runs = json.loads(cli_ok("runs", "--db", str(db), "--format", "json", env=env))
    assert {r["session_id"]: r["owner"]["worker_id"] for r in runs} == {
        "dead": "w-killed",
        "live": "w-live",
    }


def test_sessions_without_an_owner_keep_the_heartbeat_rule(tmp_path):
    with SqliteEventStore(tmp_path / "v.db") as store:
        store.append(
            "old",
            [
                ev(RunStarted, sid="old", workflow="w", ts=900.0),
                node_ev(NodeStarted, "w@1/a@1", ts=900.0, sid="old"),
            ],
            0,
        )
        [row] = views.stuck_rows(store, 0.0, 60.0, now=1000.0, prefix="flowscope")
        assert (row["state"], row["owner"]) == ("orphaned", None)
        [row] = views.stuck_rows(store, 0.0, 600.0, now=1000.0, prefix="flowscope")
        assert row["state"] == "running"
        assert views.runs_rows(store)[0]["owner"] is None
