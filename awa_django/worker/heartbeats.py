"""The heartbeats of a worker process's in-flight attempts (a part of ``WorkerRuntime``).

Every ``HEARTBEAT_INTERVAL`` (or at once when a handler flushes its progress), the attempts that
have run for an interval or have progress to write are refreshed in one batch
(``awa.heartbeat``); attempts the database no longer has open (rescued or cancelled elsewhere)
have their handlers told to stop. A batch the database refuses is retried attempt by attempt,
without its progress if need be, so one bad item never stops the others' heartbeats; a pass that
fails for any other reason is logged and the next one follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from awa_django.db.links import Link, first_line
from awa_django.db.storage import aheartbeat
from awa_django.telemetry.logs import job_fields, job_log_fields
from awa_django.worker.attempts import Attempts
from awa_django.worker.config import WorkerConfig

__all__ = ["Heartbeats"]

log = logging.getLogger("awa_django.worker")


class Heartbeats:
    """Heartbeat passes over the in-flight ``attempts``, on ``control_link`` (``WorkerRuntime``
    runs ``run``)."""

    def __init__(self, config: WorkerConfig, attempts: Attempts, control_link: Link) -> None:
        self.config = config
        self.attempts = attempts
        self.control_link = control_link
        self._flush = asyncio.Event()

    def beat_now(self) -> None:
        """Begin the next pass at once (a handler flushes its progress); on the event loop."""
        self._flush.set()

    async def run(self) -> None:
        """Beat every ``HEARTBEAT_INTERVAL``, or at once after ``beat_now``, until cancelled."""
        interval = self.config.settings.HEARTBEAT_INTERVAL
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush.wait(), interval)
            self._flush.clear()
            try:
                await self._heartbeat_once(interval)
            except Exception:
                log.exception("awa worker: a heartbeat pass failed; the next one follows")

    async def _heartbeat_once(self, interval: float) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        items: list[tuple[int, int, str | None]] = []
        for (job_id, lease), run in list(self.attempts.inflight.items()):
            if run.gone:  # told to stop already; beating a closed attempt does nothing
                continue
            ctx = run.attempt.ctx_made  # None: the handler never had one, so no progress
            dirty, progress = (False, None) if ctx is None else ctx.take_dirty_progress()
            # Short jobs never write attempt_state: only attempts running for a heartbeat
            # interval, or with progress to write, are refreshed.
            if dirty or now - run.started >= interval:
                run.has_state = True
                items.append((job_id, lease, progress if dirty else None))
        if not items:
            return
        try:
            gone = await self._beat(items)
        except Exception as exc:
            gone = await self._beat_one_by_one(items, exc)
        for key in gone:
            closed = self.attempts.inflight.get(key)
            if closed is not None and not closed.gone:
                closed.gone = True
                log.info(
                    "job %s attempt lease %s is no longer open (rescued or cancelled); "
                    "its handler is told to stop",
                    key[0],
                    key[1],
                    extra=job_log_fields(closed.attempt.job),
                )
                self.attempts.tell_stop(closed, "its attempt is no longer open")

    async def _beat(self, items: list[tuple[int, int, str | None]]) -> list[tuple[int, int]]:
        async def beat(conn: psycopg.AsyncConnection[Any]) -> list[tuple[int, int]]:
            return await aheartbeat(conn, items)

        return await self.control_link.run(beat)

    async def _beat_one_by_one(
        self, items: list[tuple[int, int, str | None]], exc: Exception
    ) -> list[tuple[int, int]]:
        """A heartbeat batch the database refused: beat each attempt alone, without its
        progress if need be, so one bad item never stops the others' heartbeats."""
        log.error(
            "awa worker: a heartbeat batch was refused (%s); beating one by one", first_line(exc)
        )
        gone: list[tuple[int, int]] = []
        for job_id, lease, progress in items:
            for attempt in ((job_id, lease, progress), (job_id, lease, None)):
                try:
                    gone.extend(await self._beat([attempt]))
                    break
                except Exception as error:
                    log.error(
                        "awa worker: heartbeat of job %s attempt lease %s refused (%s)%s",
                        job_id,
                        lease,
                        first_line(error),
                        "; retrying without its progress" if attempt[2] is not None else "",
                        extra=self._job_fields(job_id, lease),
                    )
        return gone

    def _job_fields(self, job_id: int, lease: int) -> dict[str, Any]:
        """The log fields of an in-flight attempt (only its identity once it has ended)."""
        run = self.attempts.inflight.get((job_id, lease))
        if run is None:
            return job_fields(job_id, run_lease=lease)
        return job_log_fields(run.attempt.job)
