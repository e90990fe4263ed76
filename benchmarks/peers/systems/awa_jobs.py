"""The awa_django job kind of the cross-system benchmark."""

from __future__ import annotations

from awa_django import job
from benchmarks.peers.sql import ahandle


@job(queue="peers")
async def peer(key: int) -> None:
    """No-op or ledger row, per ``BENCH_MODE``."""
    await ahandle(key)
