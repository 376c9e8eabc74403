"""The conninfo a store's connections use: the caller's URL or conninfo plus the schema
(``search_path``), ``synchronous_commit``, read-only transactions, the application name
and a connect timeout; and where to say a failed connection went (host, port, user)."""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ...errors import StoreError
from .dsn import is_postgres_url, redact, unencoded_credentials

__all__ = ["SYNCHRONOUS_COMMIT", "Target", "check_options", "build_conninfo", "url_schema"]

#: ``synchronous_commit`` values a store may set for its connections (None: the server's).
SYNCHRONOUS_COMMIT = ("on", "off", "local", "remote_write", "remote_apply")
#: (host, port, user) of a conninfo, for a connection error's message.
Target = tuple[str, int, str]
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_options(schema: str, synchronous_commit: str | None) -> None:
    """Refuse (``ValueError``) a schema that is not a plain lower-case identifier, or an
    unknown ``synchronous_commit``: both go into the connections' options as text."""
    if not _IDENTIFIER.match(schema):
        raise ValueError(f"schema must be a lower-case SQL identifier, not {schema!r}")
    if synchronous_commit is not None and synchronous_commit not in SYNCHRONOUS_COMMIT:
        raise ValueError(
            f"synchronous_commit must be one of {SYNCHRONOUS_COMMIT}, not {synchronous_commit!r}"
        )


_SEARCH_PATH = re.compile(r"(?:^|\s)(?:-c\s*|--)search_path=(\S*)")


def url_schema(dsn: str) -> str | None:
    """The schema a URL's ``options`` name as its ``search_path``
    (``?options=-csearch_path%3Dflowscope``), else None: the store's tables are there, so
    that the CLI, which takes only a URL, reaches a store made with ``schema=``."""
    try:
        options = str(conninfo_to_dict(dsn).get("options") or "")
    except psycopg.ProgrammingError:
        return None  # build_conninfo says what is wrong with it
    found = _SEARCH_PATH.findall(options)
    if not found:
        return None
    schema = found[-1]  # the last one set wins, as the server reads them
    if not _IDENTIFIER.match(schema):
        raise StoreError(
            f"the search_path in the options of {redact(dsn)} is {schema!r}: give the one schema "
            "that holds the flowscope tables, a lower-case SQL identifier (search_path=flowscope)"
        )
    return schema


def build_conninfo(
    dsn: str,
    schema: str,
    readonly: bool,
    timeout: float,
    synchronous_commit: str | None,
    application_name: str,
) -> tuple[str, Target]:
    """The conninfo for ``dsn`` with the store's options, and its :data:`Target`."""
    if is_postgres_url(dsn) and unencoded_credentials(dsn):
        raise StoreError(
            f"the PostgreSQL URL {redact(dsn)} has an '@' or '/' that is not percent-encoded in its "
            "user, password or query: write '@' as %40 and '/' as %2F"
        )
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise StoreError(
            f"not a PostgreSQL URL or conninfo: {redact(dsn)}: libpq cannot parse it; check its host "
            "and port (postgresql://user@host:port/dbname, a password's @ / as %40 %2F)"
        ) from None
    options = [str(info.get("options") or ""), f"-c search_path={schema}"]
    if synchronous_commit is not None:
        options.append(f"-c synchronous_commit={synchronous_commit}")
    if readonly:
        options.append("-c default_transaction_read_only=on")
    extra: dict[str, Any] = {
        "options": " ".join(o for o in options if o),
        "application_name": application_name,
    }
    if "connect_timeout" not in info:
        extra["connect_timeout"] = max(1, int(timeout))
    host = str(info.get("host") or info.get("hostaddr") or "localhost").split(",")[0]
    port_text = str(info.get("port") or 5432).split(",")[0]
    if not port_text.strip().isdigit():
        raise StoreError(f"the port of {redact(dsn)} is not a number: {port_text!r}")
    port = int(port_text)
    return make_conninfo(dsn, **extra), (host, port, str(info.get("user") or ""))
