"""The upkeep role: what keeps a log cheap to run for months: the span-shipping watermark,
group commit, snapshots and pruning.

The watermark and pruning are the role; snapshots, ``storage_bytes`` and the batch forms
have defaults (a store that keeps no snapshot ignores them; the batch forms call the
single ones). :class:`flowscope.store.testing.UpkeepContract` tests it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence

from ..errors import ConcurrencyConflict, LeaseLost
from ..events import Event
from .log import EventLog
from .records import AppendBatch, SessionInfo

__all__ = ["Upkeep"]


class Upkeep(EventLog):
    """Span watermarks, group commit, snapshots and pruning of an event log."""

    @abstractmethod
    def exported_seq(self, session_id: str) -> int:
        """The span-shipping watermark: every span the log ended at or before this ``seq``
        has been accepted by an exporter (0: none known). See
        :mod:`flowscope.observability.shipping`."""

    @abstractmethod
    def set_exported_seq(self, session_id: str, seq: int) -> None:
        """Advance the watermark (never moves it back)."""

    def set_exported_seqs(self, marks: Mapping[str, int]) -> None:
        """:meth:`set_exported_seq` for several sessions (``session_id -> seq``): what one
        export of a batch of spans completed. This default advances them one by one; the
        SQLite and PostgreSQL stores write them in one transaction, so a process shipping
        the spans of a thousand sessions pays one commit per export, not one per session.
        Callable from any thread (exporters run on their processor's)."""
        for session_id, seq in marks.items():
            self.set_exported_seq(session_id, seq)

    def unexported(self) -> list[tuple[SessionInfo, int]]:
        """The sessions whose log has moved past their span watermark, and those still
        ``running`` at it (an owner that died there left spans open, due once it is gone),
        each with it: what a span follower (``flowscope export --follow``) looks at on a
        pass. This default reads every session; the SQLite and PostgreSQL stores ask for
        those rows alone."""
        out = []
        for info in self.sessions():
            mark = self.exported_seq(info.session_id)
            if mark < info.last_seq or (mark == info.last_seq and info.status == "running"):
                out.append((info, mark))
        return out

    def append_many(self, batches: Sequence[AppendBatch]) -> list[list[Event] | BaseException]:
        """Append several sessions' batches ``(session_id, events, expected_last_seq,
        epoch)``; one result per batch, in order: its stored events, or the exception that
        refused it (a conflict, a lost lease). Adapters that can do it in one transaction
        (SQLite) override this; the default appends one batch after another. An error of
        the store itself (a lock, a full disk) is raised, and then no batch is kept."""
        out: list[list[Event] | BaseException] = []
        for session_id, events, expected, epoch in batches:
            try:
                out.append(self.append(session_id, events, expected, epoch=epoch))
            except (ConcurrencyConflict, LeaseLost) as exc:
                out.append(exc)
        return out

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        """Keep ``data``, the JSON of the session's state after event ``seq``, to speed up
        the next resume. Optional: a store that keeps none ignores it."""

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The last snapshot saved for the session as ``(seq, data)``, or None."""
        return None

    @abstractmethod
    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        """Delete whole sessions (log, projections, snapshot, inbox, owner and lease) in one
        transaction; return the ids deleted, in the order given.

        Only a session whose status is in
        :data:`~flowscope.store.records.FINISHED_SESSION_STATUSES`, that has no
        open run (running, waiting_input, waiting_job) and no live owner
        (:func:`~flowscope.liveness.owner_alive`) is deleted; any other id, or one that
        does not exist, is skipped, so a racing resume never loses its log.
        """

    def storage_bytes(self) -> int | None:
        """Bytes the store's data occupies now (what ``delete_sessions`` frees), or None if
        the store cannot tell."""
        return None
