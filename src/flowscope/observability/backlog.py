"""Spans wait for room in a batch processor's queue rather than being dropped by a full one.

The SDK's ``BatchSpanProcessor`` drops a span when its queue is full (2,048 spans by
default, ``OTEL_BSP_MAX_QUEUE_SIZE``). A worker running a thousand sessions ends spans
faster, for a while, than the processor's thread exports them (the thread shares the GIL
with the loop, and a ``WatermarkExporter`` waits for the store between exports): the SDK
dropped a third of a thousand 10-node sessions' spans, and five in six of five thousand's.

A :class:`SpanBacklog` fills each batch queue up to one export batch below its size (room
left for spans that user code starts) and keeps the rest in a backlog, which a thread of
its own hands over as the exporter frees room, so a burst is exported late rather than
lost. The backlog is bounded (:data:`BACKLOG_QUEUES` queues' worth), because an exporter
slower than the runs for good would otherwise fill the memory: a span beyond it is not
handed over; it is counted (:attr:`SpanBacklog.dropped`, and
``flowscope_spans_not_exported_total{reason="queue_full"}``) and logged, and its session's
watermark stays before it, so ``flowscope export`` or the session's next opener ships it.

A provider whose processors are not the SDK's batch processors (or a version of the SDK
whose queue this module does not recognise) gets its spans handed over directly, as the
SDK would. At the interpreter's exit the backlogs are handed over before the providers
shut down (their own ``atexit`` handler); a provider shut down explicitly should be
drained first (:func:`drain`; ``configure_tracing``'s handle does it).
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .span_losses import SPAN_LOSSES

__all__ = ["SpanBacklog", "backlog_for", "on_end_of", "drain", "BACKLOG_QUEUES", "CLOSE_WAIT_S"]

log = logging.getLogger("flowscope.observability.backlog")

#: The backlog holds at most this many times the smallest guarded queue's size
#: (32,768 spans for the SDK's default queue of 2,048).
BACKLOG_QUEUES = 16
#: How long the backlog's thread sleeps when the queues have no room: the processor's
#: thread frees room a batch at a time.
_POLL_S = 0.002

#: How long closing waits for spans to go out: a ``TracingHandle.shutdown`` or the
#: interpreter's exit for the backlogs, a ``WatermarkExporter.shutdown`` for the last
#: watermarks' writes. What is left after it goes out later, from the log.
CLOSE_WAIT_S = 10.0

OnEnd = Callable[[Any], None]


class _Queue:
    """A batch processor's queue: the deque its ``on_end`` appends to and how full it may get."""

    __slots__ = ("items", "limit", "wake")

    def __init__(self, items: collections.deque[Any], limit: int, wake: Callable[[], None] | None) -> None:
        self.items = items
        self.limit = limit
        self.wake = wake  # the processor thread's wake-up (it may sleep with a full batch waiting)


def _queue_of(processor: Any) -> _Queue | None:
    """The queue of an SDK ``BatchSpanProcessor`` (``opentelemetry-sdk`` 1.33 and later keep
    it in ``_batch_processor``), or None for any other processor."""
    inner = getattr(processor, "_batch_processor", None)
    items = getattr(inner, "_queue", None)
    size = getattr(inner, "_max_queue_size", None)
    batch = getattr(inner, "_max_export_batch_size", None)
    if not isinstance(items, collections.deque) or items.maxlen != size or not isinstance(batch, int):
        return None
    assert isinstance(size, int)
    limit = size - batch if size > batch else size // 2 + 1
    awaken = getattr(inner, "_worker_awaken", None)
    return _Queue(items, limit, awaken.set if isinstance(awaken, threading.Event) else None)


