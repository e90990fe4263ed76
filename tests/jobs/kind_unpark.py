"""Job kinds for tests/storage/test_kind_unpark.py (how jobs parked by their kind come back).

Workers load them with ``worker_env(kind_unpark)`` (tests/jobs/__init__.py). The kinds have no
limits in code: the tests set them as operator overrides. Handlers record each run in the plain
table ``upk_runs`` of the test database (created by the tests) over a connection of their own, and a
handler given ``block`` runs until the test writes that name into ``upk_flags``."""

from __future__ import annotations

import os
from typing import Any

from awa_django import JobContext, job
from tests.support.database import handler_conn
from tests.support.polling import wait_for

WORKER_SETTINGS: dict[str, Any] = {
    "HEARTBEAT_STALENESS": 60.0,
}


def _run(ctx: JobContext, block: str | None = None) -> None:
    c = handler_conn()
    c.execute(
        "INSERT INTO upk_runs (job_id, kind, attempt, pid, started)"
        " VALUES (%s, %s, %s, %s, clock_timestamp())",
        [ctx.id, ctx.kind, ctx.attempt, os.getpid()],
    )
    if block is not None:
        wait_for(
            lambda: c.execute("SELECT 1 FROM upk_flags WHERE name = %s", [block]).fetchone(),
            timeout=60,
            interval=0.02,
            message=f"flag {block}",
        )
    c.execute(
        "UPDATE upk_runs SET ended = clock_timestamp()"
        " WHERE job_id = %s AND attempt = %s AND pid = %s",
        [ctx.id, ctx.attempt, os.getpid()],
    )


for _name in ("upkw.heavy", "upkw.light", "upkw.other"):
    job(name=_name, queue="upkw", takes_context=True)(lambda ctx, block=None: _run(ctx, block))
