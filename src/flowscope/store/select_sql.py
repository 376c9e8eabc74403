"""What the SQL adapters (SQLite, PostgreSQL) share about selecting sessions and node runs:
a :class:`~flowscope.store.records.SessionQuery` as a ``WHERE`` clause with parameters, the
node runs :meth:`~flowscope.store.log.EventLog.find_node_runs` selects, and the groups of
:meth:`~flowscope.store.log.EventLog.node_run_groups`.

Each adapter names its :class:`Dialect` (placeholders, a list parameter, its JSON, its case
rule); the clause is built here once, so both select what :meth:`SessionQuery.matches`
selects (the store contract checks it). Only our own text goes into the SQL; every value
is a parameter.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .appending import owner_from_column
from .records import NodeRun, NodeRunGroup, SessionInfo, SessionQuery, ascii_lower

__all__ = [
    "Dialect",
    "sessions_where",
    "find_sessions",
    "status_counts",
    "find_node_runs",
    "node_run_groups",
    "session_info_of",
    "SelectsInSql",
]


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one SQL adapter writes what :func:`sessions_where` needs; ``{p}`` is a
    parameter's placeholder, ``{col}``/``{text}``/``{field}`` our own column text."""

    placeholder: str  # "{name}" -> the parameter's placeholder
    in_list: str  # {col} is one of the list parameter {p}
    list_value: Callable[[Sequence[str]], Any]  # a list of text as that parameter
    contains: str  # {p} (lower-cased ASCII) is in {text}, ASCII letters folded
    owner_field: str  # the owner's {field} as text ('' when missing)
    no_limit: Any  # the LIMIT parameter that means none
    #: The page's statement, with ``{where}`` for the clause.
    find_template: str
    #: The node runs' statement in ``node_runs()`` order, ``{where}`` after a ``WHERE TRUE``.
    node_runs_template: str
    root: str  # the run's path has no "/"


#: The counts' statement, the same in both dialects.
SQL_STATUS_COUNTS = "SELECT status, count(*) FROM sessions WHERE last_seq > 0{where} GROUP BY status"


def sessions_where(d: Dialect, query: SessionQuery | None) -> tuple[str, dict[str, Any]]:
    """The ``WHERE`` clause's conditions (each after `` AND ``) and their parameters."""
    if query is None:
        return "", {}
    where: list[str] = []
    params: dict[str, Any] = {}

    def p(name: str, value: Any) -> str:
        params[name] = value
        return d.placeholder.format(name=name)

    if query.statuses is not None:
        where.append(d.in_list.format(col="status", p=p("statuses", d.list_value(sorted(query.statuses)))))
    if query.workflow is not None:
        where.append(f"workflow = {p('workflow', query.workflow)}")
    if query.session_ids is not None:
        where.append(d.in_list.format(col="session_id", p=p("ids", d.list_value(sorted(query.session_ids)))))
    if query.updated_since is not None:
        where.append(f"updated_at >= {p('since', query.updated_since)}")
    if query.updated_until is not None:
        where.append(f"updated_at <= {p('until', query.updated_until)}")
    if query.submitted_until is not None:
        where.append(f"coalesce(submitted_at, updated_at) <= {p('submitted', query.submitted_until)}")
    if query.id_contains is not None:
        where.append(d.contains.format(text="session_id", p=p("q", ascii_lower(query.id_contains))))
    if query.owner_contains is not None:
        needle = p("owner", ascii_lower(query.owner_contains))
        has = [d.contains.format(text=d.owner_field.format(field=f), p=needle) for f in ("worker_id", "host")]
        where.append(f"CASE WHEN owner IS NULL THEN FALSE ELSE ({has[0]} OR {has[1]}) END")
    return "".join(f" AND {w}" for w in where), params


def find_sessions(
    d: Dialect, query: SessionQuery | None, limit: int | None, offset: int
) -> tuple[str, dict[str, Any]]:
    """The statement and parameters of :meth:`~flowscope.store.log.EventLog.find_sessions`."""
    where, params = sessions_where(d, query)
    params.update(limit=d.no_limit if limit is None else max(limit, 0), offset=max(offset, 0))
    return d.find_template.format(where=where), params


