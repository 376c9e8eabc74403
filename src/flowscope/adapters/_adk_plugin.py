"""The ADK plugin half of the ADK bridge (:mod:`flowscope.adapters.adk`): ADK calls it
at each invocation's boundaries and for its events; it hands each call to the bridge."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from google.adk.plugins.base_plugin import BasePlugin

__all__ = ["FlowscopeADKPlugin", "InvocationSink"]


class InvocationSink(Protocol):
    """What the plugin hands ADK's calls to (the bridge, ``FlowscopeADK``)."""

    _messages: dict[str, Any]

    def _begin(self, ic: Any) -> Any: ...
    def _on_event(self, ic: Any, event: Any) -> None: ...
    def _end(self, ic: Any, error: BaseException | None) -> None: ...


class FlowscopeADKPlugin(BasePlugin):
    """The ADK plugin half of the bridge: invocation boundaries and enclosing workflows."""

    def __init__(self, bridge: InvocationSink) -> None:
        super().__init__(name="flowscope")
        self._bridge = bridge
        #: ADK invocation id -> the task reading its run_async() and the callback on its end
        self._watching: dict[str, tuple[asyncio.Task[Any], Any]] = {}

    async def on_user_message_callback(self, *, invocation_context: Any, user_message: Any) -> None:
        self._bridge._messages[invocation_context.invocation_id] = user_message
        return None

    async def before_run_callback(self, *, invocation_context: Any) -> None:
        self._bridge._begin(invocation_context)
        # ADK calls neither after_run nor on_run_error when the task reading run_async()
        # is cancelled (or stops without closing it): that task's end closes the invocation
        task = asyncio.current_task()
        if task is not None:
            self._watch(invocation_context, task)
        return None

    async def on_event_callback(self, *, invocation_context: Any, event: Any) -> None:
        self._bridge._on_event(invocation_context, event)
        return None

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        self._end(invocation_context, None)

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        self._end(invocation_context, error)

    def _watch(self, ic: Any, task: asyncio.Task[Any]) -> None:
        """End ``ic``'s invocation cancelled if ``task`` ends with it still open."""

        def ended(_: Any) -> None:
            if self._watching.pop(ic.invocation_id, None) is not None:
                self._bridge._end(ic, asyncio.CancelledError())

        task.add_done_callback(ended)
        self._watching[ic.invocation_id] = (task, ended)

    def _end(self, ic: Any, error: BaseException | None) -> None:
        watched = self._watching.pop(ic.invocation_id, None)
        if watched is not None:  # a task that reads many invocations keeps no callback of each
            watched[0].remove_done_callback(watched[1])
        self._bridge._end(ic, error)
