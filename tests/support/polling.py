"""Polling with a deadline: the one place in the test suite that sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["WaitTimeout", "wait_for"]

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition polled by :func:`wait_for` did not hold before its deadline."""


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "the condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    This is the one place in the test suite that sleeps. Tests wait on observable state (a row,
    a process exit, a file), never for a fixed time. ``message`` (or a callable producing it,
    e.g. to include a subprocess's output) says what was awaited if the deadline passes.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {text}")
        time.sleep(interval)
