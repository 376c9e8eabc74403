"""Waiting, in a test, for what another thread or process does: one poll loop for all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["poll", "wait_for", "until"]

T = TypeVar("T")


def poll(predicate: Callable[[], T], timeout: float, interval: float = 0.02) -> T | None:
    """The first true value ``predicate`` returns within ``timeout`` seconds (asked at least
    once), or None: for a test that says itself what went wrong."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def wait_for(
    predicate: Callable[[], T], timeout: float = 20.0, what: str = "the condition", interval: float = 0.02
) -> T:
    """:func:`poll`, failing the test with ``what`` it waited for if the time runs out."""
    value = poll(predicate, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
    return value


async def until(
    predicate: Callable[[], object], what: str, timeout: float = 20.0, interval: float = 0.02
) -> None:
    """:func:`wait_for` on the event loop, for a test whose processes run in it."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)
