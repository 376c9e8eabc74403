"""The inbox in PostgreSQL's SQL: a message kept (and its owner woken at commit), a session's
messages read, the sessions with mail among some."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from ..records import Message
from . import queries as q

__all__ = ["send", "messages", "mailed"]

Conn = psycopg.Connection[Any]


def send(conn: Conn, channel: str, session_id: str, kind: str, text: str, now: float) -> int:
    """Keep one message (``text`` is its JSON body) and return its id; a listening owner is
    woken when the transaction commits."""
    with conn.transaction():
        row = conn.execute(q.SQL_SEND, (session_id, kind, text, now)).fetchone()
        conn.execute(q.SQL_NOTIFY_MAILED, (channel, session_id))  # delivered at commit
    assert row is not None  # INSERT ... RETURNING gives its row
    return int(row[0])


def messages(conn: Conn, session_id: str) -> list[Message]:
    """The session's messages not yet taken in, oldest first."""
    rows = conn.execute(q.SQL_INBOX, (session_id,)).fetchall()
    return [Message(session_id, int(mid), kind, json.loads(body), sent) for mid, kind, body, sent in rows]


def mailed(conn: Conn, ids: list[str]) -> set[str]:
    """Which of ``ids`` have a message in their inbox."""
    return {sid for (sid,) in conn.execute(q.SQL_MAILED, (ids,))}
