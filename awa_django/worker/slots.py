"""The execution slots of one worker process: one total shared by its queues, each queue capped.

``AWA["CONCURRENCY"]`` (``--concurrency``) is the number of jobs a process runs at once across
all its queues; a queue's own number caps that queue within it. A claim of a queue may take at
most ``min(its queue's free slots, the process's free slots, CLAIM_BATCH_SIZE)`` jobs, and
reserves them for the claim's round trip. While a queue runs jobs it claims again only once a
quarter of its slots are free (its *low water*), so claims stay batched under load. Who claims
when is the dispatcher's business (awa_django/worker/dispatch.py); ``Slots.release`` tells it
that units were freed.

A busy queue may take every slot of the process; give a queue a cap to keep room for the
others.

Slots are units: a job takes as many as its weight (``weight=``, default 1; docs/flow.md), so
counts here are units, not jobs.

``BacklogRetry`` times a queue's next claim after one that came back empty although the queue
had a backlog a moment ago (another process's claim held its lanes).

``ClaimCap`` halves what one claim of a queue may ask for after a claim failed on one of the
server's size limits (jobs with large arguments), so such jobs are claimed fewer at a time
instead of failing every claim.

Everything here runs on the worker's event loop; nothing is thread-safe.
"""

from __future__ import annotations

import random
from collections.abc import Callable

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
    """Counts running and reserved units per queue and for the whole process.

    ``on_release(name)`` (set by the dispatcher) is called after units of ``name`` were freed.
    """

    def __init__(self, total: int, claim_batch: int) -> None:
        self.total = max(1, total)
        self.claim_batch = max(1, claim_batch)
        self.active = 0
        self.reserved = 0
        self.running: dict[str, int] = {}
        self.caps: dict[str, int] = {}
        self.low_water: dict[str, int] = {}
        self.on_release: Callable[[str], None] | None = None

    def add(self, queue: QueueConfig) -> None:
        """Serve ``queue`` (its cap is never more than the process total)."""
        cap = max(1, min(queue.concurrency, self.total))
        self.caps[queue.name] = cap
        self.running.setdefault(queue.name, 0)
        self.low_water[queue.name] = max(1, min(self.claim_batch, cap) // 4)

    def process_free(self) -> int:
        """Slots of the process neither running an attempt nor reserved by a claim."""
        return self.total - self.active - self.reserved

    def queue_free(self, name: str) -> int:
        """Slots of ``name``'s cap not running an attempt."""
        return self.caps[name] - self.running[name]

    def has_room(self, name: str) -> bool:
        """Whether ``name`` has a slot neither running nor reserved (counts nothing)."""
        return min(self.queue_free(name), self.process_free()) > 0

    def refilled(self, name: str) -> bool:
        """Whether a quarter of ``name``'s slots (its low water) are free: a claim is worth it."""
        return self.queue_free(name) >= self.low_water[name]

    def claimable(self, name: str) -> int:
        """How many units ``name`` may claim now; 0 means it must wait for room: for a quarter
        of its own slots while it runs jobs (so that claims stay batched), or for the
        process's."""
        running = self.running[name]
        free = min(self.caps[name] - running, self.process_free(), self.claim_batch)
        if free <= 0 or (free < self.low_water[name] and running > 0):
            return 0
        return free

    def short_of_own(self, name: str) -> bool:
        """Whether ``name`` cannot claim for want of its own slots (none free, or fewer than a
        quarter while it runs jobs), whatever the process has free."""
        free = self.queue_free(name)
        return free <= 0 or (free < self.low_water[name] and self.running[name] > 0)

    def reserve(self, count: int) -> None:
        """Hold ``count`` slots for a claim in flight."""
        self.reserved += count

    def unreserve(self, count: int, used: int = 0) -> None:
        """A claim of ``count`` returned ``used`` units, for which ``start`` is called next
        (with no ``await`` in between); the other slots are free again."""
        self.reserved -= count

    def start(self, name: str, weight: int = 1) -> None:
        """An attempt of ``name`` taking ``weight`` units began."""
        self.running[name] += weight
        self.active += weight

    def release(self, name: str, weight: int = 1) -> None:
        """An attempt of ``name`` ended (or was abandoned): free its units."""
        self.running[name] -= weight
        self.active -= weight
        if self.on_release is not None:
            self.on_release(name)


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
