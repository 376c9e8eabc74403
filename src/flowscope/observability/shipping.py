"""Getting spans built from the log to a ``TracerProvider``'s exporters, exactly once.

:class:`Shipper` turns :class:`~flowscope.observability.log_spans.SpanRecord` objects into
SDK ``ReadableSpan`` objects (:func:`readable_span`, also what ``flowscope export`` sends)
and hands them to the provider's span processors, after its sampler has decided.

Crash-proof shipping. Each session has a watermark in the store
(:meth:`~flowscope.store.base.EventStore.exported_seq`): every span the log ended at or
before that ``seq`` was accepted by an exporter. It advances only after an exporter's
``export()`` returned SUCCESS, which :class:`WatermarkExporter` reports (wrap the exporter
that matters with it; :func:`~flowscope.observability.configure_tracing` wraps its OTLP
exporter). Spans a killed process had not shipped are then shipped by the next process that
opens the session (:meth:`Shipper.catch_up`, called by the tracing plugin on a resume, so
by a worker too) or by ``flowscope export --follow``: the same records, the same ids.
Exactly once, but for a kill between the exporter's SUCCESS and the watermark's write
(those spans are sent again, with the same ids; backends keep one). A refused export
stops the session's watermark in this process, so the next opener sends from there: no
span is lost, the spans delivered since the refusal may be sent twice. When this process
opens the session again, its catch-up sends them itself, and the watermark moves on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, TraceState

from .. import __version__
from ..events import Event
from . import spans as sp
from .backlog import CLOSE_WAIT_S, SpanBacklog, backlog_for, drain, on_end_of
from .log_spans import ResourceKey, SpanRecord, SpanWalk, invocation_context
from .sdk_spans import EMPTY_STATE as _EMPTY_STATE
from .sdk_spans import readable_span
from .span_losses import SPAN_LOSSES
from .traceparent import parse_traceparent

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.context import Context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from ..store.base import Upkeep

__all__ = [
    "Shipper",
    "WatermarkExporter",
    "readable_span",
    "unshipped",
    "LEDGER",
    "Ledger",
    "ledger_of",
    "export_counted",
    "flush",
    "flowscope_scope",
    "record_resource",
    "resource_record",
    "last_heartbeat",
]

log = logging.getLogger("flowscope.observability.shipping")

#: How long a ledger's watermark writer waits for work before its thread ends.
_WRITER_IDLE_S = 5.0
#: At most one watermark write per this many seconds: the marks of exports closer together
#: than that go into one store transaction (a process that flushes its spans after every
#: short invocation paid a transaction, and its thread's hand-overs, per invocation).
#: :meth:`Ledger.flush` writes at once. The price: a kill duplicates at most this long's
#: exports more.
_WRITE_EVERY_S = 0.1


@lru_cache(maxsize=1)
def flowscope_scope() -> InstrumentationScope:
    """The instrumentation scope of every flowscope span: ``flowscope``, the package
    version, and the semantic-conventions schema URL the spans follow (:data:`~.spans.SCHEMA_URL`)."""
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    return InstrumentationScope("flowscope", __version__, sp.SCHEMA_URL)


#: Resource attributes never recorded in the log: a process's command line, executable
#: and working directory (paths, and whatever secrets a command line holds).
_UNRECORDED_PREFIXES = ("process.",)
_MAX_RESOURCE_ATTRIBUTES = 64
_MAX_RESOURCE_VALUE = 256


def resource_record(resource: Resource) -> str:
    """What ``RunStarted.trace_context[RESOURCE_KEY]`` records of the process's resource:
    its attributes as a JSON object, without ``process.*`` (paths, command lines), at most
    64 of them, strings cut to 256 characters."""
    out: dict[str, Any] = {}
    for key, value in sorted(resource.attributes.items()):
        if key.startswith(_UNRECORDED_PREFIXES) or len(out) >= _MAX_RESOURCE_ATTRIBUTES:
            continue
        if isinstance(value, str):
            value = value[:_MAX_RESOURCE_VALUE]
        elif isinstance(value, (list, tuple)):
            value = [v[:_MAX_RESOURCE_VALUE] if isinstance(v, str) else v for v in value]
        out[key] = value
    return json.dumps(out, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=256)
def record_resource(key: ResourceKey) -> Resource:
    """The SDK ``Resource`` of recorded resource attributes (no detectors: exactly those)."""
    from opentelemetry.sdk.resources import Resource

    return Resource(dict(key))


def last_heartbeat(store: Upkeep, session_id: str) -> float | None:
    """The session's last sign of life in the store: the latest heartbeat of its runs still
    ``running`` (the owner's lease keeper writes them as it renews the lease), or None."""
    beats = [
        r.heartbeat_at
        for r in store.node_runs(session_id)
        if r.status == "running" and r.heartbeat_at is not None
    ]
    return max(beats) if beats else None


def unshipped(
    events: Iterable[Event], watermark: int, ended: bool, alive_at: float | None = None
) -> tuple[list[SpanRecord], tuple[int, int] | None]:
    """The spans of a log that ended after ``watermark``, and the (trace, span) ids of its
    last invocation (what a resumed one links to). ``ended``: the session's last invocation
    stopped for good (its process died): it ends here, an error (its worker lost), at
    ``alive_at`` (:func:`last_heartbeat`) when that is later than its last event."""
    out: list[SpanRecord] = []

    def keep(r: SpanRecord) -> None:
        if r.end_seq > watermark:
            out.append(r)

    walk = SpanWalk(keep)
    for e in events:
        walk.apply(e)
    if ended:
        walk.close_all(lost=True, alive_at=alive_at)
    return out, walk.previous


class Ledger:
    """Spans handed to processors and not yet accepted by a :class:`WatermarkExporter`,
    by session, so that each session's watermark moves only over exported spans.

    The plugin registers, the exporter (in the batch processor's thread) confirms; only a
    provider with a ``WatermarkExporter`` registers anything (:attr:`Shipper.ledger`). A
    span that was never handed over (flowscope's backlog was full: ``backlog.py``) is
    reported as refused, so its session's watermark stops there in this process. A span a
    processor drops itself (one whose queue flowscope does not guard) is never confirmed:
    the same, but it stays registered until the process ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[tuple[int, int], tuple[str, int]] = {}  # (trace, span) -> (session, end seq)
        self._sessions: dict[str, _Mark] = {}
        self._writing: dict[str, int] = {}  # session -> a watermark being written to its store
        #: sessions an exporter refused spans of: their watermark stays where it was in this
        #: process, so the next opener sends from there (duplicates rather than a loss)
        self._refused: set[str] = set()
        self._due: dict[int, tuple[Upkeep, dict[str, int]]] = {}  # store id -> (store, {session: mark})
        self._writer: threading.Thread | None = None
        self._busy = False  # the writer is writing marks it took from _due
        self._gathering = False  # the writer waits for _WRITE_EVERY_S to pass since its last write
        self._flushing = 0  # callers of flush() waiting: the writer writes at once
        self._last_write = 0.0  # time.monotonic() at the end of the last write
        self._wake = threading.Condition(self._lock)  # the writer waits on it for marks due
        self._idle = threading.Condition(self._lock)  # notified when the writer has nothing left
        if hasattr(os, "register_at_fork"):
            reinit = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (reinit() or (lambda: None))())

    def _after_fork(self) -> None:
        """In a forked child: no writer thread survived the fork, and the lock may have
        been held by one of the parent's threads. The marks stay: the child's to write."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._writer = None
        self._busy = False
        self._gathering = False
        self._flushing = 0

    @property
    def pending(self) -> int:
        """Spans registered and neither exported nor refused yet."""
        return len(self._spans)

    def shipped(self, session_id: str, records: Sequence[SpanRecord]) -> list[SpanRecord]:
        """The records this process has not handed over already (pending, or exported with
        the watermark's write still under way): what a catch-up may send."""
        with self._lock:
            mark = self._writing.get(session_id, 0)
            return [r for r in records if r.end_seq > mark and (r.trace_id, r.span_id) not in self._spans]

    def register(self, store: Upkeep, records: Sequence[SpanRecord]) -> None:
        with self._lock:
            for r in records:
                mark = self._sessions.get(r.session_id)
                if mark is None:
                    mark = self._sessions[r.session_id] = _Mark(store)
                    mark.failed = r.session_id in self._refused
                mark.pending[r.end_seq] = mark.pending.get(r.end_seq, 0) + 1
                self._spans[(r.trace_id, r.span_id)] = (r.session_id, r.end_seq)

    def exported(self, spans: Sequence[ReadableSpan], ok: bool) -> None:
        """The exporter returned (``ok``: SUCCESS): advance the watermarks it completed.

        The store writes happen on a thread of their own (:meth:`flush` waits for them):
        the exporter's thread, waiting for the store between the loop's appends, exported
        too slowly for a worker of a thousand sessions, whose batch queue then overflowed.
        A write that lags only means that a crash sends a few spans twice."""
        with self._lock:
            touched: set[str] = set()
            for s in spans:
                c = s.context
                if c is None:
                    continue
                found = self._spans.pop((c.trace_id, c.span_id), None)
                if found is None:
                    continue
                session, seq = found
                mark = self._sessions[session]
                n = mark.pending[seq] - 1
                if n:
                    mark.pending[seq] = n
                else:
                    del mark.pending[seq]
                if not ok:
                    mark.failed = True
                    self._refused.add(session)
                elif seq > mark.done:
                    mark.done = seq
                touched.add(session)
            for session in touched:
                mark = self._sessions[session]
                if mark.failed:
                    if not mark.pending:  # _refused remembers it: the mark itself is done
                        del self._sessions[session]
                    continue
                upto = mark.done
                if mark.pending:
                    upto = min(upto, min(mark.pending) - 1)
                if upto > mark.written:
                    mark.written = upto
                    self._writing[session] = upto
                    # one write per store for all the sessions due: the latest mark of each
                    self._due.setdefault(id(mark.store), (mark.store, {}))[1][session] = upto
                if not mark.pending:
                    del self._sessions[session]
            if self._due:
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._write_due, name="flowscope-watermarks", daemon=True
                    )
                    self._writer.start()
                elif not self._gathering:  # a gathering writer takes these marks when it writes
                    self._wake.notify()

    def resent(self, session_id: str) -> None:
        """This process has just handed over again every span of the session past its
        stored watermark (a catch-up: the refused ones among them are registered, pending):
        its watermark may follow the exports again, instead of staying before the refusal
        for the rest of the process and having every later opener send the same spans."""
        with self._lock:
            self._refused.discard(session_id)
            mark = self._sessions.get(session_id)
            if mark is not None:
                mark.failed = False

    def _write_due(self) -> None:
        """The writer's thread (one per ledger; it waits while nothing is due, and ends
        after :data:`_WRITER_IDLE_S` of that): writes the marks due, one transaction per
        store for all their sessions, at most once per :data:`_WRITE_EVERY_S` unless
        :meth:`flush` waits. (A thread started per export cost a 5-node invocation ~150 µs
        more than the write itself.)"""
        while True:
            with self._lock:
                self._busy = False
                while not self._due:
                    self._idle.notify_all()
                    if not self._wake.wait(_WRITER_IDLE_S) and not self._due:
                        self._writer = None  # idle: the next export starts another
                        return
                write_at = self._last_write + _WRITE_EVERY_S
                self._gathering = True
                while not self._flushing and (left := write_at - time.monotonic()) > 0:
                    self._wake.wait(left)
                self._gathering = False
                due, self._due, self._busy = self._due, {}, True
            for store, marks in due.values():
                try:
                    store.set_exported_seqs(marks)
                except Exception as exc:  # the next opener ships these again: duplicates, never a loss
                    log.warning(
                        "could not record that the spans of %d sessions were exported: %s", len(marks), exc
                    )
                with self._lock:
                    for session, seq in marks.items():
                        if self._writing.get(session) == seq and session not in self._sessions:
                            del self._writing[session]
            self._last_write = time.monotonic()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Write the watermarks of what was exported now, and wait until they are written;
        False on timeout."""
        with self._idle:
            self._flushing += 1
            self._wake.notify()  # a gathering writer writes at once
            try:
                return self._idle.wait_for(lambda: not self._due and not self._busy, timeout_s)
            finally:
                self._flushing -= 1


class _Mark:
    __slots__ = ("store", "pending", "done", "written", "failed")

    def __init__(self, store: Upkeep) -> None:
        self.store = store
        self.pending: dict[int, int] = {}  # end seq -> spans handed over, not yet exported
        self.done = 0
        self.written = 0
        self.failed = False


LEDGER = Ledger()


def export_counted(exporter: SpanExporter, spans: Sequence[ReadableSpan]) -> SpanExportResult:
    """``exporter.export(spans)``, the spans counted as not exported (``export_failed``) when
    it returns anything but SUCCESS or raises: a ``WatermarkExporter``'s and a follower's."""
    try:
        result = exporter.export(spans)
    except BaseException:
        SPAN_LOSSES.add("export_failed", len(spans))
        raise
    if result is not SpanExportResult.SUCCESS:
        SPAN_LOSSES.add("export_failed", len(spans))
    return result


class WatermarkExporter(SpanExporter):
    """A ``SpanExporter`` around another: after the inner ``export()`` returned SUCCESS,
    the sessions' watermarks advance over the spans it sent (:class:`Ledger`)."""

    def __init__(self, inner: SpanExporter, ledger: Ledger = LEDGER) -> None:
        self.inner = inner
        self.ledger = ledger

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = export_counted(self.inner, spans)
        except BaseException:
            # the processor logs it and drops the batch: refused, like a FAILURE, or the
            # ledger would keep these spans pending (and a follower away from them) for good
            self.ledger.exported(spans, False)
            raise
        self.ledger.exported(spans, result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()
        # the watermarks of the last exports: a store that does not answer in time loses
        # only those marks (the next opener sends their spans again), not the shutdown
        self.ledger.flush(CLOSE_WAIT_S)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis)) and self.ledger.flush(timeout_millis / 1000)


