"""The one liveness rule: when is an open run alive, orphaned or overdue.

``resume()``, ``flowscope stuck``, the ``StoreCollector`` and the stores' SQL all ask
the questions answered here, so a run is called the same thing everywhere.
"""

from __future__ import annotations

__all__ = ["DEFAULT_HEARTBEAT_INTERVAL_S", "resume_lease_s"]

DEFAULT_HEARTBEAT_INTERVAL_S = 5.0


def resume_lease_s(heartbeat_interval: float) -> float:
    """How long a session stays owned after its last heartbeat: three missed beats.

    A ``resume()`` within that window is refused (another process may still be running
    the session); after it, the session is taken over. The floor of one second keeps a
    zero interval (heartbeats off) from making every session look abandoned at once.
    """
    return 3 * max(heartbeat_interval, 1.0)
