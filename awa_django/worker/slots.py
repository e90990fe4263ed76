"""The execution slots of one worker process: one total shared by its queues, each queue capped.

``AWA["CONCURRENCY"]`` (``--concurrency``) is the number of jobs a process runs at once across
all its queues; a queue's own number caps that queue within it. A queue's dispatcher may claim
at most ``min(its queue's free slots, the process's free slots, CLAIM_BATCH_SIZE)`` jobs, and
reserves them for the claim's round trip, so that two dispatchers never count the same free
slots. A dispatcher with no room waits on its wake event. Freeing a slot wakes the queue's own
dispatcher once a quarter of its slots are free (so claims stay batched under load), and every
dispatcher that was waiting for room in the process.

Freed slots wake a dispatcher only when it waits for room. While it claims, or after a claim
found its queue dry (fewer jobs than it asked for, no flow limit in the way) it is *hushed*: a
claim then would find nothing new, so only a NOTIFY, its poll interval, handed-back permits or
a stop wake it. Under a steady trickle of jobs this saves an empty claim per finished job,
whose round trip a job arriving meanwhile had to wait behind (docs/performance.md, "Latency
under load"). A claim that ends otherwise recounts the free slots itself.

A busy queue may take every slot of the process; dispatchers waiting for room are woken
together and claim in turn. Give a queue a cap to keep room for the others.

Slots are units: a job takes as many as its weight (``weight=``, default 1; docs/flow.md), so
counts here are units, not jobs.

``BacklogRetry`` times a dispatcher's next claim after one that came back empty although the
queue had a backlog a moment ago (another process's claim held its lanes).

``ClaimCap`` halves what one claim of a queue may ask for after a claim failed on one of the
server's size limits (jobs with large arguments), so such jobs are claimed fewer at a time
instead of failing every claim.

Everything here runs on the worker's event loop; nothing is thread-safe.
"""

from __future__ import annotations

import asyncio
import random

import psycopg

from awa_django.worker.config import QueueConfig

__all__ = ["BACKLOG_RETRY", "BacklogRetry", "ClaimCap", "Slots"]

#: SQLSTATEs of a claim statement that was too big for the server: class 54 (program limit
#: exceeded, such as "total size of array elements exceeds the maximum allowed" once the rows
#: a claim gathers pass 1 GB) and 53200 (out of memory).
OVERSIZE_SQLSTATE_CLASS = "54"
OVERSIZE_SQLSTATES = frozenset({"53200"})

#: Claims in a row without a size failure after which ``ClaimCap`` doubles its cap again.
CAP_GROW_AFTER = 64

#: The first pause before claiming again after an empty claim that followed a claim which found
#: a backlog (``BacklogRetry``); it doubles on each empty claim in a row, up to the poll interval.
BACKLOG_RETRY = 0.001


