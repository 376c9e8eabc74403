"""Telling a PostgreSQL URL from a file path, and naming a server without its password.

No psycopg here: the CLI asks :func:`is_postgres_url` and :func:`redact` before it knows
whether the ``postgres`` extra is installed. :func:`redact` is the one place a URL is
made printable; every message that names a database goes through it (or :func:`server`).
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit

from ...errors import mask_url_credentials

__all__ = ["URL_SCHEMES", "is_postgres_url", "redact", "server", "unencoded_credentials"]

URL_SCHEMES = ("postgresql://", "postgres://")
#: ``password=...`` in a key/value conninfo string (quoted or not).
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def is_postgres_url(db: str) -> bool:
    """Whether ``db`` (a ``--db`` value) names a PostgreSQL database rather than a file."""
    return db.strip().lower().startswith(URL_SCHEMES)


def redact(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``: safe to print, log or put in a span.
    Any URL's (``postgresql+psycopg://``, ``mysql://``: whatever was given), whatever
    characters its password holds, and a ``?password=`` or ``?sslpassword=`` in its query
    (:func:`~flowscope.errors.mask_url_credentials`)."""
    if "://" not in dsn:
        return _KV_PASSWORD.sub(r"\1***", dsn)
    # One URL, not prose: its password runs to the last "@", spaces included (a URL
    # typed with an unencoded space in it must not show what follows the space).
    scheme, sep, rest = dsn.strip().partition("://")
    at = rest.rfind("@")
    user, colon, _password = rest[:at].partition(":") if at >= 0 else ("", "", "")
    if colon:
        rest = f"{user}:***{rest[at:]}"
    return mask_url_credentials(f"{scheme}{sep}{rest}")


def _credentials(dsn: str) -> tuple[str, str] | None:
    """A PostgreSQL URL's user and password, and what follows them, split as libpq splits
    them (at the first ``@`` before any ``/``); None when that split is not the one
    :func:`redact` masks (at the last ``@``): an ``@`` or ``/`` in the password that is not
    percent-encoded, which libpq would read as part of the host, port or database."""
    rest = dsn.strip().split("://", 1)[1]
    at, last, slash = rest.find("@"), rest.rfind("@"), rest.find("/")
    if at < 0:
        return "", rest
    if at != last or (0 <= slash < at):
        return None
    return rest[:at], rest[at + 1 :]


def unencoded_credentials(dsn: str) -> bool:
    """Whether a PostgreSQL URL's user or password holds an ``@`` or ``/`` that is not
    percent-encoded (``%40``, ``%2F``): libpq would take part of the password for the
    host, port or database, and print it in its errors."""
    return _credentials(dsn) is None


def server(dsn: str) -> str:
    """``host:port/dbname`` of ``dsn`` (libpq's defaults and ``PG*`` variables filled in)."""
    host = port = dbname = user = ""
    if is_postgres_url(dsn):
        # libpq's split: a "#" or "?" in a password is the password's (urlsplit cuts there)
        split = _credentials(dsn)
        if split is None:  # never a guess that could hold a piece of the password
            return redact(dsn)
        auth, rest = split
        try:
            parts = urlsplit("//" + rest)
        except ValueError:  # "Invalid IPv6 URL": libpq says what is wrong; name no server
            return redact(dsn)
        netloc = parts.netloc
        if netloc.startswith("["):  # [ipv6]:port
            host, _, tail = netloc[1:].partition("]")
            port = tail.lstrip(":")
        else:
            host, _, port = netloc.partition(":")
        host, dbname = unquote(host), unquote(parts.path.lstrip("/"))
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
