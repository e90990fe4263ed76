"""Job kinds for tests/worker/limits/test_kind_limit_fast_path_workers.py (per-kind limits on
the claim fast path).

Workers load them with ``worker_env(kind_limit_fast_path)`` (tests/jobs/__init__.py). Every handler
records its run in ``fa3_runs`` (created by the tests) over a connection of its own, committed at
once, with the database clock (``clock_timestamp()``) at its start and end, so that the test can
compute what ran at the same time."""

from __future__ import annotations

import os
import time
from typing import Any

from awa_django import JobContext, job
from tests.support.database import handler_conn

WORKER_SETTINGS: dict[str, Any] = {
    "HEARTBEAT_STALENESS": 60.0,
}

FA3_TABLES = """
CREATE TABLE IF NOT EXISTS fa3_runs (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, kind text NOT NULL, queue text NOT NULL,
    attempt integer NOT NULL, pid integer NOT NULL, started timestamptz NOT NULL,
    ended timestamptz);
TRUNCATE fa3_runs;
"""


def _run(ctx: JobContext, seconds: float = 0.0) -> None:
    c = handler_conn()
    row = c.execute(
        "INSERT INTO fa3_runs (job_id, kind, queue, attempt, pid, started)"
        " VALUES (%s, %s, %s, %s, %s, clock_timestamp()) RETURNING id",
        [ctx.id, ctx.kind, ctx.queue, ctx.attempt, os.getpid()],
    ).fetchone()
    assert row is not None
    try:
        if seconds:
            time.sleep(seconds)
    finally:
        c.execute("UPDATE fa3_runs SET ended = clock_timestamp() WHERE id = %s", [row[0]])


def _register(name: str, queue: str = "fa3", **options: Any) -> None:
    def handler(ctx: JobContext, seconds: float = 0.0) -> None:
        _run(ctx, seconds)

    handler.__name__ = name.replace(".", "_")
    job(name=name, queue=queue, takes_context=True, **options)(handler)


_register("fa3.k1", global_concurrency=1)
_register("fa3.k2", global_concurrency=2)
_register("fa3.k3", global_concurrency=3)
_register("fa3.k5", global_concurrency=5)
_register("fa3.free")
_register("fa3.free2")
_register("fa3.plain")  # no limit in code: the operator limits it at runtime
_register("fa3.rated", rate_limit=20, rate_burst=4)
_register("fa3.both", global_concurrency=2, rate_limit=30, rate_burst=3)
_register("fa3.qk2", queue="fa3q", global_concurrency=2)
_register("fa3.qfree", queue="fa3q")
_register("fa3.r1", rate_limit=40, rate_burst=4)
_register("fa3.r2", rate_limit=40, rate_burst=4)
_register("fa3.r3", rate_limit=40, rate_burst=4, global_concurrency=2)
