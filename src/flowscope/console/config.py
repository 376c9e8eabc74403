"""What one start of the console serves, and to whom: its store, its address, its token."""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field

from ..store.base import EventStore

__all__ = ["ConsoleConfig", "LOOPBACK_NAMES"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class ConsoleConfig:
    """What one start of the console serves, and to whom."""

    store: EventStore
    #: The database as it may be shown (a URL's password masked).
    db_shown: str
    #: What every command the console shows starts with: ``flowscope --db ...`` for the
    #: database it serves (``command_prefix``), so that a command pasted acts on it.
    prefix: str = "flowscope"
    host: str = "127.0.0.1"
    port: int = 8765
    read_only: bool = False
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    #: Names the ``Host`` header may carry besides the loopback ones and ``host``.
    allowed_hosts: tuple[str, ...] = ()
    stale_after_s: float = 60.0
    queued_after_s: float = 60.0
    live_interval_s: float = 1.0
    #: Set when the server is asked to stop: each page's change stream ends within one
    #: ``live_interval_s``, so that the server stops without cutting one off mid-response.
    stopping: threading.Event = field(default_factory=threading.Event, compare=False)

    @property
    def cookie(self) -> str:
        """The token's cookie: named by port, since cookies do not tell ports apart."""
        return f"flowscope_token_{self.port}"

    def host_names(self) -> set[str]:
        names = {*LOOPBACK_NAMES, *self.allowed_hosts}
        if self.host not in ("0.0.0.0", "::", ""):
            names.add(self.host)
        return {n.lower() for n in names}

    def origins(self) -> set[str]:
        out = set()
        for n in self.host_names():
            h = f"[{n}]" if ":" in n and not n.startswith("[") else n
            out.add(f"http://{h}:{self.port}")
        return out

    def url(self) -> str:
        """The URL printed on the console's first line, with its token."""
        h = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        h = f"[{h}]" if ":" in h else h
        return f"http://{h}:{self.port}/?token={self.token}"