def status_counts(d: Dialect, query: SessionQuery | None) -> tuple[str, dict[str, Any]]:
    """The statement and parameters of :meth:`~flowscope.store.log.EventLog.status_counts`."""
    where, params = sessions_where(d, query)
    return SQL_STATUS_COUNTS.format(where=where), params


def _runs_where(
    d: Dialect, statuses: Collection[str] | None, workflow: str | None, retried: bool
) -> tuple[str, dict[str, Any]]:
    where, params = [], {}
    if statuses is not None:
        params["statuses"] = d.list_value(sorted(statuses))
        where.append(d.in_list.format(col="status", p=d.placeholder.format(name="statuses")))
    if workflow is not None:
        params["workflow"] = workflow
        where.append(f"workflow = {d.placeholder.format(name='workflow')}")
    if retried:
        where.append("retries > 0")
    return "".join(f" AND {w}" for w in where), params


def find_node_runs(
    d: Dialect, statuses: Collection[str] | None, workflow: str | None, retried: bool
) -> tuple[str, dict[str, Any]]:
    """The statement and parameters of :meth:`~flowscope.store.log.EventLog.find_node_runs`."""
    where, params = _runs_where(d, statuses, workflow, retried)
    return d.node_runs_template.format(where=where), params


def _count_of(status: str) -> str:
    return f"sum(CASE WHEN status = '{status}' THEN 1 ELSE 0 END)"


def node_run_groups(d: Dialect, workflow: str | None) -> tuple[str, dict[str, Any]]:
    """The statement and parameters of :meth:`~flowscope.store.log.EventLog.node_run_groups`:
    rows in :class:`~flowscope.store.records.NodeRunGroup` field order."""
    where, params = _runs_where(d, None, workflow, False)
    counts = ", ".join(_count_of(s) for s in ("completed", "failed", "cancelled"))
    sql = (
        f"SELECT workflow, {d.root}, kind, node, count(*), {counts}, "
        "sum(attempt), max(attempt), sum(retries), sum(recoveries) "
        f"FROM node_runs WHERE TRUE{where} GROUP BY workflow, {d.root}, kind, node"
    )
    return sql, params


def session_info_of(row: Sequence[Any]) -> SessionInfo:
    """A session's row, its columns in :class:`SessionInfo` field order (``owner`` as stored)."""
    sid, workflow, status, started, updated, last_seq, invocations, owner, epoch, lease, submitted = row
    owned = owner_from_column(owner)
    return SessionInfo(
        sid, workflow, status, started, updated, last_seq, invocations, owned, epoch, lease, submitted
    )


class SelectsInSql:
    """The log's selecting reads answered in SQL, for an adapter that gives its
    :class:`Dialect` and runs a read-only query (``_select``); named before the store's
    base, it overrides the defaults that filter every session or node run in Python."""

    dialect: ClassVar[Dialect]

    @abstractmethod
    def _select(self, action: str, sql: str, params: Any) -> list[Any]:
        """The rows of one read-only query (``action`` names it in a ``StoreError``)."""

    def find_sessions(
        self, query: SessionQuery | None = None, *, limit: int | None = None, offset: int = 0
    ) -> list[SessionInfo]:
        rows = self._select("list sessions", *find_sessions(self.dialect, query, limit, offset))
        return [session_info_of(r) for r in rows]

    def status_counts(self, query: SessionQuery | None = None) -> dict[str, int]:
        return {
            status: int(n)
            for status, n in self._select("count sessions", *status_counts(self.dialect, query))
        }

    def find_node_runs(
        self, statuses: Collection[str] | None = None, *, workflow: str | None = None, retried: bool = False
    ) -> list[NodeRun]:
        sql, params = find_node_runs(self.dialect, statuses, workflow, retried)
        return [NodeRun(*r) for r in self._select("read node runs", sql, params)]

    def node_run_groups(self, workflow: str | None = None) -> list[NodeRunGroup]:
        rows = self._select("count node runs", *node_run_groups(self.dialect, workflow))
        return [
            NodeRunGroup(wf, bool(root), kind, node, *map(int, counts))
            for wf, root, kind, node, *counts in rows
        ]
