"""The inbox role: messages for a session's owner (answers, job results, cancel, retry),
taken in exactly when the events they cause are durable.

An operator's ``answer``, ``cancel`` and ``retry`` reach a session a live worker owns
through it. :class:`flowscope.store.testing.InboxContract` tests it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..events import Event
from .log import EventLog
from .records import Message

__all__ = ["Inbox"]


class Inbox(EventLog):
    """Durable messages for a session's owner, one writer per session."""

    @abstractmethod
    def send(
        self, session_id: str, kind: str, body: Mapping[str, Any], *, ts: float | None = None
    ) -> Message:
        """Keep a :class:`Message` for the session's owner, durably, and return it; a
        paused session with a message is claimable as ``answered``. ``body`` is JSON data.
        A store without this role holds no messages: its sessions cannot be answered
        while they run, only resumed by ``flowscope resume``."""

    @abstractmethod
    def inbox(self, session_id: str) -> list[Message]:
        """The session's messages not yet taken in, oldest first."""

    @abstractmethod
    def take_in(
        self,
        session_id: str,
        events: Sequence[Event],
        expected_last_seq: int,
        message_ids: Collection[int],
        *,
        epoch: int,
    ) -> list[Event]:
        """Append ``events`` (what the messages say; may be none) as :meth:`append` does,
        under the owner's ``epoch``, and delete the messages ``message_ids``, in one
        transaction: a message is taken in exactly when its events are durable."""

    def sessions_with_mail(self, session_ids: Collection[str]) -> set[str]:
        """Which of ``session_ids`` have a message in their inbox: what an owner's lease
        keeper asks once per round, so that a cancel reaches a live run within a lease."""
        return {sid for sid in session_ids if self.inbox(sid)}
