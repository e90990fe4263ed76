"""Which queue of a worker process claims next: one claim at a time, every queue in turn.

A worker process claims through one connection, so its claims run one after the other whatever
the number of queues it serves. The ``Dispatcher`` makes that order explicit and fair: queues
that want a claim wait in one first-in, first-out line (*due*), and each claim takes as many
jobs as the queue and the process have room for. Nothing here costs more with more queues than
the queues that have work: an idle queue costs no claim and no timer.

Each queue is in one of these states:

* **idle**: its last two claims found it dry, the last one empty, or its last claim took
  nothing because a flow limit held its jobs back. A ``NOTIFY`` naming it, handed-back
  permits, or the *sweep* (awa_django/worker/sweep.py) make it due: the sweep asks the
  database which idle queues a claim would take a job from, many queues per statement, on a
  connection of its own.
* **due**: in the line for its claim.
* **room**: it may have work but no slot is free. Once a quarter of its own slots are free it
  waits in the line for the process's slots, and freed slots make the queues of that line due
  oldest first, as many as there are free slots: a busy queue that frees its own slots waits
  behind the queues that were waiting before it.
* **timed**: it waits for a timer: the rate limit's next job (only a stop ends that wait), a
  flow limit after a claim that took some jobs (``POLL_INTERVAL``), a kind's next rate token
  due within ``POLL_INTERVAL`` (doubled each time such a claim takes nothing, until it is
  that long: then the queue is idle), the quick retry of an empty claim after a backlog
  (``BacklogRetry``), or the back-off after a failed claim. A wake-up ends the waits for a
  flow limit and for a quick retry; a freed slot of the queue ends the wait for a flow limit.
* **claiming**: its claim is in flight; a wake-up meanwhile makes it due again once the claim
  is back.

The claim itself, its flow-limit and permit bookkeeping and the halving of too big claims
(``ClaimCap``) are as before this module: see ``_claim`` and ``_settle``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from awa_django.db.links import Link, first_line
from awa_django.db.storage import Claimed, ClaimedJob, aclaim_units
from awa_django.telemetry.metrics import Metrics
from awa_django.worker.config import QueueConfig, WorkerConfig
from awa_django.worker.family import Family
from awa_django.worker.flow import Permits
from awa_django.worker.slots import BacklogRetry, ClaimCap, Slots
from awa_django.worker.sweep import Sweep

__all__ = ["ADMIT_SCAN", "NOTE_RETRY", "Dispatcher"]

log = logging.getLogger("awa_django.worker")

#: The pause before claiming again after an empty claim a wake-up started (family members).
NOTE_RETRY = 0.002

#: How far down the line of queues waiting for the process's slots a freed slot looks for one
#: that can claim.
ADMIT_SCAN = 64
#: Claim turns that do not reach the database (nothing to claim) in a row before the claim
#: loop lets the event loop run.
YIELD_EVERY = 64

_IDLE, _DUE, _ROOM, _TIMED, _CLAIMING = "idle", "due", "room", "timed", "claiming"


class _Turn:
    """One queue's claim state."""

    __slots__ = (
        "admitted",
        "backlog",
        "cap",
        "dry",
        "dry_before",
        "failures",
        "freed",
        "hard",
        "name",
        "noted",
        "queue",
        "quick",
        "soft_misses",
        "state",
        "timer",
        "woken",
    )

    def __init__(self, queue: QueueConfig, slots: Slots) -> None:
        self.queue = queue
        self.name = queue.name
        self.state = _IDLE
        self.cap = ClaimCap(slots.claim_batch)
        self.backlog = BacklogRetry(slots.low_water[queue.name])
        self.failures = 0
        self.woken = False  # a wake-up (not a timer or the sweep) made it due
        self.quick = False  # the next claim is the quick retry of an empty one a wake-up began
        self.noted = False  # woken while its claim was in flight
        self.freed = False  # a quarter of its slots freed while its claim was in flight
        self.hard = False  # a timed wait only a stop ends (the rate limit, a back-off)
        self.dry = False  # a timed wait after a claim that found the queue dry
        self.dry_before = False  # the last claim found the queue dry
        self.admitted = False  # made due from the line of queues waiting for the process
        self.soft_misses = 0  # claims in a row that took nothing, waiting for a kind's token
        self.timer: asyncio.TimerHandle | None = None


