"""The hook port: the before/after hooks every node run passes through.

It lives in the engine and is typed by the engine's own records (``context.py``), so the
engine calls out through it without knowing who listens; :mod:`flowscope.plugins`
re-exports it for plugin authors.

A plugin overrides any of the hooks below; each may be sync or async. ``before_*`` hooks
run in registration order and ``after_*`` hooks in reverse, so plugins nest like context
managers. A hook that raises never fails the workflow (R11, docs/design.md): the error
is logged, counted in :attr:`PluginDispatcher.errors` and reported to every plugin's
``on_plugin_error`` (the metrics plugin turns it into ``flowscope_plugin_errors_total``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import describe_exception

if TYPE_CHECKING:  # pragma: no cover
    from ..events import Event, NodeErrorEvent
    from ..store.base import Claim
    from .context import NodeContext, NodeOutcome, RunInfo, RunResult

__all__ = ["Plugin", "PluginDispatcher", "HOOKS"]

log = logging.getLogger("flowscope.plugins")

HOOKS = (
    "before_run",
    "after_run",
    "before_node",
    "after_node",
    "on_node_error",
    "on_event",
    "on_events",
    "on_worker_claim",
    "on_lease_lost",
    "on_resume_conflict",
    "on_worker_release",
    "on_store_writes",
)


class Plugin:
    """Base class: override the hooks you need. ``name`` labels the plugin in logs and metrics."""

    name = "plugin"

    def before_run(self, run: RunInfo) -> Any:
        """Before ``RunStarted`` is appended; may add to ``run.trace_context``."""

    def after_run(self, run: RunInfo, result: RunResult | None, error: BaseException | None) -> Any:
        """After ``RunFinished`` is appended."""

    def before_node(self, ctx: NodeContext) -> Any:
        """Once per node run, before its first attempt; may add to ``ctx.trace_context``."""

    def after_node(self, ctx: NodeContext, outcome: NodeOutcome) -> Any:
        """Once per node run, after its terminal event."""

    def on_node_error(self, ctx: NodeContext, event: NodeErrorEvent) -> Any:
        """With the ``NodeErrorEvent`` of a failed run (once, at the deepest path)."""

    def on_event(self, event: Event) -> Any:
        """Every event, after it is appended to the store."""

    def on_events(self, events: Sequence[Event]) -> Any:
        """The events of one append, in log order, after they are appended: one call per
        append instead of one per event. A plugin that overrides it gets no ``on_event``
        call from the engine (it may call its own); one that overrides only ``on_event``
        gets one call per event, as before."""

    def on_worker_claim(self, claim: Claim) -> Any:
        """A worker took a session (``claim.workflow``, ``claim.reason``: queued, answered
        or orphaned) and is about to run it. Called by the worker, never by the engine."""

    def on_lease_lost(self, session_id: str, workflow: str) -> Any:
        """An invocation lost its lease to another owner and stopped (before ``after_run``)."""

    def on_resume_conflict(self, session_id: str, workflow: str) -> Any:
        """A ``run``/``resume`` lost a race for its session (``ConcurrencyConflict``: another
        owner or writer got there first) and appended nothing; called once per lost race,
        which is no failure (before ``after_run``, when the invocation had begun)."""

    def on_worker_release(self, claim: Any) -> Any:
        """A worker is done with a claimed session (it completed, paused, failed, lost its
        lease or was handed back). Called by the worker, once per ``on_worker_claim``."""

    def on_store_writes(self, writable: bool) -> Any:
        """A worker's writes to its store began or stopped going through (a full disk, a
        read-only store, a server that does not answer, and back). Called by the worker at
        its first write and at each change, never by the engine."""

    def on_plugin_error(self, plugin: str, hook: str, error: BaseException) -> Any:
        """Another plugin's hook raised (already logged)."""


def _overrides(plugin: Plugin, hook: str) -> bool:
    """Whether ``plugin`` has a hook of its own by that name (an object that is no
    :class:`Plugin` subclass has the hooks it defines)."""
    mine = getattr(type(plugin), hook, None)
    return mine is not None and mine is not getattr(Plugin, hook)


def _plugin_list(plugins: Iterable[Plugin]) -> list[Plugin]:
    """``plugins`` as a list, or a ``TypeError`` saying how to pass them: a list of
    instances (one plugin alone, or a class, is a mistake caught here rather than at every
    hook call)."""
    if isinstance(plugins, (Plugin, type, str, bytes)) or not isinstance(plugins, Iterable):
        raise TypeError(
            f"plugins is a list of plugin instances, e.g. plugins=[MetricsPlugin()], not {type(plugins).__name__}"
        )
    out = list(plugins)
    for p in out:
        if isinstance(p, type):
            raise TypeError(f"plugins takes instances: {p.__name__}(), not the class {p.__name__}")
        if not isinstance(p, Plugin) and not any(_overrides(p, hook) for hook in HOOKS):
            raise TypeError(
                f"{p!r:.60} is no plugin: subclass flowscope.Plugin and override the hooks you need"
            )
    return out