class SpanBacklog:
    """The spans of one provider's processors go through here: straight to ``on_end`` while
    the batch queues have room, through a bounded backlog when they do not."""

    def __init__(self, procs: tuple[Any, ...], queues: Sequence[_Queue]) -> None:
        self.procs = procs  # the processors tuple this was made for (add_span_processor replaces it)
        self._on_end = _on_end_of(procs)
        self._queues = tuple(queues)
        self._limit = BACKLOG_QUEUES * min(q.items.maxlen or 0 for q in queues)
        self._backlog: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._feeder: threading.Thread | None = None
        self._episode = 0  # spans dropped since the backlog was last empty
        #: spans never handed over (the backlog was full), since this backlog was made
        self.dropped = 0

    @property
    def waiting(self) -> int:
        """Spans waiting for room."""
        return len(self._backlog)

    def _room(self) -> int:
        return min(q.limit - len(q.items) for q in self._queues)

    def hand(self, spans: Sequence[Any]) -> list[Any]:
        """Hand ``spans`` over, in order after any that wait: what fits now, the rest later.
        Returns those of them the full backlog could not take (never handed over)."""
        on_end = self._on_end
        dropped: list[Any] = []
        with self._lock:  # every hand-over to these queues holds it: two cannot overfill them
            backlog = self._backlog
            if not backlog and self._room() >= len(spans):
                for s in spans:
                    on_end(s)
                return dropped
            for s in spans:
                backlog.append(s)
            self._move()
            over = len(backlog) - self._limit
            if over > 0:
                # the newest go (so, as the backlog held no more than its limit before, only
                # these spans): those queued first keep their order
                dropped = [backlog.pop() for _ in range(over)]
                self.dropped += over
                SPAN_LOSSES.add("queue_full", over)
                if not self._episode:
                    log.warning(
                        "tracing: the span processor's queue and flowscope's backlog of %d spans are full "
                        "(the exporter is slower than the runs): spans are not exported now; their "
                        "sessions' watermarks stay before them, so `flowscope export` (or the session's "
                        "next opener) ships them",
                        self._limit,
                    )
                self._episode += over
            if backlog and self._feeder is None:
                self._feeder = threading.Thread(target=self._feed, name="flowscope-span-backlog", daemon=True)
                self._feeder.start()
        return dropped

    def _move(self) -> bool:
        """Hand over what fits (with the lock held); True when the backlog is empty."""
        backlog = self._backlog
        n = min(self._room(), len(backlog))
        on_end = self._on_end
        for _ in range(n):
            on_end(backlog.popleft())
        if backlog:
            for q in self._queues:
                if q.wake is not None and len(q.items) >= q.limit:
                    q.wake()
            return False
        if self._episode:
            log.warning("tracing: %d spans were not exported for want of room (see above)", self._episode)
            self._episode = 0
        return True

    def _feed(self) -> None:
        """The backlog's thread: moves the backlog as room frees, and ends when it is empty."""
        while True:
            with self._lock:
                if self._move():
                    self._feeder = None
                    return
            time.sleep(_POLL_S)

    def drain(self, deadline: float) -> bool:
        """Hand the backlog over, flushing the processors to make room, until it is empty
        (True) or ``deadline`` (``time.monotonic()``) passes (False)."""
        while True:
            with self._lock:
                empty = self._move()
            for p in self.procs:
                p.force_flush(max(0, int((deadline - time.monotonic()) * 1000)))
            if empty:
                return True
            if time.monotonic() >= deadline:
                return False


#: Backlogs by the provider's active processor: one per provider, whichever plugin ships.
_BACKLOGS: weakref.WeakKeyDictionary[Any, SpanBacklog] = weakref.WeakKeyDictionary()
_MADE = threading.Lock()


def _after_fork() -> None:
    """In a forked child: the SDK empties its queues, no backlog thread survived, and a
    backlog's lock may have been held by one of the parent's threads: start afresh."""
    global _MADE
    _MADE = threading.Lock()
    _BACKLOGS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _on_end_of(procs: tuple[Any, ...]) -> OnEnd:
    """Each processor's ``on_end`` in turn, as the SDK's synchronous multi-processor calls
    them (without a reference to it: it is the key of :data:`_BACKLOGS`)."""
    if len(procs) == 1:
        return procs[0].on_end
    ends = tuple(p.on_end for p in procs)

    def on_end(span: Any) -> None:
        for end in ends:
            end(span)

    return on_end


def _synchronous(processor: Any) -> tuple[Any, ...] | None:
    """The processors of the SDK's synchronous multi-processor (a provider's active one),
    which calls each in turn; None for any other kind."""
    procs = getattr(processor, "_span_processors", None)
    if type(processor).__name__ == "SynchronousMultiSpanProcessor" and isinstance(procs, tuple):
        return procs
    return None


def on_end_of(processor: Any) -> OnEnd:
    """A provider's active processor's ``on_end``: the synchronous multi-processor's own
    loop unrolled (one processor's called directly); any other kind as it is."""
    procs = _synchronous(processor)
    return processor.on_end if procs is None else _on_end_of(procs)


def backlog_for(processor: Any) -> SpanBacklog | None:
    """The backlog of a provider's active processor (its ``_active_span_processor``), or
    None when that is not the SDK's synchronous multi-processor or none of its processors
    is a batch processor whose queue can be guarded."""
    procs = _synchronous(processor)
    if procs is None:
        return None
    found = _BACKLOGS.get(processor)
    if found is not None and found.procs is procs:
        return found
    with _MADE:
        found = _BACKLOGS.get(processor)
        if found is not None and found.procs is procs:
            return found
        queues = [q for q in (_queue_of(p) for p in procs) if q is not None]
        if not queues:
            return None
        made = _BACKLOGS[processor] = SpanBacklog(procs, queues)
        # At exit, before the providers' own atexit shutdown: handlers run last-registered
        # first, and the provider registered its own when it was made, before this.
        atexit.unregister(_drain_all)
        atexit.register(_drain_all)
        return made


def drain(provider: Any, timeout_millis: int = 30_000) -> bool:
    """Hand over the spans waiting for room in ``provider``'s queues, flushing it meanwhile;
    False if some still wait after ``timeout_millis``. Call before ``force_flush`` or
    ``shutdown``, which do not see this module's backlog."""
    processor = getattr(provider, "_active_span_processor", None)
    backlog = _BACKLOGS.get(processor) if processor is not None else None
    if backlog is None or not backlog.waiting:
        return True
    return backlog.drain(time.monotonic() + timeout_millis / 1000)


def _drain_all() -> None:
    """At the interpreter's exit: hand every backlog to its exporters (10 s in all), so a
    program that ends without flushing loses no span that waited for room."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    for backlog in list(_BACKLOGS.values()):
        if backlog.waiting:
            backlog.drain(deadline)
