"""The completion batcher: handler outcomes are written in batches, one statement each.

The execution slot is freed as soon as a handler returns; its outcome waits here for at most
``flush_interval`` (or until ``batch_size`` outcomes are pending) and is then written with one
``awa.finalize_v1`` call. Finalizations found stale (the attempt was rescued, cancelled or
closed elsewhere) are logged and counted, never raised into handlers. If the process dies with
outcomes still here, their attempts stay open and are rescued: there is no replay log.

A batch the database refuses for a reason other than a lost connection is split until the
offending outcome is alone; that one is replaced by a ``fail`` carrying a readable error (and
logged with its job id), and everything else is written as it was. The loop itself never stops
on an error: one bad outcome can never keep the others from being written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from awa_django.db.links import Link, first_line, is_connection_lost
from awa_django.db.storage import ClaimedJob, Finalization, afinalize
from awa_django.limits import clean_text
from awa_django.sql import query
from awa_django.telemetry.logs import job_fields, job_log_fields
from awa_django.telemetry.metrics import Metrics
from awa_django.worker.outcome_log import Fate, log_failures

__all__ = ["CompletionBatcher"]

log = logging.getLogger("awa_django.worker")


class CompletionBatcher:
    """Collects ``Finalization``s and flushes them through one ``Link``.

    ``give_up()`` says when to stop retrying a write through a lost connection (at the end of a
    shutdown); the outcomes of such a batch are dropped and their attempts rescued later.
    """

    def __init__(
        self,
        link: Link,
        *,
        batch_size: int,
        flush_interval: float,
        give_up: Callable[[], bool] = lambda: False,
        metrics: Metrics | None = None,
    ) -> None:
        self.link = link
        #: Counts each written outcome (docs/observability.md, "Metrics"), when metrics are on.
        self.metrics = metrics
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.give_up = give_up
        self.pending: list[Finalization] = []
        # The attempt of each pending outcome (None when not known), for the job fields of
        # the log records of a stale or refused one.
        self.pending_jobs: list[ClaimedJob | None] = []
        # The run time of each pending failure (seconds), for its log line once written.
        self.ran: dict[tuple[int, int], float] = {}
        self.written = 0
        self.stale = 0
        self.refused = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    def add(
        self, item: Finalization, job: ClaimedJob | None = None, ran: float | None = None
    ) -> None:
        """Queue one outcome (non-blocking); ``job`` is its attempt, when known, and ``ran``
        its handler's run time in seconds (for a failure's log line)."""
        if ran is not None and item.outcome in ("retry", "fail"):
            self.ran[(item.job_id, item.run_lease)] = ran
        self.pending.append(item)
        self.pending_jobs.append(job)
        self._idle.clear()
        if len(self.pending) >= self.batch_size or len(self.pending) == 1:
            self._wake.set()

    async def run(self) -> None:
        """Flush loop; returns after ``close()`` once everything pending is written."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.pending:
                if self._closing:
                    return
                continue
            if len(self.pending) < self.batch_size and not self._closing:
                # Give concurrent handlers a moment to add to this batch.
                await asyncio.sleep(self.flush_interval)
            while self.pending:
                batch = self.pending[: self.batch_size]
                jobs = self.pending_jobs[: len(batch)]
                del self.pending[: len(batch)]
                del self.pending_jobs[: len(batch)]
                try:
                    await self._write(batch, jobs)
                except Exception:  # pragma: no cover - _write handles its own errors
                    log.exception(
                        "awa worker: %d outcome(s) could not be written; their attempts will "
                        "be rescued",
                        len(batch),
                    )
            self._idle.set()
            if self._closing:
                return

    async def _write(self, batch: list[Finalization], jobs: list[ClaimedJob | None]) -> None:
        tries = 0

        async def write(conn: object) -> list[tuple[int, int]]:
            nonlocal tries
            tries += 1
            return await afinalize(conn, batch)  # type: ignore[arg-type]

        try:
            stale = await self.link.run(write, give_up=self.give_up)
        except Exception as exc:
            if is_connection_lost(exc, self.link.conn):
                log.warning(
                    "awa worker: %d outcome(s) not written before shutdown (%s); their attempts "
                    "will be rescued",
                    len(batch),
                    first_line(exc),
                )
                self._forget(batch)
                return
            await self._isolate(batch, jobs, exc)  # each half is written, then forgotten
            return
        self.written += len(batch) - len(stale)
        closed = set(stale)
        failed = [
            (item, job)
            for item, job in zip(batch, jobs, strict=True)
            if item.outcome in ("retry", "fail")
            and job is not None
            and (item.job_id, item.run_lease) not in closed
        ]
        fates = await self._fates(failed) if failed else {}
        try:
            if failed:
                log_failures(failed, fates, self.ran)
        except Exception:  # pragma: no cover - logging must not lose an outcome
            log.exception("awa worker: could not log %d failed attempt(s)", len(failed))
        self._forget(batch)
        if self.metrics is not None:
            await self._count(batch, jobs, closed, fates)
        if stale:
            if tries > 1:
                # A retried batch may find attempts its interrupted first try already closed.
                log.info(
                    "awa worker: %d finalization(s) were already closed after a reconnect",
                    len(stale),
                )
            else:
                self.stale += len(stale)
                known = {(j.job_id, j.run_lease): j for j in jobs if j is not None}
                for job_id, lease in stale:
                    log.warning(
                        "awa worker: stale finalization of job %s attempt lease %s ignored "
                        "(rescued, cancelled or closed elsewhere)",
                        job_id,
                        lease,
                        extra=_fields(known.get((job_id, lease)), job_id, lease),
                    )

    def _forget(self, batch: list[Finalization]) -> None:
        """Drop the run times kept for a batch's log lines, once it is written or dropped."""
        for item in batch:
            self.ran.pop((item.job_id, item.run_lease), None)

    async def _fates(self, failed: list[tuple[Finalization, ClaimedJob]]) -> dict[int, Fate] | None:
        """Where the written retry and fail outcomes went, by job id (the database decides:
        max_attempts, a retry policy's max_age, the queue's DLQ policy as of the write), in one
        statement by job id index; None when that read fails (they are then told apart by
        attempt). A fate is kept only for the attempt that was written."""
        ids = [job.job_id for _, job in failed]
        attempts = {job.job_id: job.attempt for _, job in failed}

        async def read(conn: object) -> dict[int, Fate]:
            cursor = await conn.execute(  # type: ignore[attr-defined]
                query("failure_fates"), {"ids": ids}
            )
            return {
                int(i): (str(fate), None if due is None else float(due))
                for i, attempt, fate, due in await cursor.fetchall()
                if fate == "retryable" or attempts.get(int(i)) == attempt
            }

        try:
            return await self.link.run(read, give_up=self.give_up)
        except Exception as exc:  # only the log lines' and metrics' detail: never the outcomes
            log.debug("awa worker: could not read where failures went (%s)", exc)
            return None

    async def _count(
        self,
        batch: list[Finalization],
        jobs: list[ClaimedJob | None],
        closed: set[tuple[int, int]],
        fates: dict[int, Fate] | None,
    ) -> None:
        """Count a written batch's outcomes, the failures by their ``fates`` (see
        :meth:`_fates`); without them (the read failed), by attempt and the DLQ policy read
        last."""
        metrics = self.metrics
        assert metrics is not None
        ended: dict[tuple[int, int], str] | None = None
        if fates is not None:
            attempts = {j.job_id: j.attempt for j in jobs if j is not None}
            ended = {
                (job_id, attempts[job_id]): fate
                for job_id, (fate, _) in fates.items()
                if fate != "retryable" and job_id in attempts
            }
        elif metrics.dlq_due(time.monotonic()):

            async def read(conn: object) -> list[str]:
                cursor = await conn.execute(query("queues_dlq_off"))  # type: ignore[attr-defined]
                return [row[0] for row in await cursor.fetchall()]

            try:
                metrics.set_dlq_off(
                    await self.link.run(read, give_up=self.give_up), time.monotonic()
                )
            except Exception as exc:  # only the metrics' detail: never the outcomes
                log.debug("awa worker: could not read the queues' DLQ policy (%s)", exc)
        metrics.written(batch, jobs, closed, ended)

    async def _isolate(
        self, batch: list[Finalization], jobs: list[ClaimedJob | None], exc: Exception
    ) -> None:
        """Write a refused batch in halves until the refused outcome is alone, then fail it."""
        if len(batch) > 1:
            middle = len(batch) // 2
            await self._write(batch[:middle], jobs[:middle])
            await self._write(batch[middle:], jobs[middle:])
            return
        [item] = batch
        [job] = jobs
        self.refused += 1
        reason = clean_text(f"{type(exc).__name__}: {first_line(exc)}", 1000)
        log.error(
            "awa worker: the %s outcome of job %s attempt lease %s could not be written (%s); "
            "failing the job with that error",
            item.outcome,
            item.job_id,
            item.run_lease,
            reason,
            extra=_fields(job, item.job_id, item.run_lease),
        )
        if item.outcome == "fail" and (item.error or {}).get("type") == "awa_django.OutcomeRefused":
            return  # the replacement itself was refused: leave the attempt to rescue
        replacement = Finalization(
            item.job_id,
            item.run_lease,
            item.claim_slot,
            "fail",
            error={
                "type": "awa_django.OutcomeRefused",
                "message": f"the handler's {item.outcome} outcome could not be written: {reason}",
            },
            has_state=True,
        )
        await self._write([replacement], [job])

    async def drain(self) -> None:
        """Wait until everything queued so far is written."""
        if self.pending:
            self._wake.set()
        await self._idle.wait()

    def close(self) -> None:
        """Stop the loop after the pending outcomes are written."""
        self._closing = True
        self._wake.set()


def _fields(job: ClaimedJob | None, job_id: int, lease: int) -> dict[str, Any]:
    return job_fields(job_id, run_lease=lease) if job is None else job_log_fields(job)
