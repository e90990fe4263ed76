"""The sweep of a worker process's idle queues: which of them a claim would take a job from.

A queue whose claims found it dry is *idle* (awa_django/worker/dispatch.py): it costs no claim
until a wake-up names it or the sweep finds work in it. The sweep asks the database about
many idle queues per statement (``awa.queues_ready_v2``), on a connection of its own (never
the one of heartbeats: a slow sweep must not make a live job look dead), and makes the queues
it reports due. The probe is exact: a queue is reported when a claim now would take a job from
it, so a rolled-back lane position (a gap), a position an open transaction holds, or parked
jobs whose flow limit still binds cost no claim (docs/worker.md, "Many queues").

Cost. A probe statement reads at most ``SWEEP_LANES`` lanes (each lane's sequence is locked
until the statement ends); a queue whose lanes were found spent comes back with a *stamp*,
a digest of its lanes' last positions, and while the stamp does not change its lanes'
cursors are not read again. Statements are spaced so that the sweep spends ``SWEEP_SHARE``
of its time in the database, but a pause is never longer than ``AWA["SWEEP_MAX_PAUSE"]``,
and a pass over every idle queue is hurried (shorter pauses) to end within
``AWA["SWEEP_MAX_INTERVAL"]``: a job whose wake-up was missed waits for the sweep that long
at most, unless the database takes longer than that to answer the statements themselves. A
wake-up of every queue (the listen connection came back) ends a pause and sweeps every idle
queue at once, unpaced.

Faults. A statement that fails makes every queue it asked about due (their claims find any
job, so nothing is lost), and the next statement waits, twice as long after each failure in a
row, at most ``AWA["SWEEP_BACKOFF_MAX"]``. The failures are logged once per
``SWEEP_LOG_EVERY`` seconds, with their count, and the recovery once. A statement that would
wait more than ``SWEEP_LOCK_TIMEOUT`` for a lock (DDL on a lane's sequence, a prune taking a
partition) gives up instead, and its queues are swept again on the next pass: their claims
would wait for the same lock, on the claim connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psycopg

from awa_django.db.links import Link, first_line
from awa_django.db.storage import QueueReadiness, aqueues_ready
from awa_django.sql import query
from awa_django.worker.config import WorkerConfig

__all__ = [
    "SWEEP_LANES",
    "SWEEP_LOCK_TIMEOUT",
    "SWEEP_LOG_EVERY",
    "SWEEP_SHARE",
    "Sweep",
    "SweptQueues",
    "sweep_session",
]

log = logging.getLogger("awa_django.worker")

#: Lanes one probe statement reads (and locks until it ends): 128 is about twice a
#: transaction's share of the server's lock table (``max_locks_per_transaction``, 64), and
#: costs 20-30 % more per queue than 256 or 512 (docs/design/idle-queue-sweep.md).
SWEEP_LANES = 128
#: The most of its time the sweep spends in the database: a statement that found nothing is
#: followed by a pause of ``1 / SWEEP_SHARE - 1`` times its duration (bounded, see above).
SWEEP_SHARE = 0.05
#: How often failed sweep statements are logged (with their count since the last line).
SWEEP_LOG_EVERY = 60.0
#: The longest a sweep statement waits for a lock (``lock_timeout`` of its connection).
SWEEP_LOCK_TIMEOUT = 1.0
#: lock_not_available: the statement gave up waiting for a lock.
_LOCK_TIMEOUT = "55P03"
#: Statements in a row that gave up on a lock before the sweep leaves the rest of its pass.
_LOCKED_IN_A_ROW = 3


class _Locked:
    """What a probe that gave up waiting for a lock returns."""


LOCKED = _Locked()


async def sweep_session(conn: psycopg.AsyncConnection[Any]) -> None:
    """Set up a new sweep connection (``Link(on_connect=...)``): its lock timeout."""
    await conn.execute(query("sweep_session"), [f"{int(SWEEP_LOCK_TIMEOUT * 1000)}ms"])


class SweptQueues(Protocol):
    """What the sweep needs of the dispatcher."""

    def idle_queues(self) -> list[str]:
        """The queues idle now, in a stable order."""
        ...

    def weight_cap(self, name: str) -> int:
        """The most units a claim of ``name`` could give one job."""
        ...

    def found_work(self, name: str) -> None:
        """The sweep says ``name`` has work (or could not tell): make it due if still idle."""
        ...


class Sweep:
    """The sweep loop of one worker process (``run``), for ``queues`` (the dispatcher)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        link: Link,
        queues: SweptQueues,
        stopping: Callable[[], bool],
    ) -> None:
        self.config = config
        self.link = link
        self._queues = queues
        self._stopping = stopping
        self._now = asyncio.Event()
        self._stamps: dict[str, int] = {}
        self._failures = 0  # failed statements in a row
        self._failed = 0  # failed statements since the last line logged
        self._failed_queues = 0  # queues those asked about
        self._logged_at: float | None = None

    def now(self) -> None:
        """Sweep every idle queue at once, unpaced (wake-ups may have been missed); ends a
        pause."""
        self._now.set()

    def stop(self) -> None:
        """End ``run`` (after the statement in flight)."""
        self._now.set()

    async def run(self) -> None:
        """Sweep every ``POLL_INTERVAL`` (passes over very many queues take longer), until the
        process stops."""
        loop = asyncio.get_running_loop()
        poll = self.config.settings.POLL_INTERVAL
        while not self._stopping():
            began = loop.time()
            hurry = self._now.is_set()
            self._now.clear()
            await self._pass(self._queues.idle_queues(), began, hurry)
            if self._stopping():
                return
            await self._pause(poll - (loop.time() - began))

    async def _pass(self, idle: list[str], began: float, hurry: bool) -> None:
        """Probe every queue of ``idle``: paced, or at once when ``hurry``. Returns early when
        a wake-up of every queue asks for a new pass at once, or when statements keep giving
        up on a lock."""
        loop = asyncio.get_running_loop()
        settings = self.config.settings
        deadline = began + max(settings.SWEEP_MAX_INTERVAL, settings.POLL_INTERVAL)
        done, after, statements, spent = 0, None, 0, 0.0
        alone, locked = 0, 0  # probe idle[:alone] one queue at a time; lock timeouts in a row
        while done < len(idle) and not self._stopping():
            if self._now.is_set() and not hurry:
                return  # start again at once, unpaced
            names = idle[done : done + (1 if done < alone else SWEEP_LANES)]
            started = loop.time()
            rows = await self._probe(names, after)
            took = loop.time() - started
            if rows is None:  # failed: the queues asked about are due
                done, after = done + len(names), None
                await self._pause(self._backoff())
                continue
            if isinstance(rows, _Locked):
                # Which queue waits for the lock is not known: probe these one at a time, and
                # leave the one that waits to the next pass (a lock on what every statement
                # reads, to the next pass altogether).
                locked += 1
                if locked >= _LOCKED_IN_A_ROW:
                    return
                if len(names) > 1:
                    alone = done + len(names)
                else:
                    done, after = done + 1, None
                continue
            locked = 0
            done, after = self._advance(done, names, rows)
            statements, spent = statements + 1, spent + took
            if hurry or any(row.ready for row in rows) or done >= len(idle):
                continue
            # Paced: SWEEP_SHARE of the time, but never past SWEEP_MAX_PAUSE, and short enough
            # for the rest of the pass to end by the deadline at the pace seen so far.
            left = math.ceil((len(idle) - done) / (max(done, 1) / statements))
            slack = deadline - loop.time() - left * (spent / statements)
            await self._pause(
                min(took * (1 / SWEEP_SHARE - 1), settings.SWEEP_MAX_PAUSE, slack / left)
            )

    def _advance(
        self, done: int, names: list[str], rows: Sequence[QueueReadiness]
    ) -> tuple[int, int | None]:
        """Take in the rows of one probe of ``names`` (from ``idle[done]`` on): make the
        queues reported ready due, keep their stamps. Returns where the next probe starts:
        (index in ``idle``, the lane after which its first queue is read, or None)."""
        for row in rows:
            if row.stamp is None:
                self._stamps.pop(row.queue, None)
            else:
                self._stamps[row.queue] = row.stamp
            if row.ready:
                self._queues.found_work(row.queue)
        if not rows:
            return done + len(names), None
        last = rows[-1]
        if last.upto is not None and not last.ready:
            return done + len(rows) - 1, last.upto  # read in parts: go on with its next lanes
        return done + len(rows), None

    async def _probe(
        self, names: list[str], after: int | None
    ) -> list[QueueReadiness] | _Locked | None:
        """One probe statement (``after``: the first queue's lanes after that one); None when
        it failed: then every queue of ``names`` was made due; ``LOCKED`` when it gave up
        waiting for a lock."""
        stamps = [self._stamps.get(name) for name in names]
        caps = [self._queues.weight_cap(name) for name in names]

        async def ready(conn: psycopg.AsyncConnection[Any]) -> list[QueueReadiness]:
            return await aqueues_ready(
                conn, names, stamps=stamps, caps=caps, max_lanes=SWEEP_LANES, after_lane=after
            )

        try:
            rows = await self.link.run(ready, give_up=self._stopping, retry_transient=False)
        except Exception as exc:
            if self._stopping():
                return None
            if isinstance(exc, psycopg.Error) and exc.sqlstate == _LOCK_TIMEOUT:
                log.debug("awa worker: a sweep statement gave up waiting for a lock (%s)", exc)
                return LOCKED
            self._failed_statement(names, exc)
            for name in names:
                self._queues.found_work(name)
            await self._release_locks()
            return None
        if self._failures:
            log.info(
                "awa worker: the sweep of idle queues works again (after %d failed statement(s))",
                self._failures,
            )
            self._failures = 0
        return rows

    def _failed_statement(self, names: list[str], exc: Exception) -> None:
        """Count a failed probe, and log it unless a line was logged less than
        ``SWEEP_LOG_EVERY`` seconds ago (then the next line carries the count)."""
        self._failures += 1
        self._failed += 1
        self._failed_queues += len(names)
        now = asyncio.get_running_loop().time()
        if self._logged_at is not None and now - self._logged_at < SWEEP_LOG_EVERY:
            return
        log.warning(
            "awa worker: %d sweep statement(s) failed%s (last: %s: %s); claiming from each of "
            "the %d idle queue(s) they asked about instead, and retrying with a back-off of up "
            "to %.1f s. If this lasts, check that the awa migrations are applied "
            "(manage.py migrate) and what the server's log says",
            self._failed,
            "" if self._logged_at is None else f" in the last {now - self._logged_at:.0f} s",
            type(exc).__name__,
            first_line(exc),
            self._failed_queues,
            self.config.settings.SWEEP_BACKOFF_MAX,
        )
        self._logged_at = now
        self._failed = self._failed_queues = 0

    async def _release_locks(self) -> None:
        """A failed statement may leave a session lock it took to probe a permit for an
        instant: this connection holds none on purpose, so every one it has is let go (a
        failure here is of no consequence: a reconnect frees them too)."""

        async def unlock(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(query("advisory_unlock_all"))

        with contextlib.suppress(Exception):
            await self.link.run(unlock, give_up=lambda: True)

    def _backoff(self) -> float:
        """The pause after the latest failed statement: ``POLL_INTERVAL`` doubled for each
        failure in a row, at most ``SWEEP_BACKOFF_MAX``."""
        settings = self.config.settings
        return min(
            settings.POLL_INTERVAL * 2.0 ** min(self._failures - 1, 30),
            settings.SWEEP_BACKOFF_MAX,
        )

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less when ``now`` or ``stop`` is called."""
        if seconds <= 0 or self._now.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._now.wait(), seconds)
