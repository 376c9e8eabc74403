"""The console's ASGI app (Starlette): the pages, ``/api/``, the live stream, and the guard.

The guard (:class:`~flowscope.console.guard.Guard`, ``guard.py``) runs before every route:
the ``Host``, the per-start token, a write's origin, the security headers.

Writes call :func:`flowscope.answer`, :func:`flowscope.retry` and :func:`flowscope.cancel`,
exactly as the CLI does; the console never runs workflow code.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import shlex
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..actions import ActionReceipt
from ..actions import cancel as cancel_action
from ..actions import retry as retry_action
from ..answers import answer as answer_action
from ..answers import check_answer
from ..cli import views
from ..cli.failures import one_line
from ..cli.history import EVENT_KEYS
from ..cli.rowparts import session_command
from ..cli.session_ops import SELECTABLE_STATES, select_sessions
from ..errors import (
    OutputNotSerializableError,
    ResumeError,
    StoreError,
    StoreReadOnly,
    UnknownSessionError,
    describe_exception,
    error_type_name,
)
from ..fold import rebuild
from ..jsontext import too_deep
from . import api
from .config import LOOPBACK_NAMES, ConsoleConfig
from .guard import CSP, TOKEN_HEADER, Guard, session_id
from .live import ChangeFeed
from .stuck_state import session_stuck

__all__ = ["ConsoleConfig", "create_app", "TOKEN_HEADER", "LOOPBACK_NAMES", "CSP"]

log = logging.getLogger("flowscope.console")

#: The pages: each is the same shell (index.html), whose module draws what the path names.
PAGES = ("/", "/sessions/{session_id:path}", "/stuck", "/audit")


#: The largest request body a write takes: an answer a person types, with room to spare.
MAX_BODY_BYTES = 1 << 20


class BodyTooLarge(ValueError):
    """A request's body over :data:`MAX_BODY_BYTES` (413): read no further, record nothing."""


def _error(exc: Exception, request: Request) -> JSONResponse:
    """An exception as the CLI's one line, with a status: 404 unknown, 409 refused, 400 bad
    input, 503 a store fault; anything else is a defect: a JSON 500 that names only its
    type, the line in the console's log (never a traceback, never its message to the page)."""
    if isinstance(exc, UnknownSessionError):
        status = 404
    elif isinstance(exc, BodyTooLarge):
        status = 413
    elif isinstance(exc, StoreReadOnly):
        status = 403
    elif isinstance(exc, ResumeError):
        status = 409
    elif isinstance(exc, (ValueError, TypeError, OutputNotSerializableError)):  # a value JSON cannot hold
        status = 400
    elif isinstance(exc, StoreError):
        status = 503
    else:
        log.error("%s %s failed: %s", request.method, request.url.path, describe_exception(exc))
        return JSONResponse(
            {"error": f"the console failed ({error_type_name(exc)}); its log has the line"}, status_code=500
        )
    return JSONResponse({"error": one_line(exc)}, status_code=status)


def _seq(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"since is a seq (a whole number), not {text!r}") from None


def _stamp(updated_at: float | None) -> int | None:
    """A log's last append time, to the microsecond: with its last seq, which version of a
    session's log a page drew (a session pruned and run again under its id reaches the
    same seq with another log)."""
    return None if updated_at is None else round(updated_at * 1e6)