class PluginDispatcher:
    """Calls the hooks of a list of plugins, skipping those a plugin does not override.

    The engine only ever talks to this class. The bound hooks are computed once, as
    tuples, so a run with no plugins pays nothing per node and a node hook's call is one
    loop over plain functions.
    """

    def __init__(self, plugins: Iterable[Plugin] = ()) -> None:
        self.plugins = _plugin_list(plugins)
        self.names = tuple(getattr(p, "name", type(p).__name__) for p in self.plugins)
        self.errors: Counter[tuple[str, str]] = Counter()
        self._hooks: dict[str, tuple[tuple[Plugin, Any], ...]] = {}
        for hook in (*HOOKS, "on_plugin_error"):
            bound = [(p, getattr(p, hook)) for p in self.plugins if _overrides(p, hook)]
            if hook.startswith("after_"):
                bound.reverse()
            self._hooks[hook] = tuple(bound)
        #: Who hears of appended events, in registration order: a plugin's ``on_events``
        #: (one call per append) if it overrides it, else its ``on_event`` (one per event).
        self._deliver: tuple[tuple[Plugin, Callable[[Any], Any], bool], ...] = tuple(
            (p, p.on_events, True) if _overrides(p, "on_events") else (p, p.on_event, False)
            for p in self.plugins
            if _overrides(p, "on_events") or _overrides(p, "on_event")
        )
        self.has_on_event = bool(self._deliver)
        self.has_node_hooks = bool(
            self._hooks["before_node"] or self._hooks["after_node"] or self._hooks["on_node_error"]
        )

    @property
    def ships_spans(self) -> bool:
        """Whether a plugin ships spans and records what it shipped (its ``ships_spans``
        attribute): the owner record says so (:class:`~flowscope.ownership.Owner`)."""
        return any(getattr(p, "ships_spans", False) for p in self.plugins)

    def wants(self, hook: str) -> bool:
        if hook == "on_event" or hook == "on_events":
            return self.has_on_event
        return bool(self._hooks[hook])

    async def call(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on every plugin that has it, in hook order, isolating failures."""
        pending = self.start(hook, *args)
        if pending is not None:
            await pending

    def start(self, hook: str, *args: Any) -> Awaitable[None] | None:
        """:meth:`call` without a coroutine while every hook is a plain function (the node
        path's case): the hooks run now and None is returned. From the first hook that
        returns an awaitable on, the rest is returned, to be awaited, in the same order."""
        hooks = self._hooks[hook]
        i = 0
        for plugin, fn in hooks:
            i += 1
            try:
                result = fn(*args)
            except Exception as exc:  # R11 (docs/design.md): a plugin never fails the run
                self._failed(plugin, hook, exc)
                continue
            if result is not None and inspect.isawaitable(result):
                return self._finish(hook, plugin, result, hooks[i:], args)
        return None

    def on_events(self, events: Sequence[Event]) -> None:
        """Tell plugins of the events of one append (in log order): one ``on_events`` call
        each, or one ``on_event`` per event for a plugin that only has that. Failures are
        isolated per call, an async hook's coroutine is scheduled, as :meth:`call_sync` does."""
        for plugin, fn, batched in self._deliver:
            if batched:
                self._tell(plugin, "on_events", fn, events)
            else:
                for e in events:
                    self._tell(plugin, "on_event", fn, e)

    def _tell(self, plugin: Plugin, hook: str, fn: Callable[..., Any], *args: Any) -> None:
        """Call one plugin's hook where nothing can await it: a failure is isolated, an
        awaitable it returns is scheduled on the running loop (:meth:`_schedule`)."""
        try:
            result = fn(*args)
        except Exception as exc:
            self._failed(plugin, hook, exc)
            return
        if result is not None and inspect.isawaitable(result):
            self._schedule(plugin, hook, result)

    def _schedule(self, plugin: Plugin, hook: str, result: Awaitable[Any]) -> None:
        """Run an async hook's awaitable on the running loop; its failure is isolated too."""
        try:
            task = asyncio.ensure_future(result)
        except Exception as exc:  # no running loop
            self._failed(plugin, hook, exc)
            return
        task.add_done_callback(partial(self._task_done, plugin=plugin, hook=hook))

    async def _finish(
        self,
        hook: str,
        plugin: Plugin,
        first: Awaitable[Any],
        rest: tuple[tuple[Plugin, Any], ...],
        args: tuple[Any, ...],
    ) -> None:
        try:
            await first
        except Exception as exc:
            self._failed(plugin, hook, exc)
        for plugin, fn in rest:
            try:
                result = fn(*args)
                if result is not None and inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self._failed(plugin, hook, exc)

    def call_sync(self, hook: str, *args: Any) -> None:
        """Like :meth:`call` for places that cannot await; an async hook's coroutine is
        scheduled on the running loop instead of awaited. ``on_event`` (one event) reaches
        the plugins that take batches too, as a batch of one (:meth:`on_events`)."""
        if hook == "on_event" or hook == "on_events":
            self.on_events(args[0] if hook == "on_events" else args)
            return
        for plugin, fn in self._hooks[hook]:
            self._tell(plugin, hook, fn, *args)

    def _task_done(self, task: asyncio.Future[Any], *, plugin: Plugin, hook: str) -> None:
        if not task.cancelled():
            exc = task.exception()
            if exc is not None:
                self._failed(plugin, hook, exc)

    def _failed(self, plugin: Plugin, hook: str, exc: BaseException) -> None:
        name = getattr(plugin, "name", type(plugin).__name__)
        self.errors[(name, hook)] += 1
        log.warning("plugin %r raised in %s: %s", name, hook, describe_exception(exc))
        for other, fn in self._hooks["on_plugin_error"]:
            try:
                fn(name, hook, exc)
            except Exception as broken:  # only logged, never recursed into; one redacted line as above
                other_name = getattr(other, "name", type(other).__name__)
                log.warning("plugin %r raised in on_plugin_error: %s", other_name, describe_exception(broken))
