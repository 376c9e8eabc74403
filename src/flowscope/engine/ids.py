"""The ids flowscope makes: of sessions (when the caller names none) and of invocations."""

from __future__ import annotations

import os
import time

__all__ = ["new_id"]


def new_id() -> str:
    """A new id: 32 hex digits, a version-7 UUID's (RFC 9562): the Unix time in
    milliseconds (48 bits), then 74 random bits, so ids made later sort later.

    A session's id leads the keys of the store's indexes (its events, its node runs, its
    row): the sessions of one time take their entries at one end of each index, where a
    commit of many sessions writes a few shared pages, instead of one page per session
    scattered over the whole index, as random ids (version 4) did. The id tells when the
    session was made; the 74 random bits keep it unique."""
    b = bytearray((time.time_ns() // 1_000_000).to_bytes(6, "big") + os.urandom(10))
    b[6] = (b[6] & 0x0F) | 0x70
    b[8] = (b[8] & 0x3F) | 0x80
    return b.hex()