def _at(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return _stamp(float(text))
    except ValueError:
        raise ValueError(f"at is the session's updated_at (epoch seconds), not {text!r}") from None


def _rows(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Exactly the keys, in order, that ``--format json`` prints (:func:`render_json`)."""
    return [{k: r.get(k) for k in keys} for r in rows]


def create_app(config: ConsoleConfig) -> Starlette:
    """The console for ``config.store``: pages, ``/api/``, ``/api/live``, behind :class:`Guard`."""
    store = config.store
    feed = ChangeFeed(store, config.live_interval_s, stale_after_s=config.stale_after_s)
    lock = threading.Lock()  # one store call at a time: the store's connection is shared
    static = resources.files("flowscope.console") / "static"
    shell = (static / "index.html").read_text(encoding="utf-8")

    async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def locked() -> Any:
            with lock:
                return fn(*args, **kwargs)

        return await asyncio.get_running_loop().run_in_executor(None, locked)

    def guarded(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            try:
                feed.check_store()  # a deleted or replaced SQLite file: a 503, never its old rows
                return await fn(request)
            except Exception as exc:  # a JSON error through the guard (its headers), never a traceback
                return _error(exc, request)

        return handler

    # ------------------------------------------------------------------ pages

    async def page(request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None:
            # the token moves into a cookie, and out of the address bar and the history
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            response: Response = RedirectResponse(
                request.url.path + (f"?{urlencode(rest)}" if rest else ""), status_code=303
            )
            if hmac.compare_digest(token.encode(), config.token.encode()):
                response.set_cookie(config.cookie, config.token, httponly=True, samesite="strict", path="/")
            return response
        return Response(shell, media_type="text/html", headers={"cache-control": "no-store"})

    async def favicon(_request: Request) -> Response:
        return Response((static / "favicon.svg").read_bytes(), media_type="image/svg+xml")

    # ------------------------------------------------------------------ reads

    async def info(_request: Request) -> Response:
        return JSONResponse(
            {
                "db": config.db_shown,
                "prefix": config.prefix,  # what the page's commands start with
                "read_only": config.read_only,
                "attention": api.ATTENTION,
                "statuses": api.STATUSES,
                "bulk_states": SELECTABLE_STATES,
                "live_interval_s": config.live_interval_s,
            }
        )

    @guarded
    async def sessions(request: Request) -> Response:
        f = api.parse_filter(request.query_params)
        rows, total, tabs = await call(
            api.list_sessions,
            feed,
            f,
            stale_after_s=config.stale_after_s,
            queued_after_s=config.queued_after_s,
        )
        headers = {"x-total-count": str(total), "x-attention": json.dumps(tabs, separators=(",", ":"))}
        return JSONResponse(_rows(rows, views.RUN_KEYS), headers=headers)

    @guarded
    async def show(request: Request) -> Response:
        sid = session_id(request)

        def rows() -> list[dict[str, Any]]:
            from ..cli.history import session_history

            log = store.read(sid)
            if not log:
                raise UnknownSessionError(f"no session {sid!r} in the store")
            return views.show_rows(rebuild(log), store.session_info(sid), session_history(log))

        return JSONResponse(_rows(await call(rows), views.SHOW_KEYS))

    #: the last pages drawn, by (session, seq, _stamp(updated_at))
    drawn: OrderedDict[tuple[str, int, int | None], bytes] = OrderedDict()

    def seq_and_stuck(sid: str) -> tuple[int, int | None, list[dict[str, Any]]]:
        info = store.session_info(sid)
        if info is None:  # (an unknown session's last seq reads 0, as a ?since=0 would)
            raise UnknownSessionError(f"no session {sid!r} in the store")
        stuck_rows = session_stuck(store, sid, stale_after_s=config.stale_after_s, prefix=config.prefix)
        return info.last_seq, _stamp(info.updated_at), _rows(stuck_rows, views.STUCK_KEYS)

    @guarded
    async def waterfall(request: Request) -> Response:
        """The session page's data; ``stuck`` (orphaned, overdue: ``stuck``'s rows for the
        session) is asked again at every request, even when the log has not grown: a worker
        dies, or a deadline passes, without an event."""
        sid = session_id(request)
        since, at = request.query_params.get("since"), _at(request.query_params.get("at"))
        seq, stamp, stuck_now = await call(seq_and_stuck, sid)
        if since is not None and _seq(since) == seq and (at is None or at == stamp):
            return JSONResponse({"unchanged": True, "last_seq": seq, "stuck": stuck_now})
        body = drawn.get((sid, seq, stamp))
        if body is None:
            data = await call(api.session_waterfall, store, sid)
            body = bytes(JSONResponse(data).body)
            drawn[(sid, data["last_seq"], _stamp(data["session"]["updated_at"]))] = body
            while len(drawn) > 8:
                drawn.popitem(last=False)
        # the drawn page is kept by its seq; the stuck rows of now go in as its last key
        return Response(
            body[:-1] + b',"stuck":' + JSONResponse(stuck_now).body + b"}", media_type="application/json"
        )

    @guarded
    async def run(request: Request) -> Response:
        sid = session_id(request)
        path = request.query_params.get("path") or ""
        return JSONResponse(await call(api.run_detail, store, sid, path))

    @guarded
    async def events(request: Request) -> Response:
        sid = session_id(request)
        q = request.query_params
        types = [t for t in q.getlist("type") if t] + [t for t in (q.get("types") or "").split(",") if t]
        rows = await call(
            api.session_events,
            store,
            sid,
            types=types,
            path=q.get("path") or None,
            failures=q.get("failures") in ("1", "true"),
        )
        return JSONResponse(_rows(rows, EVENT_KEYS))

    @guarded
    async def stuck(request: Request) -> Response:
        q = request.query_params
        rows = await call(
            api.stuck,
            store,
            older_than_s=views.parse_duration(q.get("older_than") or "0s"),
            stale_after_s=views.parse_duration(q.get("stale_after") or f"{config.stale_after_s}s"),
            states=[s for s in q.getlist("state") if s],
            prefix=config.prefix,
        )
        return JSONResponse(_rows(rows, views.STUCK_KEYS))

    @guarded
    async def audit(request: Request) -> Response:
        q = request.query_params
        by = q.get("by") or "node"
        if by not in ("node", "run"):
            raise ValueError("by is node or run")
        rows = await call(api.audit, store, workflow=q.get("workflow") or None, by=by)
        return JSONResponse(_rows(rows, views.AUDIT_RUN_KEYS if by == "run" else views.AUDIT_KEYS))

    async def live(request: Request) -> Response:
        """Server-sent events: ``change`` with the store's new version, whenever it moves."""

        async def stream() -> Any:
            yield f"retry: 2000\nevent: hello\ndata: {json.dumps({'version': await call(feed.version)})}\n\n"
            quiet = 0.0
            async for v in _changes(feed, config.live_interval_s, call):
                if config.stopping.is_set():  # the server stops: the page reconnects to the next one
                    return
                if v is None:
                    quiet += config.live_interval_s
                    if quiet >= 15:
                        quiet = 0.0
                        yield ": keep-alive\n\n"
                    if await request.is_disconnected():
                        return
                    continue
                quiet = 0.0
                yield f"event: change\ndata: {json.dumps({'version': v})}\n\n"

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"cache-control": "no-store"}
        )

    # ------------------------------------------------------------------ writes

    async def body(request: Request) -> dict[str, Any]:
        raw = bytearray()
        async for chunk in request.stream():  # counted as it comes: a length header may lie or be absent
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise BodyTooLarge(
                    f"the request's body is over {MAX_BODY_BYTES >> 20} MiB: give a large value with "
                    "flowscope resume --input ID=JSON (or --job), which takes it from the command line"
                )
        try:
            data = json.loads(raw)
        except RecursionError:  # Python's JSON reader recurses once per level
            raise ValueError(too_deep("the request's body")) from None
        except ValueError:
            raise ValueError("the request's body is not JSON") from None
        if not isinstance(data, dict):
            raise ValueError("the request's body is a JSON object")
        return data

    def text(data: dict[str, Any], key: str) -> str | None:
        """A write's text field: a JSON string, or absent (None, or empty)."""
        value = data.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a JSON string")
        return value

    def receipt(r: ActionReceipt, command: str) -> dict[str, Any]:
        return {
            "session_id": r.session_id,
            "workflow": r.workflow,
            "kind": r.kind,
            "was": r.was,
            "pending": r.pending,
            "owner": r.owner.describe() if r.owner is not None else None,
            "last_seq": r.last_seq,
            "command": command,
        }

    def cli(*args: str) -> str:
        return config.prefix + " " + " ".join(shlex.quote(a) for a in args)

    def on_session(verb: str, sid: str, *options: str) -> str:
        """The command acting on one session, as ``stuck`` prints it (an id that starts
        with ``-`` after ``--``: pasted, it is no option)."""
        return session_command(config.prefix, verb, sid, *(shlex.quote(o) for o in options))

    @guarded
    async def answer(request: Request) -> Response:
        sid = session_id(request)
        data = await body(request)
        inputs = data.get("inputs") or {}
        jobs = data.get("jobs") or {}
        if not isinstance(inputs, dict) or not isinstance(jobs, dict):
            raise ValueError("inputs and jobs are JSON objects, by interrupt id and by job id")
        dry_run = data.get("dry_run", False)
        if not isinstance(dry_run, bool):  # "false" is truthy: taken as a check, nothing would be recorded
            raise ValueError("dry_run must be a JSON boolean (true or false), or absent")
        command = on_session(
            "resume",
            sid,
            *[a for k, v in inputs.items() for a in ("--input", f"{k}={json.dumps(v)}")],
            *[a for k, v in jobs.items() for a in ("--job", f"{k}={json.dumps(v)}")],
        )
        if dry_run:  # every check the answer makes, nothing sent
            await call(check_answer, store, sid, inputs=inputs, jobs=jobs)
            return JSONResponse({"valid": True, "command": command})
        r = await call(answer_action, store, sid, inputs=inputs, jobs=jobs)
        feed.changed()
        return JSONResponse(
            {
                "session_id": r.session_id,
                "workflow": r.workflow,
                "kind": "answer",
                "inputs": list(r.inputs),
                "jobs": list(r.jobs),
                "pending": r.pending,
                "owner": r.owner.describe() if r.owner is not None else None,
                "last_seq": r.last_seq,
                "command": command,
            }
        )

    @guarded
    async def retry(request: Request) -> Response:
        sid = session_id(request)
        data = await body(request)
        from_path, reason = text(data, "from_path"), text(data, "reason")
        r = await call(retry_action, store, sid, from_path=from_path, reason=reason)
        feed.changed()
        options = (["--from", from_path] if from_path else []) + (["--reason", reason] if reason else [])
        return JSONResponse(receipt(r, on_session("retry", sid, *options)))

    @guarded
    async def cancel(request: Request) -> Response:
        sid = session_id(request)
        data = await body(request)
        reason = text(data, "reason")
        r = await call(cancel_action, store, sid, reason=reason)
        feed.changed()
        return JSONResponse(receipt(r, on_session("cancel", sid, *(["--reason", reason] if reason else []))))

    @guarded
    async def bulk(request: Request) -> Response:
        """``{"action": "retry"|"cancel", "workflow", "state", "older_than", "reason",
        "confirm": [ids]}``: without ``confirm``, the count and the ids (nothing changes);
        with ``confirm`` the ids that count listed, the action on each, one result per
        session, and only while the filters still select exactly those sessions: a count
        alone could stand for sessions the operator never saw."""
        data = await body(request)
        action = data.get("action")
        if action not in ("retry", "cancel"):
            raise ValueError("action is retry or cancel")
        workflow, state, older = text(data, "workflow"), text(data, "state"), text(data, "older_than")
        reason = text(data, "reason")
        if state is not None and state not in SELECTABLE_STATES:
            raise ValueError(f"state is one of {', '.join(SELECTABLE_STATES)}")
        if not (workflow or state or older):
            raise ValueError(
                "a bulk action needs a filter (workflow, state, older_than): it would touch everything"
            )
        older_s = views.parse_duration(older) if older else None
        found = await call(select_sessions, store, workflow=workflow, state=state, older_than_s=older_s)
        sids = [s.session_id for s in found]
        flags = [
            a
            for k, v in (("--workflow", workflow), ("--state", state), ("--older-than", older))
            if v
            for a in (k, v)
        ]
        command = cli(action, *flags, "--yes")
        confirm = data.get("confirm")
        if confirm is None:
            return JSONResponse(
                {"action": action, "count": len(sids), "session_ids": sids, "command": command}
            )
        if not isinstance(confirm, list) or not all(isinstance(s, str) for s in confirm):
            raise ValueError("confirm is the list of session_ids the count listed")
        if set(confirm) != set(sids):
            gone, new = len(set(confirm) - set(sids)), len(set(sids) - set(confirm))
            raise ResumeError(
                f"the filters now select {len(sids)} session(s), {new} of them not in the {len(confirm)} "
                f"you saw ({gone} of those no longer match): look again before acting"
            )
        results = []
        for sid in sids:
            try:
                if action == "retry":
                    r = await call(retry_action, store, sid, reason=reason)
                else:
                    r = await call(cancel_action, store, sid, reason=reason)
                results.append({"session_id": sid, "ok": True, "pending": r.pending})
            except (ResumeError, UnknownSessionError) as exc:
                results.append({"session_id": sid, "ok": False, "error": one_line(exc)})
        feed.changed()
        return JSONResponse({"action": action, "count": len(sids), "results": results, "command": command})

    routes = [
        *(Route(p, page) for p in PAGES),
        Route("/favicon.ico", favicon),
        Route("/favicon.svg", favicon),
        Route("/api/info", info),
        Route("/api/sessions", sessions),
        Route("/api/sessions/{session_id}/waterfall", waterfall),
        Route("/api/sessions/{session_id}/run", run),
        Route("/api/sessions/{session_id}/events", events),
        Route("/api/sessions/{session_id}/answer", answer, methods=["POST"]),
        Route("/api/sessions/{session_id}/retry", retry, methods=["POST"]),
        Route("/api/sessions/{session_id}/cancel", cancel, methods=["POST"]),
        Route("/api/sessions/{session_id}", show),
        Route("/api/bulk", bulk, methods=["POST"]),
        Route("/api/stuck", stuck),
        Route("/api/audit", audit),
        Route("/api/live", live),
        Mount("/static", app=StaticFiles(directory=str(static)), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={404: _not_found})
    app.state.config = config
    app.state.feed = feed
    app.add_middleware(Guard, config=config)
    return app


async def _not_found(request: Request, _exc: Exception) -> Response:
    """No route: the API answers in JSON, as it does every other error."""
    if request.url.path.startswith("/api/"):
        return JSONResponse(
            {"error": f"no such API route: {request.method} {request.url.path}"}, status_code=404
        )
    return PlainTextResponse("Not Found", status_code=404)


async def _changes(feed: ChangeFeed, interval: float, call: Callable[..., Awaitable[Any]]) -> Any:
    """Each new version of ``feed``, or None after a quiet interval (to notice a closed page)."""
    last = await call(feed.version)
    while True:
        await feed.wait(interval)  # or less: a store's notice of a change wakes every open page
        v = await call(feed.version)
        if v != last:
            last = v
            yield v
        else:
            yield None
