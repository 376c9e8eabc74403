"""The console's guard: the security rules every request passes before its route.

- a request whose ``Host`` is not one this console serves is refused (421): a page on
  another site that rebinds its name to 127.0.0.1 cannot read or act on the store;
- ``/api/`` needs the per-start token: the ``?token=`` of the URL printed at start, which
  the first page load moves into a ``SameSite=Strict``, ``HttpOnly`` cookie, or an
  ``X-Flowscope-Token`` header for programs;
- a write (POST) also needs an ``Origin`` that is the console's own when a browser sends
  one (and no ``Sec-Fetch-Site: cross-site``), and is refused outright with
  ``read_only``;
- every response carries ``Content-Security-Policy: default-src 'self'`` (no inline
  script, no other origin), ``X-Content-Type-Options: nosniff`` and
  ``Referrer-Policy: no-referrer``;
- a session id is routed as one path segment, whatever it holds (:func:`session_id`).
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import quote, unquote, unquote_to_bytes

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .config import ConsoleConfig

__all__ = ["Guard", "TOKEN_HEADER", "CSP", "session_id"]

TOKEN_HEADER = "x-flowscope-token"
CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"


def _host_only(value: str) -> tuple[str, str | None]:
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[: end + 1], value[end + 2 :] or None
    name, _, port = value.partition(":")
    return name, port or None


class Guard:
    """The console's security rules, as ASGI middleware (see the module's docstring)."""

    def __init__(self, app: ASGIApp, config: ConsoleConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self.refusal(request)
        if refusal is not None:
            await _secure(refusal)(scope, receive, send)
            return

        async def send_secured(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                headers.extend(_SECURITY_HEADERS)
            await send(message)

        await self.app(_one_segment(scope), receive, send_secured)

    def token_ok(self, request: Request) -> bool:
        given = request.headers.get(TOKEN_HEADER) or request.cookies.get(self.config.cookie) or ""
        return hmac.compare_digest(given.encode(), self.config.token.encode())

    def refusal(self, request: Request) -> Response | None:
        cfg = self.config
        name, port = _host_only(request.headers.get("host", ""))
        if name not in cfg.host_names() or (port is not None and port != str(cfg.port)):
            return PlainTextResponse("refused: this console does not serve that Host\n", status_code=421)
        path = request.url.path
        if not path.startswith("/api/"):
            return None
        if not self.token_ok(request):
            return JSONResponse(
                {"error": "refused: no valid token; open the URL `flowscope ui` printed"}, status_code=403
            )
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            if origin is not None and origin.lower() not in cfg.origins():
                return JSONResponse({"error": "refused: a write from another origin"}, status_code=403)
            if request.headers.get("sec-fetch-site") == "cross-site":
                return JSONResponse({"error": "refused: a cross-site write"}, status_code=403)
            if cfg.read_only:
                return JSONResponse(
                    {"error": "refused: this console is read-only (flowscope ui --read-only)"},
                    status_code=403,
                )
        return None


_SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


def _secure(response: Response) -> Response:
    for k, v in _SECURITY_HEADERS:
        response.headers[k.decode()] = v.decode()
    return response


#: The routes whose next path segment is a session id.
_SESSIONS = b"/api/sessions/"


def session_id(request: Request) -> str:
    """The session id of an ``/api/sessions/{session_id}...`` request, as given (see
    :func:`_one_segment`)."""
    return unquote(request.path_params["session_id"])


def _one_segment(scope: Scope) -> Scope:
    """Route a session id as one path segment whatever it holds. The server decodes the
    path before routing, so an id with a ``/`` (``%2F`` as the page sends it) would reach
    another route (``a%2Fevents``: session ``a``'s events) or none; the id is taken from
    the raw path and quoted again, and :func:`session_id` reads it back."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes) or not raw.startswith(_SESSIONS):
        return scope
    segment, sep, rest = raw[len(_SESSIONS) :].split(b"?", 1)[0].partition(b"/")
    try:
        sid = unquote_to_bytes(segment).decode("utf-8")
        tail = unquote_to_bytes(rest).decode("utf-8")
    except UnicodeDecodeError:
        return scope
    path = _SESSIONS.decode() + quote(sid, safe="") + (sep.decode() + tail if sep else "")
    return {**scope, "path": path}
