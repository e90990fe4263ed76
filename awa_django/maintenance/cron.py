"""Periodic jobs on the maintenance side: syncing declared schedules, and firing due ones.

* :func:`sync_schedules` (every worker and maintenance process, when it starts) replaces the
  stored schedules with those declared in this process's code (``awa.cron_sync_v1``): a new
  schedule starts firing after now, a removed one is deleted and stops firing, an unchanged one
  is not written.
* :class:`CronFirer` (the leader, every ``CRON_EVAL_INTERVAL``) reads the unpaused schedules and
  the database clock, computes each one's due fire times with cronsim in its time zone
  (:func:`awa_django.cron.due_fires`, bounded by its catch-up policy), and fires each with
  ``awa.cron_fire_v1``: the compare-and-set of the schedule's ``fire_after`` and the enqueue of
  its job are one statement, so one transaction. A fire the database refuses (fired by another
  leader, paused, changed, removed) ends that schedule's turn; the next evaluation starts from
  what is stored.

Exactly once per fire time: a fire time is fired only above the stored ``fire_after``, which
it then replaces, together with the enqueue, in one transaction; concurrent leaders serialise
on the schedule's row (see awa_django/sql/functions/periodic.sql). A schedule that cannot be
evaluated or fired (an expression or time zone this process cannot read, a job the database
refuses) is logged, at most once a minute per schedule and problem, and skipped: the others
fire as usual.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

import psycopg

from awa_django.cron import due_fires
from awa_django.db.enqueue import sql_limit_values
from awa_django.db.links import first_line, is_connection_lost
from awa_django.maintenance.queues import sync_queue_settings
from awa_django.periodic import sync_payload
from awa_django.sql import query
from awa_django.telemetry.logs import job_fields

__all__ = ["CronFirer", "sync_schedules"]

log = logging.getLogger("awa_django.maintenance")

#: How often the same problem of one schedule is logged again.
_LOG_EVERY = 60.0


async def sync_schedules(conn: psycopg.AsyncConnection[Any]) -> None:
    """Replace the stored schedules with the ones declared in code (one statement). Schedules
    that do not validate are logged at ERROR and left out, so they do not fire. Then write the
    queue settings of ``AWA["QUEUES"]`` that live in the database (``sync_queue_settings``)."""
    payload, problems = sync_payload()
    for problem in problems:
        log.error("awa cron: %s; this schedule is not synced and does not fire", problem)
    cursor = await conn.execute(query("cron_sync"), [payload])
    for name, change in await cursor.fetchall():
        log.info("awa cron: schedule %r %s", name, change)
    # The queue settings declared in AWA["QUEUES"] that live in the database, at the same
    # moments (every process's start, retried until it works).
    await sync_queue_settings(conn)


#: The most jobs one evaluation fires (the rest of a long catch-up waits for the next pass).
FIRES_PER_PASS = 500


class CronFirer:
    """The leader's periodic task: fire every due schedule, exactly once per fire time."""

    def __init__(self) -> None:
        self.fired = 0
        self._logged: dict[tuple[str, str], float] = {}

    async def evaluate(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """Fire what is due now on the database clock; return how many jobs were enqueued.

        Raises only when the connection is lost (the caller's leadership goes with it).
        """
        cursor = await conn.execute(query("cron_due"))
        rows = await cursor.fetchall()
        fired = 0
        for now, name, expression, timezone, catch_up, fire_after, kind, queue in rows:
            try:
                fires = due_fires(expression, timezone, fire_after, now, catch_up)
            except Exception as exc:  # a bad stored expression or zone must not stop others
                self._problem(name, f"cannot compute its fire times: {first_line(exc)}")
                continue
            # A long catch-up is spread over passes, so that promotion and rescue keep their
            # pace: the oldest missed fires first, at most FIRES_PER_PASS in all per pass.
            fired += await self._fire(
                conn, name, fire_after, fires[: FIRES_PER_PASS - fired], kind=kind, queue=queue
            )
            if fired >= FIRES_PER_PASS:
                break
        self.fired += fired
        return fired

    async def _fire(
        self,
        conn: psycopg.AsyncConnection[Any],
        name: str,
        after: datetime,
        fires: list[datetime],
        *,
        kind: str | None = None,
        queue: str | None = None,
    ) -> int:
        fired = 0
        limits = sql_limit_values()
        for fire_at in fires:
            try:
                cursor = await conn.execute(query("cron_fire"), [name, after, fire_at, *limits])
                row = await cursor.fetchone()
            except Exception as exc:
                if is_connection_lost(exc, conn):
                    raise
                # Logged once a minute per schedule and error (the fire time is in the line, not
                # in the key: a schedule failing every second is one problem).
                self._problem(
                    name,
                    f"could not fire: {first_line(exc)}",
                    detail=f" (at {fire_at.isoformat()})",
                )
                return fired
            job_id = row[0] if row else None
            if job_id is None:
                # Fired by another leader, paused, changed or removed meanwhile: re-read.
                log.debug("awa cron: schedule %r did not fire at %s", name, fire_at)
                return fired
            log.info(
                "awa cron: schedule %r fired at %s: job %s",
                name,
                fire_at,
                job_id,
                extra={
                    **job_fields(job_id, kind=kind, queue=queue, attempt=0, run_lease=0),
                    "schedule": name,
                },
            )
            after = fire_at
            fired += 1
        return fired

    def _problem(self, name: str, message: str, detail: str = "") -> None:
        now = time.monotonic()
        key = (name, message)
        if now - self._logged.get(key, -_LOG_EVERY) >= _LOG_EVERY:
            self._logged[key] = now
            log.error(
                "awa cron: schedule %r %s%s; skipped, the others fire as usual",
                name,
                message,
                detail,
            )
