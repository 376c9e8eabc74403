"""What the SQL adapters (SQLite, PostgreSQL) share about the ``node_runs`` projection.

One row holds one :class:`~flowscope.fold.NodeState`: these are its columns, in the
order both adapters write and read them, and the literal predicate of the partial index
over open runs (a planner matches a partial index only against the same literal text).
"""

from __future__ import annotations

from ..fold import OPEN_STATES

__all__ = ["NODE_STATE_COLUMNS", "OPEN_WHERE", "open_where"]

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
    "restarted_at",
)


def open_where(column: str = "status", *, as_or: bool = False) -> str:
    """The open states of ``column`` as literal SQL (our constants, never input).

    ``as_or``: ``a = 'x' OR a = 'y' ...`` instead of ``a IN ('x', 'y', ...)``. SQLite
    evaluates a partial index's predicate for every row an ``INSERT`` or ``UPDATE``
    writes, and an ``IN`` list of more than two values costs it an ephemeral table each
    time (measured here: a 200-node chain on the SQLite store 5-10% faster per node with
    the ``OR`` form). PostgreSQL keeps the ``IN`` form (an array compare).
    """
    if as_or:
        return "(" + " OR ".join(f"{column} = '{state}'" for state in OPEN_STATES) + ")"
    return f"{column} IN (" + ", ".join(f"'{state}'" for state in OPEN_STATES) + ")"


#: The open-runs predicate of PostgreSQL's partial index and queries (and of SQLite's
#: schema before version 4).
OPEN_WHERE = open_where()
