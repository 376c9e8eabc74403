"""What the SQL adapters (SQLite, PostgreSQL) share about the ``node_runs`` projection.

One row holds one :class:`~flowscope.fold.NodeState`: these are its columns, in the
order both adapters write and read them, and the literal predicate of the partial index
over open runs (a planner matches a partial index only against the same literal text).
"""

from __future__ import annotations

from ..fold import OPEN_STATES

__all__ = ["NODE_STATE_COLUMNS", "OPEN_WHERE"]

#: The ``node_runs`` columns that hold a NodeState (besides session_id and workflow).
NODE_STATE_COLUMNS = (
    "path",
    "node",
    "kind",
    "parent_path",
    "status",
    "attempt",
    "failures",
    "retries",
    "recoveries",
    "started_at",
    "ended_at",
    "heartbeat_at",
    "error_code",
    "error_type",
    "job_deadline_at",
)

#: The open states as literal SQL (our constants, never input).
OPEN_WHERE = "status IN (" + ", ".join(f"'{state}'" for state in OPEN_STATES) + ")"
