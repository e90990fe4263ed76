"""Job kinds for tests/storage/test_claim_concurrent_sessions.py (``awa.claim_v3`` in workers).

Workers load them with ``worker_env(concurrent_claims)`` (tests/jobs/__init__.py). Every handler
records its attempt ``(job_id, run_lease, attempt)`` in ``l17_runs`` (created by the tests) over a
connection of its own, committed at once. ``l17.flaky`` fails its first attempt, ``l17.sleepy``
snoozes its first attempt: both come back through the deferred plane."""

from __future__ import annotations

import os
from typing import Any

from awa_django import JobContext, Snooze, job
from tests.support.database import handler_conn

WORKER_SETTINGS: dict[str, Any] = {
    "HEARTBEAT_STALENESS": 30.0,
    "CLAIM_BATCH_SIZE": 1,
}

L17_TABLES = """
CREATE TABLE IF NOT EXISTS l17_runs (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, run_lease bigint NOT NULL,
    attempt integer NOT NULL, kind text NOT NULL, pid integer NOT NULL);
TRUNCATE l17_runs;
"""


def _record(ctx: JobContext) -> None:
    handler_conn().execute(
        "INSERT INTO l17_runs (job_id, run_lease, attempt, kind, pid) VALUES (%s, %s, %s, %s, %s)",
        [ctx.id, ctx.run_lease, ctx.attempt, ctx.kind, os.getpid()],
    )


@job(name="l17.plain", queue="l17w", takes_context=True)
def plain(ctx: JobContext, n: int = 0) -> None:
    _record(ctx)


@job(name="l17.flaky", queue="l17w", takes_context=True)
def flaky(ctx: JobContext, n: int = 0) -> None:
    _record(ctx)
    if ctx.attempt == 1:
        raise ValueError("first attempt fails on purpose")


@job(name="l17.sleepy", queue="l17w", takes_context=True)
def sleepy(ctx: JobContext, n: int = 0) -> Snooze | None:
    row = handler_conn().execute("SELECT count(*) FROM l17_runs WHERE job_id = %s", [ctx.id])
    first = row.fetchone() == (0,)
    _record(ctx)
    return Snooze(0.05) if first else None
