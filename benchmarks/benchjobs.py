"""Job kinds used by the benchmarks."""

from __future__ import annotations

from awa_django import job


@job(queue="bench")
def noop(n: int) -> None:
    """A no-op job: the benchmarks measure the queue, not the work."""


@job(queue="bench-async")
async def anoop(n: int) -> None:
    """An async no-op job."""


@job(queue="bench-unique", unique=True)
def unique_noop(n: int) -> None:
    """A no-op unique job (keyed by its argument)."""


@job(queue="bench-flow")
async def asleep(seconds: float) -> None:
    """An async job that waits ``seconds`` (flow_cost.py: achieved concurrency under a limit)."""
    import asyncio

    await asyncio.sleep(seconds)


@job(queue="probe")
def probe(n: int) -> None:
    """A scheduled job whose start tells how late promotion ran (benchmarks/maintenance_lag.py)."""


@job(queue="orphans")
def orphan(n: int) -> None:
    """A job claimed by a worker that never runs it, for rescue (benchmarks/maintenance_lag.py)."""
