"""What the SQL adapters (SQLite, PostgreSQL) share about selecting sessions: a
:class:`~flowscope.store.records.SessionQuery` as a ``WHERE`` clause with parameters.

Each adapter names its :class:`Dialect` (placeholders, a list parameter, its JSON, its case
rule); the clause is built here once, so both select what :meth:`SessionQuery.matches`
selects (the store contract checks it). Only our own text goes into the SQL; every value
is a parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .records import SessionQuery, ascii_lower

__all__ = ["Dialect", "sessions_where", "find_sessions", "status_counts"]


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
