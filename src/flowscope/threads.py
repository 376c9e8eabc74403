"""Helper threads that leave SIGCONT to the main thread.

A worker stopped (SIGSTOP, a frozen VM) past its lease must not let a node body go on
after the process continues: its SIGCONT handler checks every lease and cancels the runs
whose leases are no longer safe, and it must run before the event loop steps any task.
Python runs a handler in the main thread, but only once the C-level handler has run, in
whichever thread the kernel picked to take the signal. When the kernel picks a helper
thread (the lease keeper, an executor, an exporter) that is slow to get a CPU, the main
thread goes on stepping tasks until it does: measured on Linux with 100 sleeping tasks,
200 stops, 9 stops had tasks step before the handler (54 steps); with SIGCONT blocked in
every other thread, none did (so the kernel must hand SIGCONT to the main thread, which
runs the handler at its next instruction).

So every thread flowscope starts blocks SIGCONT first (:func:`start_thread`,
:func:`block_sigcont` as an executor's initializer), and ``flowscope worker`` starts
third-party threads (the span exporter's, the database pool's, the metrics server's)
inside :func:`sigcont_blocked`, so that they inherit the mask. Blocking only changes which
thread the kernel hands the signal to: the stop and the continue themselves are not
affected, and a process that never handles SIGCONT sees no difference.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["block_sigcont", "sigcont_blocked", "start_thread", "in_daemon_thread"]

_SIGCONT = {signal.SIGCONT} if hasattr(signal, "SIGCONT") else set()


def block_sigcont() -> None:
    """Block SIGCONT in the calling thread (a no-op where there are no POSIX signal masks)."""
    if _SIGCONT and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGCONT)


@contextlib.contextmanager
def sigcont_blocked() -> Iterator[None]:
    """Block SIGCONT in the calling thread for the ``with`` block: threads started inside
    it inherit the mask. The previous mask is put back after."""
    if not (_SIGCONT and hasattr(signal, "pthread_sigmask")):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGCONT)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_thread(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """Start a daemon thread named ``name`` running ``target(*args)`` with SIGCONT blocked."""

    def run() -> None:
        block_sigcont()
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def in_daemon_thread(
    loop: asyncio.AbstractEventLoop, target: Callable[..., Any], name: str, *args: Any
) -> asyncio.Future[Any]:
    """``target(*args)`` in a daemon thread (:func:`start_thread`), its result or error as
    a future of ``loop``. For a blocking wait the process must not wait for at its exit
    (an executor's threads are joined then: a worker told to stop would sleep out its poll
    interval first)."""
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def run() -> None:
        try:
            outcome = (True, target(*args))
        except BaseException as exc:  # handed to the awaiting task, which decides
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass

    start_thread(run, name)
    return future
