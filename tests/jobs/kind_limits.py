"""Job kinds for tests/worker/limits/test_kind_limits_workers.py (per-kind flow limits in workers).

Workers load them with ``worker_env(kind_limits)`` (tests/jobs/__init__.py). Handlers record what
they do in plain tables of the test database (``katk_runs``, ``katk_gauge``, ``katk_flags``),
created by the tests, over a connection of their own (``DATABASE_URL``), committed at once so
that the test sees them while the handler still runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from awa_django import JobContext, job
from tests.support.database import handler_conn
from tests.support.polling import WaitTimeout, wait_for


def _run(ctx: JobContext, gauge: str, seconds: float, block: str | None = None) -> None:
    c = handler_conn()
    c.execute(
        "INSERT INTO katk_runs (job_id, kind, queue, attempt, pid, started)"
        " VALUES (%s, %s, %s, %s, %s, clock_timestamp())",
        [ctx.id, ctx.kind, ctx.queue, ctx.attempt, os.getpid()],
    )
    c.execute(
        "INSERT INTO katk_gauge (name, cur, peak) VALUES (%s, 1, 1)"
        " ON CONFLICT (name) DO UPDATE SET cur = katk_gauge.cur + 1,"
        " peak = greatest(katk_gauge.peak, katk_gauge.cur + 1)",
        [gauge],
    )
    try:
        if block is not None:
            # Until the test raises the flag (a row): a handler held open on database state.
            wait_for(
                lambda: c.execute("SELECT 1 FROM katk_flags WHERE name = %s", [block]).fetchone(),
                timeout=60,
                interval=0.02,
                message=f"flag {block}",
            )
        elif seconds:
            time.sleep(seconds)
    finally:
        c.execute("UPDATE katk_gauge SET cur = cur - 1 WHERE name = %s", [gauge])
        c.execute(
            "UPDATE katk_runs SET ended = clock_timestamp()"
            " WHERE job_id = %s AND attempt = %s AND pid = %s AND ended IS NULL",
            [ctx.id, ctx.attempt, os.getpid()],
        )


@job(name="katk.lim2", queue="katk", global_concurrency=2, takes_context=True)
def lim2(ctx: JobContext, seconds: float = 0.05, block: str | None = None) -> None:
    _run(ctx, "katk.lim2", seconds, block)


@job(name="katk.lim1", queue="katk", global_concurrency=1, takes_context=True)
def lim1(ctx: JobContext, seconds: float = 0.05, block: str | None = None) -> None:
    _run(ctx, "katk.lim1", seconds, block)


@job(name="katk.free", queue="katk", takes_context=True)
def free(ctx: JobContext, seconds: float = 0.0, block: str | None = None) -> None:
    _run(ctx, "katk.free", seconds, block)


@job(name="katk.plain", queue="katk", takes_context=True)
def plain(ctx: JobContext, seconds: float = 0.0, block: str | None = None) -> None:
    """No limit in code: the operator limits it at runtime."""
    _run(ctx, "katk.plain", seconds, block)


@job(name="katk.rated", queue="katk-rate", rate_limit=20, rate_burst=5, takes_context=True)
def rated(ctx: JobContext, seconds: float = 0.0, block: str | None = None) -> None:
    _run(ctx, "katk.rated", seconds, block)


@job(name="katk.fails_once", queue="katk", global_concurrency=1, takes_context=True)
def fails_once(ctx: JobContext, seconds: float = 0.05) -> None:
    _run(ctx, "katk.fails_once", seconds)
    if ctx.attempt == 1:
        raise ValueError("first attempt fails on purpose")


@job(name="katk.settings_limited", queue="katk", takes_context=True)
def settings_limited(ctx: JobContext, seconds: float = 0.05, block: str | None = None) -> None:
    """No limit in code: AWA["KINDS"] limits it in some tests."""
    _run(ctx, "katk.settings_limited", seconds, block)


@job(name="katk:ünï/código", queue="katk", global_concurrency=1, takes_context=True)
def odd_name(ctx: JobContext, seconds: float = 0.05, block: str | None = None) -> None:
    _run(ctx, "katk:ünï/código", seconds, block)


@job(name="katk.waits", queue="katk", global_concurrency=1, takes_context=True)
def waits(ctx: JobContext, seconds: float = 0.05) -> Any:
    """Registers a callback and parks; its permit must be free while it waits."""
    from awa_django import WaitForCallback

    _run(ctx, "katk.waits", seconds)
    return WaitForCallback(ctx.callback_id, timeout=60)


@job(
    name="katk.overrun",
    queue="katk",
    global_concurrency=1,
    takes_context=True,
    deadline=0.4,
    max_attempts=3,
)
def overrun(ctx: JobContext, seconds: float = 1.5) -> None:
    """Ignores its deadline: the abandoned handler keeps the kind's permit until it returns."""
    _run(ctx, "katk.overrun", seconds)


@job(
    name="katk.both",
    queue="katk",
    global_concurrency=2,
    rate_limit=10,
    rate_burst=2,
    takes_context=True,
)
def both(ctx: JobContext, seconds: float = 0.05) -> None:
    _run(ctx, "katk.both", seconds)


def _many(ctx: JobContext, seconds: float = 0.0) -> None:
    _run(ctx, ctx.kind, seconds)


for _i in range(4):
    job(name=f"katk.r{_i}", queue="katk-multi", rate_limit=10, rate_burst=2, takes_context=True)(
        _many
    )
for _i in range(4):
    job(name=f"katk.c{_i}", queue="katk-multi", global_concurrency=1, takes_context=True)(_many)


@job(name="katk.snoozer", queue="katk", global_concurrency=1, takes_context=True)
def snoozer(ctx: JobContext, seconds: float = 0.02) -> Any:
    from awa_django import Snooze

    before = handler_conn().execute("SELECT count(*) FROM katk_runs WHERE job_id = %s", [ctx.id])
    first = before.fetchone()[0] == 0
    _run(ctx, "katk.snoozer", seconds)
    return Snooze(2.0) if first else None


@job(name="katk.coop", queue="katk", global_concurrency=1, takes_context=True)
def coop(ctx: JobContext, block: str | None = None) -> None:
    """Runs until cancelled (checks ctx.is_cancelled)."""
    c = handler_conn()
    c.execute(
        "INSERT INTO katk_runs (job_id, kind, queue, attempt, pid, started)"
        " VALUES (%s, %s, %s, %s, %s, clock_timestamp())",
        [ctx.id, ctx.kind, ctx.queue, ctx.attempt, os.getpid()],
    )
    with contextlib.suppress(WaitTimeout):  # at most 30 s, cancelled or not
        wait_for(ctx.is_cancelled, timeout=30, interval=0.02, message="a cancel")
    c.execute("UPDATE katk_runs SET ended = clock_timestamp() WHERE job_id = %s", [ctx.id])


# Two kind names whose first permit keys collide: hashtext('kind:katk.h111070/0') =
# hashtext('kind:katk.h250426/0') (found by a search over 400,000 names).
for _name in ("katk.h111070", "katk.h250426"):
    job(name=_name, queue="katk", global_concurrency=1, takes_context=True)(
        lambda ctx, seconds=0.05, block=None: _run(ctx, ctx.kind, seconds, block)
    )
