"""The :class:`EventStore` contract as a reusable test suite: every adapter must pass it.

Subclass :class:`EventStoreContract` in a class whose name starts with ``Test`` and give
it the one factory, :meth:`~EventStoreContract.create_store`; pytest then collects and
runs every ``test_*`` method against your store::

    from flowscope.store.testing import EventStoreContract

    class TestMyStore(EventStoreContract):
        def create_store(self) -> EventStore:
            return MyStore(self.tmp_path / "events.db")   # a fresh directory per test

Each test gets a new, empty store from ``create_store()`` and closes it afterwards. The
suite needs pytest (it uses fixtures, ``parametrize`` and ``raises``); flowscope does not
import this module, so pytest is only needed where the suite runs. The helpers
(:func:`one_of_each`, :func:`random_log`, :func:`append_in_batches`, ...) build the logs
the contract uses, for an adapter's own tests too.

The contract is cut like the port: :class:`EventLogContract`, :class:`OwnershipContract`,
:class:`InboxContract` and :class:`UpkeepContract` test one role each, so a store that
implements only the event log passes ``EventLogContract`` first; :class:`EventStoreContract`
is all of them plus the rules that cross roles.
"""

# ruff: noqa: E402 (the imports below come after the registration, on purpose)
import pytest

# pytest rewrites assertions only in test modules: the contract's live here, so register
# them before they are imported, or a user's failing adapter sees a bare AssertionError
# instead of the values that differ.
pytest.register_assert_rewrite(
    *(
        f"{__name__}.{m}"
        for m in (
            "base",
            "claim_limit",
            "helpers",
            "inbox",
            "lease_end",
            "lease_start",
            "log",
            "node_runs",
            "ownership",
            "projection",
            "store",
            "upkeep",
        )
    )
)

from .base import ContractBase
from .claim_limit import ClaimLimitContract
from .helpers import (
    INV,
    LIVENESS_CASES,
    LIVENESS_NOW,
    LIVENESS_STALE_AFTER_S,
    SID,
    answer_events,
    append_in_batches,
    dead_owner,
    ev,
    finished_session,
    liveness_log,
    nested_logs,
    node_ev,
    one_of_each,
    other_host_owner,
    paused_log,
    random_log,
    run_of,
    submitted_log,
)
from .inbox import InboxContract
from .lease_end import LeaseEndContract
from .lease_start import LeaseStartContract
from .log import EventLogContract
from .ownership import OwnershipContract, step_wall_clock
from .projection import ProjectionContract
from .store import EventStoreContract
from .upkeep import UpkeepContract

__all__ = [
    "EventStoreContract",
    "EventLogContract",
    "ProjectionContract",
    "OwnershipContract",
    "LeaseStartContract",
    "LeaseEndContract",
    "ClaimLimitContract",
    "InboxContract",
    "UpkeepContract",
    "ContractBase",
    "SID",
    "INV",
    "ev",
    "node_ev",
    "one_of_each",
    "random_log",
    "append_in_batches",
    "run_of",
    "LIVENESS_CASES",
    "dead_owner",
    "other_host_owner",
    "LIVENESS_NOW",
    "LIVENESS_STALE_AFTER_S",
    "liveness_log",
    "nested_logs",
    "submitted_log",
    "paused_log",
    "answer_events",
    "finished_session",
    "step_wall_clock",
]