class Slots:
    """Counts running and reserved attempts per queue and for the whole process."""

    def __init__(self, total: int, claim_batch: int) -> None:
        self.total = max(1, total)
        self.claim_batch = max(1, claim_batch)
        self.active = 0
        self.reserved = 0
        self.running: dict[str, int] = {}
        self.caps: dict[str, int] = {}
        self.low_water: dict[str, int] = {}
        self.wake: dict[str, asyncio.Event] = {}
        self._starved: set[str] = set()
        self._hushed: dict[str, bool] = {}  # queue -> a slot was freed while hushed

    def add(self, queue: QueueConfig) -> None:
        """Serve ``queue`` (its cap is never more than the process total)."""
        cap = max(1, min(queue.concurrency, self.total))
        self.caps[queue.name] = cap
        self.running.setdefault(queue.name, 0)
        self.low_water[queue.name] = max(1, min(self.claim_batch, cap) // 4)
        self.wake.setdefault(queue.name, asyncio.Event())

    def process_free(self) -> int:
        """Slots of the process neither running an attempt nor reserved by a claim."""
        return self.total - self.active - self.reserved

    def has_room(self, name: str) -> bool:
        """Whether ``name`` has a slot neither running nor reserved (counts nothing)."""
        return min(self.caps[name] - self.running[name], self.process_free()) > 0

    def claimable(self, name: str) -> int:
        """How many jobs ``name``'s dispatcher may claim now; 0 means it must wait for its wake
        event (which is then set when there is room)."""
        running = self.running[name]
        queue_free = self.caps[name] - running
        process_free = self.process_free()
        free = min(queue_free, process_free, self.claim_batch)
        if free <= 0 or (free < self.low_water[name] and running > 0):
            if process_free < queue_free:
                self._starved.add(name)
            return 0
        return free

    def reserve(self, count: int) -> None:
        """Hold ``count`` slots for a claim in flight."""
        self.reserved += count

    def unreserve(self, count: int, used: int = 0) -> None:
        """A claim of ``count`` returned ``used`` jobs, for which ``start`` is called next (with
        no ``await`` in between); the other slots are free again."""
        self.reserved -= count
        if used < count:
            self._wake_starved()

    def start(self, name: str, weight: int = 1) -> None:
        """An attempt of ``name`` taking ``weight`` units began."""
        self.running[name] += weight
        self.active += weight

    def release(self, name: str, weight: int = 1, *, stopping: bool = False) -> None:
        """An attempt of ``name`` ended (or was abandoned): free its units, wake who can use
        them."""
        self.running[name] -= weight
        self.active -= weight
        if stopping or self.caps[name] - self.running[name] >= self.low_water[name]:
            if not stopping and name in self._hushed:
                self._hushed[name] = True
            else:
                self.wake[name].set()
        self._wake_starved()

    def hush(self, name: str) -> None:
        """``name``'s dispatcher claims, or waits for work after a claim that found its queue
        dry: freed slots do not wake it (``unhush`` tells whether one was freed meanwhile)."""
        self._hushed.setdefault(name, False)

    def unhush(self, name: str) -> bool:
        """End ``hush``; return whether a slot was freed (enough to wake it) meanwhile."""
        return self._hushed.pop(name, False)

    def wake_all(self) -> None:
        """Wake every dispatcher (to stop, or after a reconnect)."""
        for event in self.wake.values():
            event.set()

    def _wake_starved(self) -> None:
        if self._starved and self.process_free() > 0:
            for name in self._starved:
                self.wake[name].set()
            self._starved.clear()


class BacklogRetry:
    """When a dispatcher claims again after a claim that came back empty.

    A claim skips lanes another session's claim holds (``FOR UPDATE SKIP LOCKED``), so on a
    backlog in one lane (one producer's jobs) a claim can come back empty while thousands of
    jobs wait, and the other claim commits within milliseconds. After a claim that took at
    least ``mark`` jobs (a quarter of the queue's slots, two at least), an empty claim is
    retried after ``BACKLOG_RETRY``, then twice that, and so on (each jittered by ±50 %), until
    the pause reaches the poll interval: from then on, and when no such claim came first, the
    dispatcher waits its poll interval as before. ``armed`` starts as if such a claim came
    first: a dispatcher that starts on a backlog another process is claiming from retries within
    milliseconds too, instead of sitting out its first poll intervals. A queue that really ran
    dry (or was empty at the start) costs about eight extra empty claims, once. Claims a flow
    limit or a serial key held back are not this class's business (the dispatcher keeps their
    own waits).
    """

    def __init__(self, mark: int, *, armed: bool = False) -> None:
        self.mark = max(2, mark)
        # The next pause; None: wait the poll interval.
        self.next: float | None = BACKLOG_RETRY if armed else None

    def claimed(self, jobs: int) -> None:
        """A claim returned ``jobs`` jobs (units)."""
        if jobs >= self.mark:
            self.next = BACKLOG_RETRY

    def pause(self, poll: float) -> float:
        """The wait after an empty claim, at most ``poll`` (the poll interval)."""
        if self.next is None:
            return poll
        pause = min(poll, self.next * random.uniform(0.5, 1.5))
        self.next *= 2
        if self.next >= poll:
            self.next = None
        return pause


class ClaimCap:
    """How many units one claim of a queue may ask for: ``CLAIM_BATCH_SIZE`` (``full``) unless
    claims failed on the server's size limits.

    A claim returns its jobs' arguments, and ``awa.claim_v3`` gathers the claimed rows in one
    array, which PostgreSQL caps at 1 GB: 512 jobs with 2-3 MB of arguments each (as ``jsonb``)
    fail the statement every time. The failed statement wrote nothing. ``failed`` then halves
    the cap (down to 1) so the dispatcher claims again at once with fewer jobs; after
    ``CAP_GROW_AFTER`` claims in a row without such a failure the cap doubles again, up to
    ``full``.
    """

    def __init__(self, full: int) -> None:
        self.full = max(1, full)
        self.cap = self.full
        self._ok = 0

    def limit(self, want: int) -> int:
        """``want`` (free slots, 0 to wait) bounded by the cap."""
        return min(want, self.cap)

    def failed(self, exc: BaseException, asked: int) -> bool:
        """A claim of ``asked`` units raised ``exc``: if that was a size failure of a claim of
        more than one unit, halve the cap and return True (claim again at once)."""
        state = exc.sqlstate if isinstance(exc, psycopg.Error) else None
        if not state or not (
            state.startswith(OVERSIZE_SQLSTATE_CLASS) or state in OVERSIZE_SQLSTATES
        ):
            return False
        if asked <= 1:
            return False
        self.cap = max(1, min(self.cap, asked) // 2)
        self._ok = 0
        return True

    def succeeded(self) -> bool:
        """A claim went through; return True when this doubled the cap back to ``full``."""
        if self.cap >= self.full:
            return False
        self._ok += 1
        if self._ok < CAP_GROW_AFTER:
            return False
        self._ok = 0
        self.cap = min(self.full, self.cap * 2)
        return self.cap == self.full
