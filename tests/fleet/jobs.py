"""The fleet test's one job: record the execution, work for a while, record its end.

Both ledger writes go through the handler thread's Django connection, from the host's
namespace, so a cut link holds them (TCP retransmits) until it heals.
"""

from __future__ import annotations

import os
import time
import uuid

from django.db import connection

from awa_django import JobContext, job
from tests.fleet.sql import statement

HOST = os.environ.get("AWA_FLEET_HOST", "root")


def _write(name: str, params: list[str | int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement(name), params)


@job(takes_context=True, name="fleet.work", queue="fleet", max_attempts=8)
def work(ctx: JobContext, seconds: float) -> None:
    key = str(uuid.uuid4())
    _write("exec_start", [key, ctx.id, ctx.run_lease, ctx.attempt, HOST, os.getpid()])
    time.sleep(seconds)
    _write("exec_finish", [key])
