"""The awa_django job kinds of the cross-system benchmark: one ``async def``, one plain ``def``
(awa_django runs the latter in its handler thread pool)."""

from __future__ import annotations

from awa_django import job
from benchmarks.peers.sql import ahandle, handle


@job(queue="peers")
async def peer(key: int) -> None:
    """No-op or ledger row, per ``BENCH_MODE``."""
    await ahandle(key)


@job(queue="peers")
def peer_sync(key: int) -> None:
    """The same body, sync."""
    handle(key)
