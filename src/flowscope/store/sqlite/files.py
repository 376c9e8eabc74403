"""The database file and its ``-wal`` as this process opened them: which file it is
(device and inode, to notice one restored or moved into place), and whether the ``-wal``
file a connection writes to is still the one beside the database."""

from __future__ import annotations

import os
import time

from .faults import wal_removed

__all__ = ["identity", "WalWatch", "WAL_CHECK_S"]

#: How often a writing transaction checks (one stat) that the -wal file it writes to is
#: still the one beside the database; a failed write always checks.
WAL_CHECK_S = 1.0


def identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, None if there is none (or it is in memory)."""
    if path == ":memory:":
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class WalWatch:
    """The ``-wal`` file one connection writes to: deleted or replaced under a running
    process, its commits would be lost. ``tracked``: writable and in WAL mode (else there is
    nothing to watch); the file is known once the first transaction makes it."""

    __slots__ = ("path", "tracked", "wal", "checked", "removed")

    def __init__(self, path: str, tracked: bool) -> None:
        self.path = path
        self.tracked = tracked
        self.wal = identity(path + "-wal") if tracked else None  # None until the first transaction makes it
        self.checked = 0.0
        #: Once moved, for good: this connection's -wal is unlinked or replaced, and every
        #: commit into it would be lost (a recreated file beside it is another's).
        self.removed = False

    def moved(self) -> bool:
        """Whether the -wal file this connection writes to is not the one at ``path-wal``."""
        if not self.tracked:
            return False
        if self.removed:
            return True
        self.checked = time.monotonic()
        now = identity(self.path + "-wal")
        if self.wal is None:  # the first transaction since open made it: this is ours
            self.wal = now
            return False
        self.removed = now != self.wal
        return self.removed

    def check(self) -> None:
        """Before a commit, at most every :data:`WAL_CHECK_S` (at every one once it has
        moved): refuse to commit into a removed -wal file
        (:class:`~flowscope.errors.StoreWalRemoved`; the transaction rolls back)."""
        if self.tracked and (self.removed or time.monotonic() - self.checked >= WAL_CHECK_S) and self.moved():
            raise wal_removed(self.path)