class Dispatcher:
    """Claims for every queue of one worker process, one claim at a time, in turn."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        instance_id: uuid.UUID,
        slots: Slots,
        permits: Permits,
        claim_link: Link,
        sweep_link: Link,
        family: Family,
        metrics: Metrics | None,
        start_batch: Callable[[list[ClaimedJob], QueueConfig], None],
        hand_off: Callable[[str], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.config = config
        self.instance_id = instance_id
        self.slots = slots
        self.permits = permits
        self.claim_link = claim_link
        self.family = family
        self._metrics = metrics
        self._start_batch = start_batch
        self._hand_off = hand_off
        self._stopping = stopping
        self.claimed = 0
        self._turns: dict[str, _Turn] = {}
        self._due: dict[str, None] = {}  # an ordered set: the line
        self._room: dict[str, None] = {}  # queues waiting for the process's slots, oldest first
        self._admitted = 0
        self._ready = asyncio.Event()
        self.sweeper = Sweep(config, link=sweep_link, queues=self, stopping=stopping)
        slots.on_release = self._released

    # -- the queues --------------------------------------------------------------------------

    def add(self, queue: QueueConfig, *, due: bool = False) -> None:
        """Serve ``queue``: due at once (a wake-up named it), or idle until the sweep or a
        wake-up finds work in it."""
        self.slots.add(queue)
        turn = self._turns[queue.name] = _Turn(queue, self.slots)
        if due:
            self._make_due(turn)

    def serves(self, name: str) -> bool:
        """Whether ``name`` is one of this process's queues."""
        return name in self._turns

    def state(self, name: str) -> str:
        """``name``'s state (``idle``, ``due``, ``room``, ``timed`` or ``claiming``)."""
        return self._turns[name].state

    # -- what the sweep asks (awa_django/worker/sweep.py) ------------------------------------

    def idle_queues(self) -> list[str]:
        """The queues idle now, in the order they were added."""
        return [name for name, turn in self._turns.items() if turn.state == _IDLE]

    def weight_cap(self, name: str) -> int:
        """The most units a claim of ``name`` gives one job (``max_weight`` of the claim)."""
        return min(self.slots.caps[name], self._turns[name].cap.cap)

    def found_work(self, name: str) -> None:
        """The sweep found work in ``name`` (or could not tell): claim it if it is idle."""
        turn = self._turns.get(name)
        if turn is not None and turn.state == _IDLE:
            turn.woken = False
            self._make_due(turn)

    # -- wake-ups ----------------------------------------------------------------------------

    def wake(self, name: str) -> None:
        """A wake-up for ``name`` (a NOTIFY, a hand-off): claim soon unless it waits for room
        or for its rate limit."""
        turn = self._turns.get(name)
        if turn is None:
            return
        if turn.state == _CLAIMING:
            turn.noted = True
        elif turn.state == _IDLE or (turn.state == _TIMED and not turn.hard):
            turn.woken = True
            self._make_due(turn)

    def permits_returned(self, name: str) -> None:
        """An attempt of ``name`` holding permits or a serial key ended: the next claim hands
        them back; make sure one comes."""
        turn = self._turns.get(name)
        if turn is None:
            return
        if turn.state == _CLAIMING:
            turn.noted = True  # its claim took the list before they ended: claim again after it
        elif turn.state in (_IDLE, _ROOM) or (turn.state == _TIMED and not turn.hard):
            self._make_due(turn)

    def wake_all(self) -> None:
        """Catch up after a reconnect of the listen connection (notes may have been missed):
        every waiting queue claims, and the idle ones are swept at once."""
        for turn in self._turns.values():
            if turn.state in (_ROOM, _TIMED):
                self._make_due(turn)
        self.sweeper.now()

    def stop(self) -> None:
        """End ``run`` and ``sweep`` (after the claim in flight)."""
        for turn in self._turns.values():
            if turn.timer is not None:
                turn.timer.cancel()
                turn.timer = None
        self._ready.set()
        self.sweeper.stop()

    def _released(self, name: str) -> None:
        """Units of ``name`` were freed (``Slots.release``)."""
        if self._stopping():
            return
        turn = self._turns.get(name)
        if turn is not None and self.slots.refilled(name):
            if turn.state == _ROOM and name not in self._room:
                # Its own slots are back: it joins the line for the process's, behind the
                # queues already waiting there, so a busy queue cannot take every slot freed.
                self._room[name] = None
            elif turn.state == _TIMED and not turn.hard and not turn.dry:
                self._make_due(turn)  # a flow limit's wait: a local attempt ended
            elif turn.state == _CLAIMING:
                turn.freed = True
        self._admit()

    def _admit(self) -> None:
        """Make queues waiting for the process's slots due, oldest first, as many as slots are
        free: each one that can claim now (a queue running jobs needs a quarter of its slots
        free), among the first ``ADMIT_SCAN`` in line."""
        free = self.slots.process_free()
        if free <= 0 or not self._room:
            return
        for name in list(itertools.islice(self._room, ADMIT_SCAN)):
            if self._admitted >= free:
                return
            if self.slots.claimable(name) > 0:
                turn = self._turns[name]
                turn.admitted = True
                self._admitted += 1
                self._make_due(turn)

    def _make_due(self, turn: _Turn) -> None:
        if turn.timer is not None:
            turn.timer.cancel()
            turn.timer = None
        self._room.pop(turn.name, None)
        turn.state = _DUE
        self._due[turn.name] = None
        self._ready.set()

    def _wait(self, turn: _Turn, delay: float, *, hard: bool = False, dry: bool = False) -> None:
        turn.state = _TIMED
        turn.hard = hard
        turn.dry = dry
        loop = asyncio.get_running_loop()
        turn.timer = loop.call_later(delay, self._timer_fired, turn)

    def _timer_fired(self, turn: _Turn) -> None:
        turn.timer = None
        if turn.state == _TIMED:
            turn.woken = False
            self._make_due(turn)

    def _wait_room(self, turn: _Turn) -> None:
        turn.state = _ROOM
        if not self.slots.short_of_own(turn.name):
            self._room[turn.name] = None  # its own slots are there: it waits for the process's

    # -- the claim loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Claim for the due queues, first come first served, until the process stops."""
        idle_turns = 0
        while not self._stopping():
            if not self._due:
                self._ready.clear()
                await self._ready.wait()
                continue
            name = next(iter(self._due))
            del self._due[name]
            turn = self._turns[name]
            if turn.admitted:
                turn.admitted = False
                self._admitted -= 1
            if await self._turn(turn):
                idle_turns = 0
                if self.permits.pending() and turn.state in (_IDLE, _ROOM):
                    # Permits or serial keys ended during this claim: only a claim hands them
                    # back (and a serial key on to its next job), so one must come.
                    self._make_due(turn)
            else:
                idle_turns += 1
                if idle_turns >= YIELD_EVERY:
                    idle_turns = 0
                    await asyncio.sleep(0)
            self._admit()

    async def _turn(self, turn: _Turn) -> bool:
        """One claim of ``turn``'s queue, and what it waits for next; False when there was
        nothing to claim (no room, nothing to hand back)."""
        want = turn.cap.limit(self.slots.claimable(turn.name))
        release = self.permits.release_batch()
        serial_release = self.permits.serial_release_batch()
        if want <= 0 and not release and not serial_release:
            self._wait_room(turn)
            return False
        want = max(want, 0)
        turn.state = _CLAIMING
        turn.noted = turn.freed = False
        self.slots.reserve(want)
        try:
            claimed = await self.claim_link.run(
                lambda conn: self._claim(conn, turn, want, (release, serial_release)),
                give_up=self._stopping,
            )
        except Exception as exc:
            self.slots.unreserve(want)
            self.permits.claim_failed()
            if not self._stopping():
                self._claim_failed(turn, want, exc)
            return True
        except BaseException:
            self.slots.unreserve(want)
            self.permits.claim_failed()
            raise
        turn.failures = 0
        if turn.cap.succeeded():
            log.info(
                "awa worker: claims from queue %s take up to %d jobs again", turn.name, turn.cap.cap
            )
        self._settle(turn, want, claimed)
        return True

    async def _claim(
        self,
        conn: psycopg.AsyncConnection[Any],
        turn: _Turn,
        want: int,
        sent: tuple[list[int], list[int]],
    ) -> Claimed:
        await self.permits.prepare(conn)
        # Sent once: a retry of this statement (after a transient error or a reconnect) must
        # not hand back locks a claim in between may have given to a new attempt; the reset
        # before the next claim, or the reconnect, sees to them.
        release_now, serial_now = list(sent[0]), list(sent[1])
        sent[0].clear()
        sent[1].clear()
        try:
            return await aclaim_units(
                conn,
                turn.name,
                want,
                self.instance_id,
                aging_interval=self.config.settings.PRIORITY_AGING_INTERVAL,
                default_deadline=turn.queue.deadline,
                # What one claim can give one job: a heavier one counts as that.
                max_weight=min(self.slots.caps[turn.name], turn.cap.cap),
                held=self.permits.held_keys(),
                release=release_now,
                serial_held=self.permits.serial_held_keys(),
                serial_release=serial_now,
            )
        except Exception:
            # Session locks taken by the failed statement stay held: free them before the
            # link retries it (or before the next claim), and hand on its keys.
            self.permits.claim_failed(serial_now)
            raise

    def _claim_failed(self, turn: _Turn, want: int, exc: Exception) -> None:
        if turn.cap.failed(exc, want):
            log.warning(
                "awa worker: a claim of %d jobs from queue %s was too big for the server "
                "(%s: %s); claiming at most %d at a time for now",
                want,
                turn.name,
                type(exc).__name__,
                first_line(exc),
                turn.cap.cap,
            )
            self._make_due(turn)
            return
        # Not a lost connection (the link handles those): log, back off, carry on.
        turn.failures += 1
        delay = min(self.config.settings.POLL_INTERVAL * 2**turn.failures, 5.0)
        log.error(
            "awa worker: claiming from queue %s failed (%s: %s); retrying in %.2f s",
            turn.name,
            type(exc).__name__,
            first_line(exc),
            delay,
        )
        self._wait(turn, delay, hard=True)

    def _settle(self, turn: _Turn, want: int, claimed: Claimed) -> None:
        """Start what a claim returned and decide what the queue waits for next."""
        jobs = claimed.jobs
        units = sum(job.weight for job in jobs)
        if jobs and self._metrics is not None:
            self._metrics.claimed(turn.name, jobs)
        self.claimed += len(jobs)
        self.slots.unreserve(want, units)
        self._start_batch(jobs, turn.queue)  # counted as running from here on
        if want == 0 or self._stopping():
            self._make_due(turn)  # it handed back permits only: count its room again
            return
        turn.backlog.claimed(units)
        if units == want and not self.family.alone and self.family.leads():
            self._hand_off(turn.name)  # a full batch: more may wait (family.py)
        poll = self.config.settings.POLL_INTERVAL
        if claimed.wait is not None:
            # Rate-limited: no claim before the next job may start (a stop ends the wait).
            self._wait(turn, min(claimed.wait, poll), hard=True)
            return
        if units >= want:
            turn.dry_before = False
            self._make_due(turn)  # a full claim: more may wait; back of the line
            return
        dry = not claimed.limited and claimed.soft_wait is None
        if turn.noted or (turn.freed and not dry):
            turn.woken = turn.noted
            self._make_due(turn)
            return
        if jobs:
            turn.soft_misses = 0
        elif not dry:
            self._held_back(turn, claimed.soft_wait)
            return
        # A kind's next rate token (soft_wait) ends the wait early, as a wake-up does.
        pause = min(claimed.soft_wait or poll, poll)
        if not jobs and dry:
            pause = turn.backlog.pause(pause)
            if turn.woken and not turn.quick and not self.family.alone:
                # In a family, a wake-up started this claim and it came back empty: a poll
                # claim of another process may have held the lane, with a snapshot older than
                # the job (docs/performance.md). Once, claim again soon.
                pause, turn.quick = min(pause, NOTE_RETRY), True
            else:
                turn.quick = False
        else:
            turn.quick = False
        turn.woken = False
        if dry and pause >= poll and not jobs and turn.dry_before:
            # Dry twice in a row: the sweep and wake-ups take it from here. After a single dry
            # claim it claims once more: a claim passes over lanes another transaction locks
            # (another worker's claim, a claim-ring rotation), so one empty claim alone does
            # not prove that a job it was woken for is gone.
            turn.state = _IDLE
        else:
            self._wait(turn, pause, dry=dry)
        turn.dry_before = dry

    def _held_back(self, turn: _Turn, soft_wait: float | None) -> None:
        """A claim took nothing because a flow limit held the queue's jobs back (a concurrency
        limit without a free permit, jobs parked by their kind's limits). Claiming again every
        ``POLL_INTERVAL`` would cost a claim each time, for each such queue, until the limit
        frees: the queue is idle instead, and the sweep reports it once a claim can take a job
        (its probe knows permits and rate tokens), or handed-back permits wake it. Only a
        kind's next rate token due sooner than ``POLL_INTERVAL`` is waited for, doubled each
        time the claim after it takes nothing (other queues may take the tokens)."""
        poll = self.config.settings.POLL_INTERVAL
        turn.woken = turn.quick = False
        turn.dry_before = False
        if soft_wait is not None:
            wait = soft_wait * 2.0 ** min(turn.soft_misses, 30)
            if wait < poll:
                turn.soft_misses += 1
                self._wait(turn, wait)
                return
        turn.soft_misses = 0
        turn.state = _IDLE

    # -- the sweep of idle queues ------------------------------------------------------------

    async def sweep(self) -> None:
        """The sweep of idle queues, until the process stops (awa_django/worker/sweep.py)."""
        await self.sweeper.run()
