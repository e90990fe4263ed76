"""Job kinds used by the benchmarks."""

from __future__ import annotations

from awa_django import job


@job(queue="bench")
def noop(n: int) -> None:
    """A no-op job: the benchmarks measure the queue, not the work."""
