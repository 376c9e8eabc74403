"""The worker: a process that serves the sessions of its workflows from a shared store.

A :class:`Worker` polls :meth:`EventStore.claim <flowscope.store.base.EventStore.claim>`
for sessions of its workflows that are ``queued`` (submitted with ``Runner.submit`` or
``flowscope start``), ``answered`` (answers recorded with ``flowscope.answer`` or
``flowscope resume`` without the code) or orphaned (their owner died), and runs each in
its own task with the lease the claim took. The store makes a claim atomic across
processes, so N workers on one database never run a session twice at once; the lease and
its epoch (the fence) make a worker that stalls past its lease append nothing more, and
a worker whose lease may have expired by its own clock stops its runs: on SIGCONT (in the
main thread) it checks its leases before the loop resumes any body (:meth:`check_leases`).

``stop()`` (SIGTERM or SIGINT under ``flowscope worker``) drains: no more claims; the
sessions in hand run on for up to ``drain_s``; those still running are handed back
(fenced: their invocations append nothing more) for another worker to claim at once.

A store that refuses writes (a full disk, a read-only store) is an *outage*
(:mod:`flowscope.outage`): said once, no claims, a backoff, one small write as the probe.
Sessions halted by a store fault are taken back by this worker, before it claims, when
writes go through again; if none has for ``max_store_outage_s``, :meth:`Worker.run`
drains at once and raises the store's error. See docs/workers.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .engine import Runner, Workflow
from .engine.hooks import Plugin, PluginDispatcher
from .engine.submit import cannot_run_events, check_session_id, check_store
from .errors import (
    ConcurrencyConflict,
    InvocationAbortedError,
    LeaseLost,
    OutputNotSerializableError,
    ResumeError,
    SessionCancelledError,
    StoreCorrupt,
    StoreLocked,
    StoreNotWritable,
    StoreUnavailable,
    describe_exception,
)
from .outage import DEFAULT_LIMIT_S, StoreOutage, backoff
from .ownership import Lease, Owner, this_process
from .store.base import Claim, EventStore
from .threads import in_daemon_thread

__all__ = ["Worker", "DRAIN_REASON", "CHECK_BACKOFF_CAP_S"]

log = logging.getLogger("flowscope.worker")

#: ``NodeCancelled.reason`` of node runs a draining worker stops.
DRAIN_REASON = "worker_draining"
#: The longest a session whose claims fail their resume checks is held between two tries.
CHECK_BACKOFF_CAP_S = 300.0


def _by_name(workflows: Iterable[Workflow] | Mapping[str, Workflow]) -> dict[str, Workflow]:
    items = list(workflows.values()) if isinstance(workflows, Mapping) else list(workflows)
    out: dict[str, Workflow] = {}
    for wf in items:
        if not isinstance(wf, Workflow):
            raise TypeError(f"Worker serves Workflow objects, got {type(wf).__name__}")
        if wf.name in out and out[wf.name] is not wf:
            raise ValueError(f"two different workflows are named {wf.name!r}: a worker serves one per name")
        out[wf.name] = wf
    if not out:
        raise ValueError("Worker needs at least one workflow")
    return out


_SETTLED = frozenset({"completed", "failed", "cancelled", "paused"})  # a take-back leaves alone


class Worker:
    """Serves the sessions of ``workflows`` from ``store`` until :meth:`stop`.

    ``concurrency``: at most this many sessions at once. ``lease_s``: the lease every
    claim takes (renewed every ``lease_s / 3`` off the event loop by the runners).
    ``drain_s``: how long :meth:`stop` lets sessions in hand run on. ``poll_s``: how
    often the store is asked for work when there was none. ``max_recoveries``: an
    orphaned session already recovered that many times is left alone (it shows in
    ``flowscope stuck``), and a run may be re-executed after a crash that often.
    ``max_check_failures``: a session whose claims fail their resume checks (nothing ran)
    is held for ``lease_s``, then twice that, and so on, and marked failed with the reason
    at the ``max_check_failures``-th failure.
    ``plugins`` go to every runner; ``on_worker_claim``/``on_worker_release`` see each claim
    and ``on_store_writes`` whether the store takes writes (``flowscope_worker_*``).
    ``max_store_outage_s``: how long no write may go through before :meth:`run` raises.
    """

    def __init__(
        self,
        store: EventStore,
        workflows: Iterable[Workflow] | Mapping[str, Workflow],
        plugins: Iterable[Plugin] = (),
        concurrency: int = 64,
        lease_s: float = 15.0,
        drain_s: float = 30.0,
        *,
        poll_s: float = 0.5,
        worker_id: str | None = None,
        max_recoveries: int = 3,
        max_check_failures: int = 5,
        max_store_outage_s: float = DEFAULT_LIMIT_S,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease_s <= 0 or poll_s <= 0 or drain_s < 0:
            raise ValueError("lease_s and poll_s must be positive, drain_s not negative")
        self.store = check_store(store, "Worker(store, workflows)")
        self.workflows = _by_name(workflows)
        self.plugins = list(plugins)
        self.concurrency = concurrency
        self.lease_s = float(lease_s)
        self.drain_s = float(drain_s)
        self.poll_s = float(poll_s)
        self.max_recoveries = max_recoveries
        self.max_check_failures = max(1, max_check_failures)
        #: Claims of a session that failed their resume checks in a row, by session id.
        self._check_failures: dict[str, int] = {}
        self._hooks = PluginDispatcher(self.plugins)
        self.owner: Owner = this_process(worker_id, ships_spans=self._hooks.ships_spans)
        self.runners = {
            name: Runner(
                wf,
                store,
                self.plugins,
                max_recoveries=max_recoveries,
                lease_s=self.lease_s,
                worker_id=self.owner.worker_id,
            )
            for name, wf in self.workflows.items()
        }
        self._active: dict[str, tuple[Claim, asyncio.Task[None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop = threading.Event()
        self._outage = StoreOutage(self.poll_s, max_store_outage_s)
        #: Sessions whose invocation halted because the store refused its writes: this
        #: worker takes them back (acquire, not claim: no recovery spent) once it can write.
        self._parked: dict[str, Claim] = {}
        #: When a parked session may be taken back (monotonic), and how many store-fault
        #: halts in a row it had: a fault that lasts is retried ever more slowly.
        self._parked_until: dict[str, float] = {}
        self._halts: dict[str, int] = {}
        #: Whether the last write went through (None: none tried yet); the plugins hear of
        #: each change (``on_store_writes``).
        self.store_writable: bool | None = None
        #: Why :meth:`run` stopped by itself: the write fault that lasted, or None.
        self.stopped_by: StoreNotWritable | None = None
        #: Sessions this worker finished serving, by how: completed, paused, failed,
        #: lease_lost, handed_back, refused, store_fault, backed_off (read by tests and the CLI's summary line).
        self.outcomes: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<Worker {self.owner.describe()} {sorted(self.workflows)} active={len(self._active)}>"

    @property
    def active(self) -> int:
        """How many sessions this worker runs now."""
        return len(self._active)

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming and drain; :meth:`run` returns once done. Safe from any thread
        and from a signal handler."""
        self._stop.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop closed meanwhile: run() is over anyway
                pass

    def check_leases(self) -> int:
        """Stop the sessions whose leases may have expired by this process's clock
        (``Runner.check_leases``); returns how many. Safe from a signal handler."""
        return sum(runner.check_leases() for runner in self.runners.values())

    async def run(self) -> None:
        """Serve until :meth:`stop`, then drain (see the module docstring). Raises the
        store's :class:`~flowscope.errors.StoreNotWritable` after draining if writes were
        refused for ``max_store_outage_s``."""
        if self._loop is not None:
            raise RuntimeError("this Worker is already running")
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        names = sorted(self.workflows)
        next_seen = 0.0
        unanswered = 0  # probes in a row the store did not answer
        waiter: asyncio.Future[bool] | None = None
        restore = self._on_sigcont()
        try:
            while not self._stop.is_set():
                now = time.time()
                # in an outage, or while the server does not answer: the probe, every round
                if now >= next_seen or self._outage.active or self.store_writable is False:
                    self._record_seen(names, now)
                    next_seen = now + self.lease_s / 3
                if self._outage.active:
                    if self._outage.exhausted():
                        self.stopped_by = self._outage.error
                        break
                    await self._nap(self._outage.delay())
                    continue
                if self.store_writable is False:  # a server that does not answer: no claims, a
                    # probe after a backoff that doubles (a blip is over soon), no exit
                    unanswered += 1
                    await self._nap(backoff(self.poll_s, unanswered, self._outage.cap_s))
                    continue
                unanswered = 0
                self._retake()
                claims = self._claim(names)
                for claim in claims:
                    self._unpark(claim.session_id)
                    self._start(claim)
                free = self.concurrency - len(self._active)
                if claims and free > 0:
                    await asyncio.sleep(0)  # there may be more: ask again at once
                    continue
                self._wake.clear()
                # Woken by a session of ours ending, or by the store (a NOTIFY on
                # PostgreSQL); store.wait_for_work blocks, so it waits in a daemon thread
                # that leaves SIGCONT to the main thread (threads.py) and never holds up the
                # exit, and a wait still running from the last round is waited on again.
                if waiter is None or waiter.done():
                    waiter = in_daemon_thread(
                        self._loop, self.store.wait_for_work, "flowscope-wait", self.poll_s
                    )
                woken = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait((woken, waiter), timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
        finally:
            try:
                await self._drain()
            finally:
                restore()
                self._loop = None
        if self.stopped_by is not None:
            raise self.stopped_by

    def _on_sigcont(self) -> Callable[[], None]:
        """Check the leases on SIGCONT, first thing after a stop; returns what undoes it.

        A Python-level handler (``signal.signal``), not ``loop.add_signal_handler``: Python
        runs it in the main thread right after the call the process was stopped in returns,
        before the loop steps the tasks whose timers expired meanwhile. The loop's own
        handler would run only after them (measured: after all of them), so bodies would
        go on past their ``await`` first. What it does is safe at any point of the loop's
        thread: it sets flags and cancels tasks (``Task.cancel`` only schedules callbacks),
        with no lock and no store call. Only in the main thread, where signals arrive; a
        handler set before is called after it, and put back at the end.
        """
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGCONT)

        def on_sigcont(signum: int, frame: Any) -> None:
            self.check_leases()
            if callable(previous):
                previous(signum, frame)

        try:
            signal.signal(signal.SIGCONT, on_sigcont)
        except (ValueError, OSError):  # pragma: no cover - not the main interpreter
            return lambda: None

        def restore() -> None:
            if signal.getsignal(signal.SIGCONT) is on_sigcont:
                signal.signal(signal.SIGCONT, previous if previous is not None else signal.SIG_DFL)

        return restore

    async def _nap(self, seconds: float) -> None:
        """Wait ``seconds`` (the outage's backoff), or less if :meth:`stop` is called."""
        assert self._wake is not None
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return

    # -- store outages (flowscope.outage) --------------------------------------------------

    def _write_fault(self, exc: StoreNotWritable) -> None:
        """A write failed because the store refuses writes: one line per episode."""
        self._writes(False)
        if self._outage.failed(exc):
            log.warning(
                "the store refuses writes: %s; not claiming, retrying every %gs at most, stopping if it lasts %gs",
                describe_exception(exc),
                self._outage.cap_s,
                self._outage.limit_s,
            )

    def _writable(self) -> None:
        self._writes(True)
        lasted = self._outage.succeeded()
        if lasted is not None:
            log.info("the store takes writes again (after %.1fs)", lasted)

    def _writes(self, writable: bool) -> None:
        """Tell the plugins when the store begins or stops taking this worker's writes:
        once per change, so that a gauge of it costs nothing while it holds."""
        if self.store_writable is not writable:
            self.store_writable = writable
            self._hooks.call_sync("on_store_writes", writable)

    def _retake(self) -> None:
        """Take back, before claiming, the sessions halted by a store fault: by ``acquire``
        under its own owner (no recovery spent), unless another took them (then theirs)."""
        now = time.monotonic()
        for sid, claim in list(self._parked.items()):
            if len(self._active) >= self.concurrency:
                return
            if sid in self._active:  # a claim took it (a lease shorter than the backoff ran out)
                self._unpark(sid)
                continue
            if self._parked_until.get(sid, 0.0) > now:
                continue
            try:
                info, me = self.store.session_info(sid), self.owner.worker_id
                if info is None or info.status in _SETTLED or getattr(info.owner, "worker_id", None) != me:
                    self._unpark(sid)
                    continue
                lease = self.store.acquire(sid, self.owner, self.lease_s)
            except ConcurrencyConflict:  # a live owner holds it now
                self._unpark(sid)
                continue
            except StoreNotWritable as exc:
                self._write_fault(exc)
                return
            except (StoreUnavailable, StoreLocked):  # said by the probe: try again next round
                return
            except Exception as exc:
                log.warning("could not take back session %s: %s", sid, describe_exception(exc))
                return
            del self._parked[sid]
            self._parked_until.pop(sid, None)
            self._start(dataclasses.replace(claim, lease=lease, taken_back=True))

    def _unpark(self, sid: str) -> None:
        """Forget a parked session: someone else holds it now."""
        self._parked.pop(sid, None)
        self._parked_until.pop(sid, None)
        self._halts.pop(sid, None)

    # -- claiming --------------------------------------------------------------------------

    def _record_seen(self, names: list[str], now: float) -> None:
        try:
            self.store.workers_seen(self.owner, names, ts=now)
        except StoreNotWritable as exc:
            self._write_fault(exc)
        except Exception as exc:  # a worker survives a store that is briefly unavailable
            if isinstance(exc, StoreUnavailable):  # a server that does not answer takes no write
                if self.store_writable is False:  # said once, when it began
                    return
                self._writes(False)
            log.warning("could not record worker %s: %s", self.owner.worker_id, describe_exception(exc))
        else:  # a real write went through (a claim that finds nothing may write nothing)
            self._writable()

    def _claim(self, names: list[str]) -> list[Claim]:
        free = self.concurrency - len(self._active)
        if free <= 0:
            return []
        try:
            return self.store.claim(
                self.owner, names, self.lease_s, limit=free, max_recoveries=self.max_recoveries
            )
        except StoreNotWritable as exc:
            self._write_fault(exc)
            return []
        except Exception as exc:
            if self.store_writable is not False:  # a server that does not answer: said once
                log.warning("claim failed: %s", describe_exception(exc))
            if isinstance(exc, StoreUnavailable):
                self._writes(False)
            return []

    def _start(self, claim: Claim) -> None:
        task = asyncio.ensure_future(self._serve(claim))
        self._active[claim.session_id] = (claim, task)

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def _serve(self, claim: Claim) -> None:
        """Run one claimed session to its next stop (completed, paused, failed, lost).

        A session that can never run (an id the engine refuses) is marked failed with the
        reason at once; one whose resume checks fail (``ResumeError``, or a ``ValueError``
        such as a value JSON cannot hold in its inbox, raised before anything was appended)
        is held for a backoff that doubles each time (:meth:`_back_off`), and after
        ``max_check_failures`` such claims is marked failed with the last reason.
        """
        sid = claim.session_id
        await self._hooks.call("on_worker_claim", claim)
        try:
            runner = self.runners[claim.workflow]
            try:
                check_session_id(sid)
            except ValueError as exc:
                self._fail_for_good(claim, exc, claim.lease)
                return
            before = self.store.last_seq(sid)
            try:
                result = await runner.resume(sid, lease=claim.lease, handed_back=claim.handed_back)
            except (
                ResumeError,
                OutputNotSerializableError,
                ValueError,
                TypeError,
                StoreCorrupt,  # its log cannot be read: held, not claimed again at once
            ) as exc:  # its checks, if nothing ran
                if isinstance(exc, SessionCancelledError) or self.store.last_seq(sid) != before:
                    raise
                self._back_off(claim, exc)
                return
            self._check_failures.pop(sid, None)
            self._halts.pop(sid, None)
            self._count(result.status)
            log.info("session %s (%s, %s): %s", sid, claim.workflow, claim.reason, result.status)
        except SessionCancelledError as exc:  # an operator's cancel, taken in here
            self._count("cancelled")
            log.info("session %s (%s, %s): %s", sid, claim.workflow, claim.reason, describe_exception(exc))
        except LeaseLost as exc:
            if self._stop.is_set():  # the drain handed it back: planned, not a fault
                self._count("handed_back")
                log.info("session %s: handed back by the drain", sid)
            else:
                self._count("lease_lost")
                log.warning("session %s: lease lost: %s", sid, describe_exception(exc))
        except InvocationAbortedError:
            self._count("handed_back")
            log.info("session %s: stopped by the drain", sid)
        except asyncio.CancelledError:
            self._count("handed_back")
            raise
        except (StoreNotWritable, StoreUnavailable, StoreLocked) as exc:
            # It halted, recording nothing more: not its failure. Taken back by this worker
            # (no recovery spent), after a backoff that doubles at each halt in a row: a
            # store may take the probe's small write and refuse the session's events.
            self._count("store_fault")
            self._parked[sid] = claim
            n = self._halts[sid] = self._halts.get(sid, 0) + 1
            self._parked_until[sid] = time.monotonic() + backoff(self.poll_s, n, self._outage.cap_s)
            if isinstance(exc, StoreNotWritable):  # an outage of writes: said once, per episode
                self._write_fault(exc)
            else:  # a server away or a lock held on: waited out, never an exit 3
                if isinstance(exc, StoreUnavailable):
                    self._writes(False)
                log.info(
                    "session %s halted: %s; taken back once the store answers", sid, describe_exception(exc)
                )
        except Exception as exc:  # the workflow's own failure, or a session that cannot run
            self._count("failed")
            log.warning(
                "session %s (%s, %s) failed: %s", sid, claim.workflow, claim.reason, describe_exception(exc)
            )
        finally:
            if self._active.get(sid, (None, None))[1] is asyncio.current_task():
                del self._active[sid]  # (never another task's entry for the session)
            await self._hooks.call("on_worker_release", claim)
            if self._wake is not None:
                self._wake.set()

    def _back_off(self, claim: Claim, exc: Exception) -> None:
        """A claim whose resume checks failed (nothing ran, the lease was released): hold
        the session, unclaimed by anyone, for ``lease_s * 2**(n-1)`` (at most
        :data:`CHECK_BACKOFF_CAP_S`) after its n-th such failure; at the
        ``max_check_failures``-th, mark it failed with the reason instead."""
        sid = claim.session_id
        n = self._check_failures.get(sid, 0) + 1
        if n >= self.max_check_failures:
            self._check_failures.pop(sid, None)
            self._fail_for_good(claim, exc)
            return
        self._check_failures[sid] = n
        delay = backoff(self.lease_s, n, CHECK_BACKOFF_CAP_S)
        self._count("backed_off")
        log.warning(
            "session %s (%s, %s) failed its checks (%d of %d), held for %gs: %s",
            sid,
            claim.workflow,
            claim.reason,
            n,
            self.max_check_failures,
            delay,
            describe_exception(exc),
        )
        try:  # a lease of its own, not renewed: the session is claimable again when it ends
            self.store.acquire(sid, self.owner, delay)
        except Exception as err:  # taken meanwhile (an operator's resume): theirs now
            log.info("session %s: not held for the backoff: %s", sid, describe_exception(err))

    def _fail_for_good(self, claim: Claim, exc: BaseException, lease: Lease | None = None) -> None:
        """End a session that cannot run with :func:`~.engine.submit.cannot_run_events`,
        appended under ``lease`` (the claim's, when no resume released it) or a new one."""
        sid = claim.session_id
        self._count("failed")
        log.warning(
            "session %s (%s, %s) cannot run, marked failed: %s",
            sid,
            claim.workflow,
            claim.reason,
            describe_exception(exc),
        )
        try:
            lease = lease or self.store.acquire(sid, self.owner, self.lease_s)
        except Exception as err:
            log.warning("session %s: could not mark it failed: %s", sid, describe_exception(err))
            return
        try:
            self.store.append(
                sid, cannot_run_events(sid, claim.workflow, exc), self.store.last_seq(sid), epoch=lease.epoch
            )
        except Exception as err:
            log.warning("session %s: could not mark it failed: %s", sid, describe_exception(err))
        finally:
            try:
                self.store.release(lease)
            except Exception:  # best effort: the lease ends by itself
                pass

    # -- draining --------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Let the sessions in hand run on for ``drain_s``, then hand back the rest."""
        tasks = [task for _claim, task in self._active.values()]
        if tasks and self.stopped_by is None:  # a store that refuses writes records nothing
            log.info("draining %d session(s) for up to %gs", len(tasks), self.drain_s)
            await asyncio.wait(tasks, timeout=self.drain_s)
        left = list(self._active.values())
        for claim, _task in left:
            self._hand_back(claim)
        if left:
            await asyncio.wait([task for _claim, task in left], timeout=max(5.0, self.lease_s))
        for _claim, task in list(self._active.values()):  # a node that ignores cancellation
            task.cancel()
        await asyncio.gather(*(task for _c, task in left), return_exceptions=True)

    def _hand_back(self, claim: Claim) -> None:
        """Fence our own invocation and leave the session claimable at once.

        Re-acquiring under a lease that is already over advances the epoch: the running
        invocation's next append or renewal raises ``LeaseLost`` and writes nothing, and
        the session is orphaned (owner alive, lease expired) for the next claimer. The
        abort then stops its node runs now instead of at their next append.
        """
        sid = claim.session_id
        if self.store_writable is False and not self._outage.active:
            # A server that does not answer (a refusal answers at once): each call would wait
            # out its timeout, session after session. Stopped here, recording nothing (an
            # abort would record the session cancelled if the server answered meanwhile).
            log.info("session %s: let go, the store does not answer; its lease expires", sid)
            self.runners[claim.workflow].hand_off(sid, "the worker drains while its store does not answer")
            return
        try:  # released, and said to be handed back: the next taker counts no recovery
            self.store.acquire(sid, dataclasses.replace(self.owner, handed_back=True), 0.0, force=True)
        except StoreNotWritable as exc:  # said once already; the lease expires by itself
            log.info("could not hand back session %s: %s", sid, describe_exception(exc))
        except Exception as exc:
            log.warning("could not hand back session %s: %s", sid, describe_exception(exc))
        self.runners[claim.workflow].abort(sid, reason=DRAIN_REASON)

    # -- convenience -----------------------------------------------------------------------

    def run_sync(self) -> None:
        """:meth:`run` for scripts without an event loop."""
        asyncio.run(self.run())

    def describe(self) -> dict[str, Any]:
        """What this worker is, for logs and the CLI."""
        return {
            "worker_id": self.owner.worker_id,
            "host": self.owner.host,
            "pid": self.owner.pid,
            "workflows": sorted(self.workflows),
            "concurrency": self.concurrency,
            "lease_s": self.lease_s,
        }
