"""Telling a PostgreSQL URL from a file path, and naming a server without its password.

No psycopg here: the CLI asks :func:`is_postgres_url` and :func:`redact` before it knows
whether the ``postgres`` extra is installed. :func:`redact` is the one place a URL is
made printable; every message that names a database goes through it (or :func:`server`).
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["URL_SCHEMES", "is_postgres_url", "redact", "server"]

URL_SCHEMES = ("postgresql://", "postgres://")
#: ``password=...`` in a key/value conninfo string (quoted or not).
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
#: ``password=...`` in a URL's query string.
_QUERY_PASSWORD = re.compile(r"(^|&)(password=)[^&]*", re.IGNORECASE)


def is_postgres_url(db: str) -> bool:
    """Whether ``db`` (a ``--db`` value) names a PostgreSQL database rather than a file."""
    return db.strip().lower().startswith(URL_SCHEMES)


def redact(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``: safe to print, log or put in a span."""
    if not is_postgres_url(dsn):
        return _KV_PASSWORD.sub(r"\1***", dsn)
    parts = urlsplit(dsn.strip())
    netloc = parts.netloc
    if "@" in netloc:
        auth, hosts = netloc.rsplit("@", 1)
        if ":" in auth:
            auth = auth.split(":", 1)[0] + ":***"
        netloc = f"{auth}@{hosts}"
    query = _QUERY_PASSWORD.sub(r"\1\2***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def server(dsn: str) -> str:
    """``host:port/dbname`` of ``dsn`` (libpq's defaults and ``PG*`` variables filled in)."""
    host = port = dbname = user = ""
    if is_postgres_url(dsn):
        parts = urlsplit(dsn.strip())
        netloc = parts.netloc.rsplit("@", 1)[-1]
        if netloc.startswith("["):  # [ipv6]:port
            host, _, rest = netloc[1:].partition("]")
            port = rest.lstrip(":")
        else:
            host, _, port = netloc.partition(":")
        host, dbname = unquote(host), unquote(parts.path.lstrip("/"))
        auth = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
        user = unquote(auth.split(":", 1)[0])
        for item in parts.query.split("&"):
            key, _, value = item.partition("=")
            if key == "host" and not host:
                host = unquote(value)
            elif key == "port" and not port:
                port = unquote(value)
            elif key == "dbname" and not dbname:
                dbname = unquote(value)
            elif key == "user" and not user:
                user = unquote(value)
    else:
        for key, value in re.findall(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn):
            value = value.strip("'")
            if key == "host":
                host = value
            elif key == "port":
                port = value
            elif key == "dbname":
                dbname = value
            elif key == "user":
                user = value
    host = host or os.environ.get("PGHOST") or "localhost"
    port = port or os.environ.get("PGPORT") or "5432"
    user = user or os.environ.get("PGUSER") or ""
    dbname = dbname or os.environ.get("PGDATABASE") or user or "postgres"
    return f"{host}:{port}/{dbname}"
