"""What one commit of the SQLite store writes: WAL frames per commit, by kind of page.

    PYTHONPATH=src python bench/wal_pages.py [--chain 200] [--runs 5] [--sessions 1000]

Runs ``--runs`` 200-chains one after another, then ``--sessions`` concurrent 10-chains,
on SQLite alone (``targets.Flow``), and the one-row commits of the targets' floor
(``targets.floor_db``); reads back the WAL frames each wrote (the automatic checkpoint is
off while it runs, so the WAL holds them all) and prints, per commit, how many pages went
to the WAL (the store's are 1 KiB, the floor's file has SQLite's default 4 KiB) and of
which kind: page 1 (the database header, rewritten whenever the file grows), the leaves
and interior pages of tables and of indexes. Every page an append changes goes to the WAL
whole, with a 24-byte frame header, and costs two ``pwrite`` calls and a checksum: this is
the store's share of the gap between SQLite alone and the one-row floor.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workflows as W  # noqa: E402
from flowscope.store.sqlite import SqliteEventStore  # noqa: E402
from targets import Flow, floor_db, one_row_commits  # noqa: E402

FRAME_HEADER = 24
WAL_HEADER = 32
#: The first byte of a B-tree page (at offset 100 on page 1) says its kind.
KINDS = {2: "index interior", 5: "table interior", 10: "index leaf", 13: "table leaf"}


def frames(wal: str, page_size: int, start: int) -> list[tuple[int, str, bool]]:
    """(page number, kind, ends a commit) of every frame of ``wal`` from byte ``start``."""
    out = []
    with open(wal, "rb") as f:
        f.seek(start)
        while True:
            header = f.read(FRAME_HEADER)
            page = f.read(page_size)
            if len(page) < page_size:
                return out
            number = int.from_bytes(header[:4], "big")
            commit = int.from_bytes(header[4:8], "big") != 0  # the db size after a commit, 0 otherwise
            kind = "page 1 (header)" if number == 1 else KINDS.get(page[0], "other (overflow, freelist)")
            out.append((number, kind, commit))


def wal_size(path: str) -> int:
    try:
        return os.path.getsize(path + "-wal")
    except FileNotFoundError:
        return 0


def report(title: str, written: list[tuple[int, str, bool]], units: int, unit: str) -> None:
    commits = sum(1 for _n, _k, c in written if c)
    kinds = Counter(k for _n, k, _c in written)
    print(f"\n{title}: {len(written)} frames in {commits} commits, {units} {unit}")
    print(
        f"  per commit: {len(written) / commits:.1f} pages; per {unit.rstrip('s')}: {len(written) / units:.1f}"
    )
    for kind, n in kinds.most_common():
        print(f"    {kind:28s} {n / commits:5.2f} per commit")


def measure_flow(
    store: SqliteEventStore, wf: object, runs: int, sessions: int
) -> list[tuple[int, str, bool]]:
    conn = store._conn  # the bench reads its own store's WAL: no checkpoint may reset it meanwhile
    assert conn is not None
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    flow = Flow(wf, store, False)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(flow.once(sessions))  # warm: the file and its trees exist
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    start = max(wal_size(store.path), WAL_HEADER)
    for _ in range(runs):
        loop.run_until_complete(flow.once(sessions))
    loop.close()
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return frames(store.path + "-wal", page_size, start)


def measure_floor(folder: str, n: int) -> list[tuple[int, str, bool]]:
    conn = floor_db(folder)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    start = max(wal_size(path), WAL_HEADER)
    one_row_commits(conn, n)
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return frames(path + "-wal", page_size, start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chain", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        with SqliteEventStore(os.path.join(folder, "chain.db")) as store:
            chain = measure_flow(store, W.chain(args.chain), args.runs, 1)
        report(f"SQLite alone, {args.chain}-chain x {args.runs}", chain, args.runs * args.chain, "nodes")
        with SqliteEventStore(os.path.join(folder, "sessions.db")) as store:
            many = measure_flow(store, W.chain(10), 1, args.sessions)
        report(f"SQLite alone, {args.sessions} concurrent 10-chains", many, args.sessions * 10, "node runs")
        report("floor: one-row commit", measure_floor(folder, 1000), 1000, "rows")


if __name__ == "__main__":
    main()