def ledger_of(procs: Iterable[Any] | None) -> Ledger | None:
    """The ledger of the first :class:`WatermarkExporter` among a provider's processors."""
    for p in procs or ():
        exporter = getattr(p, "span_exporter", None)  # Batch and Simple span processors have it
        if isinstance(exporter, WatermarkExporter):
            return exporter.ledger
    return None


def flush(provider: Any, timeout_millis: int = 30_000) -> bool:
    """Everything a provider's spans owe, done: the spans waiting for room handed over
    (``backlog.drain``), the processors flushed, the watermarks of what they exported
    written. False if that did not finish in time."""
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is None:
        return True
    done = drain(provider, timeout_millis) and bool(force_flush(timeout_millis))
    ledger = ledger_of(getattr(getattr(provider, "_active_span_processor", None), "_span_processors", None))
    return done and (ledger is None or ledger.flush(timeout_millis / 1000))


_UNSET = object()


class Shipper:
    """A provider's processors, sampler and resource, as the tracing plugin uses them."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider

        from .log_spans import resource_of

        self.provider = provider
        #: what depends on the provider's processors, and the tuple of them it was made of
        #: (add_span_processor replaces the tuple): looked up again when that changes
        self._made_for: Any = _UNSET
        self._ledger: Ledger | None = None
        self._gate: SpanBacklog | None = None
        self._on_end: Any = None
        sdk = isinstance(provider, SdkProvider) and not getattr(provider, "_disabled", False)
        self.enabled = sdk
        self._processor = provider._active_span_processor if sdk else None
        self._sampler = provider.sampler if sdk else None
        self._resource = provider.resource if sdk else None
        self._scope = flowscope_scope()
        #: what a RunStarted of this process records of its resource, and that record read back
        self.resource_record = resource_record(self._resource) if self._resource is not None else ""
        self._own_resource = resource_of(self.resource_record) if self.resource_record else None

    @property
    def ledger(self) -> Ledger | None:
        """The ledger of the provider's :class:`WatermarkExporter`, if it has one: without
        one nothing records what was exported, so nothing is shipped after a crash."""
        self._refresh()
        return self._ledger

    def _refresh(self) -> None:
        """Look up the ledger, the backlog and the ``on_end`` of the current processors."""
        processor = self._processor
        procs = getattr(processor, "_span_processors", None)
        if procs is not self._made_for:
            self._made_for = procs
            self._ledger = ledger_of(procs)
            self._gate = backlog_for(processor)
            self._on_end = on_end_of(processor) if processor is not None else None

    def sample(self, trace_id: int, name: str, parent: Context) -> tuple[bool, TraceState]:
        """The provider's sampler's decision for a new invocation's trace. Without one (a
        no-op or disabled provider: whoever ships the log's spans later decides nothing
        more), the SDK's default: the caller's span's decision, else sampled."""
        if self._sampler is None:
            caller = trace.get_current_span(parent).get_span_context()
            if caller.is_valid:
                return caller.trace_flags.sampled, caller.trace_state
            return True, _EMPTY_STATE
        result = self._sampler.should_sample(parent, trace_id, name, SpanKind.INTERNAL)
        return result.decision.is_sampled(), result.trace_state or _EMPTY_STATE

    def ship(
        self, records: Sequence[SpanRecord], store: Upkeep | None, extras: Mapping[int, Any] | None = None
    ) -> None:
        """Hand sampled records to the processors; with a store and a watermark exporter,
        they are registered first so the watermark follows their export."""
        processor = self._processor
        if processor is None:
            return
        todo = [r for r in records if r.sampled]
        if not todo:
            return
        if getattr(processor, "_span_processors", None) is not self._made_for:
            self._refresh()
        ledger, gate = self._ledger, self._gate
        if store is not None and ledger is not None:
            ledger.register(store, todo)
        own, scope = self._resource, self._scope
        assert own is not None
        mine = self._own_resource
        spans: list[ReadableSpan] = []
        # batch queues: handed over as they have room, never dropped by a full one
        on_end = self._on_end if gate is None else spans.append
        for r in todo:
            # A dead process's spans keep its resource; this process's own, the provider's.
            res = r.resource
            resource = own if res is None or res is mine or res == mine else record_resource(res)
            extra = extras.get(r.span_id) if extras else None
            if extra is None:
                on_end(readable_span(r, resource, scope))
            else:
                attrs, stack = extra
                on_end(readable_span(r, resource, scope, attrs, stack))
        if gate is not None:
            dropped = gate.hand(spans)
            if dropped and store is not None and ledger is not None:
                ledger.exported(dropped, ok=False)  # never handed over: their watermarks stay before them

    def catch_up(
        self, store: Upkeep | None, session_id: str, previous: Mapping[str, str]
    ) -> tuple[int, int] | None:
        """Before a resumed invocation: ship what the processes before this one did not
        (their cut-off run as incomplete) and return the ids of the invocation it resumes."""
        link = _link_of(session_id, previous)
        if store is None or self.ledger is None:
            return link
        try:
            mark = store.exported_seq(session_id)
            if _all_shipped(store, session_id, mark):
                return link
            records, last = unshipped(
                store.read(session_id), mark, ended=True, alive_at=last_heartbeat(store, session_id)
            )
        except Exception as exc:  # telemetry never fails the run
            log.warning("could not read session %s to ship its spans: %s", session_id, exc)
            return link
        ledger = self.ledger
        if ledger is not None:  # not what this process handed over already
            records = ledger.shipped(session_id, records)
        self.ship(records, store)
        if ledger is not None:
            ledger.resent(session_id)
        return last or link

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """:func:`flush` of the provider."""
        return flush(self.provider, timeout_millis)


def _all_shipped(store: Upkeep, session_id: str, mark: int) -> bool:
    """Whether a watermark covers every span of the log: past its last event, or at it
    when that event ended its invocation (else the spans that invocation left open are due)."""
    last = store.last_seq(session_id)
    if mark != last:
        return mark > last
    tail = store.read(session_id, after_seq=last - 1) if last else []
    return not tail or tail[-1].type == "run_finished"


def _link_of(session_id: str, previous: Mapping[str, str]) -> tuple[int, int] | None:
    recorded = parse_traceparent(previous.get("traceparent"))
    if recorded is None:
        return None
    return invocation_context(session_id, "", previous)[0], recorded.span_id
