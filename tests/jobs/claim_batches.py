"""Job kinds for tests/worker/test_large_claim_batches.py (``CLAIM_BATCH_SIZE`` 512).

Every handler appends ``event job_id run_lease pid wall_time weight`` to the file named by
``CB33_LOG`` (one ``os.write`` of a short line on an ``O_APPEND`` descriptor: atomic between
processes and threads), at its start and at its end, so a test can tell which attempts ran at
once. Nothing here touches the database: hundreds of handlers at once must not need hundreds
of connections.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from awa_django import JobContext, job


def record(ctx: JobContext, event: str) -> None:
    """Append one line for ``ctx``'s attempt to ``CB33_LOG``."""
    weight = (ctx.metadata or {}).get("awa:weight", 1)
    line = f"{event} {ctx.id} {ctx.run_lease} {os.getpid()} {time.time():.6f} {weight}\n"
    fd = os.open(os.environ["CB33_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@job(name="cb33.slow", queue="cb33", takes_context=True)
async def slow(ctx: JobContext, seconds: float = 0.0) -> None:
    record(ctx, "start")
    await asyncio.sleep(seconds)
    record(ctx, "end")


@job(name="cb33.sync_slow", queue="cb33", takes_context=True)
def sync_slow(ctx: JobContext, seconds: float = 0.0) -> None:
    record(ctx, "start")
    time.sleep(seconds)
    record(ctx, "end")


@job(name="cb33.deadline", queue="cb33", takes_context=True, deadline=1.0)
async def deadline(ctx: JobContext, seconds: float = 30.0) -> str:
    """Runs until told to stop (its 1 s deadline), then returns."""
    record(ctx, "start")
    until = time.monotonic() + seconds
    while not ctx.is_cancelled() and time.monotonic() < until:
        await asyncio.sleep(0.02)
    record(ctx, "end" if not ctx.is_cancelled() else "told")
    return "stopped"


@job(name="cb33.big", queue="cb33", takes_context=True)
def big(ctx: JobContext, payload: Any = None) -> int:
    record(ctx, "start")
    size = len(payload or ())
    record(ctx, "end")
    return size
