"""The thread pool that runs sync handlers, with threads a stuck handler cannot pin down.

``concurrent.futures.ThreadPoolExecutor`` has a fixed number of non-daemon threads, and the
interpreter joins them at exit: a handler that never returns keeps its thread (and so a slot of
the pool) forever, and keeps the process from exiting. Here the threads are daemon threads, and
a thread whose handler the runtime gives up on is *retired*: it no longer counts against the
pool's size (a new thread takes its place when work is waiting) and it ends when its handler
finally returns. Python cannot kill a thread; this is the most a process can do short of
exiting, which the runtime does when too many retired threads pile up.

Work is handed over in batches (one claim's sync attempts), without a future per job:

* The items of a batch go to one shared queue. A thread takes one item at a time and, once it
  is done, the next one, so no item is ever bound to a thread: an item waits only while every
  thread that could take it is busy.
* Submitting wakes *one* thread (or starts one when none is idle): for short handlers one
  thread runs the batch back to back, with no thread switch per job. Every ``STEAL_AFTER``
  seconds while items are queued, the event loop wakes (or starts) a thread for each queued
  item beyond what the busy threads took in the last interval: threads stuck in slow handlers
  took none, so each waiting item gets a thread of its own (as far as the pool has them); a
  thread running short handlers quickly is left to it. A job queued behind a slow one
  therefore waits about ``STEAL_AFTER`` for a thread when the pool has one to give.
* Finished items are handed back to the event loop through one ``deliver`` callback per wake-up
  of the loop: a thread appends its item to a shared list and calls the loop only when no call
  is pending already. A finished item is never held back behind the thread's next job.

``bind`` (on the event loop) must be called before ``submit_many``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["STEAL_AFTER", "HandlerThreads"]

T = TypeVar("T")

log = logging.getLogger("awa_django.worker")

#: Seconds a queued sync job waits before an idle (or new) thread is given to it.
STEAL_AFTER = 0.001


class HandlerThreads(Generic[T]):
    """A pool of at most ``size`` working daemon threads (retired ones not counted) that runs
    ``runner(item)`` for each submitted item and hands the item back through ``deliver`` on the
    event loop. ``runner`` must not raise."""

    def __init__(self, size: int, runner: Callable[[T], None], *, name: str = "awa-job") -> None:
        self.size = max(1, size)
        self.name = name
        self._runner = runner
        self._pending: collections.deque[T] = collections.deque()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()  # False: exit
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()  # working, not retired
        self._retired: set[threading.Thread] = set()
        self._idle = 0
        self._shutdown = False
        self._count = 0
        self._done: collections.deque[T] = collections.deque()
        self._ringing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deliver: Callable[[T], None] | None = None
        self._steal: asyncio.TimerHandle | None = None
        self._taken = 0  # items taken by threads (a hint: racing increments may be lost)
        self._taken_seen = 0

    def bind(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[T], None]) -> None:
        """Hand finished items to ``deliver`` on ``loop`` (call from the loop)."""
        self._loop = loop
        self._deliver = deliver

    def submit_many(self, items: Iterable[T]) -> None:
        """Queue ``items`` (from the event loop); wake one thread, or start one when none is
        idle and the pool has room."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("the handler pool is shut down")
            before = len(self._pending)
            self._pending.extend(items)
            if len(self._pending) == before:
                return
            self._give_threads(1)
        if self._steal is None and self._loop is not None:
            self._taken_seen = self._taken
            self._steal = self._loop.call_later(STEAL_AFTER, self._steal_check)

    def queued(self) -> int:
        """Items not taken by a thread yet."""
        return len(self._pending)

    def cancel(self, item: T) -> bool:
        """Take ``item`` out of the queue if no thread took it yet; return whether it was."""
        with self._lock:
            try:
                self._pending.remove(item)
            except ValueError:
                return False
            return True

    def retire(self, thread: threading.Thread) -> None:
        """Stop counting ``thread`` (running a handler the runtime gave up on) against the pool;
        it exits when that handler returns. A replacement starts if work is waiting."""
        with self._lock:
            if thread not in self._threads:
                return
            self._threads.discard(thread)
            self._retired.add(thread)
            if not self._shutdown and self._pending:
                self._give_threads(1)

    def retired_alive(self) -> int:
        """How many retired threads are still running their handler."""
        with self._lock:
            self._retired = {t for t in self._retired if t.is_alive()}
            return len(self._retired)

    def threads(self) -> int:
        """Working (not retired) threads started so far."""
        return len(self._threads)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; with ``cancel_futures``, drop what has not started. Threads are
        daemons: a stuck handler never keeps the process from exiting. ``wait`` joins only the
        working (not retired) threads."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
            if cancel_futures:
                self._pending.clear()
        if self._steal is not None:
            self._steal.cancel()
            self._steal = None
        for _ in threads:
            self._tokens.put(False)
        if wait:
            for thread in threads:
                thread.join()

    # -- on the event loop -------------------------------------------------------------------

    def _steal_check(self) -> None:
        """Items still queued after ``STEAL_AFTER``: a thread for each one the busy threads are
        not getting through (as far as the pool has them); look again after ``STEAL_AFTER``."""
        self._steal = None
        taken, self._taken_seen = self._taken - self._taken_seen, self._taken
        with self._lock:
            waiting = len(self._pending)
            if waiting == 0 or self._shutdown:
                return
            if waiting > taken:
                self._give_threads(waiting - taken)
        if self._loop is not None:
            self._steal = self._loop.call_later(STEAL_AFTER, self._steal_check)

    def _ring(self) -> None:
        """Deliver every finished item (the flag goes down first: no finished item is missed)."""
        self._ringing = False
        deliver = self._deliver
        done = self._done
        assert deliver is not None
        while done:
            deliver(done.popleft())

    # -- under self._lock --------------------------------------------------------------------

    def _give_threads(self, wanted: int) -> None:
        woken = min(wanted, self._idle)
        self._idle -= woken
        for _ in range(woken):
            self._tokens.put(True)
        for _ in range(min(wanted - woken, self.size - len(self._threads))):
            self._start_thread()

    def _start_thread(self) -> None:
        self._count += 1
        thread = threading.Thread(target=self._work, name=f"{self.name}-{self._count}", daemon=True)
        self._threads.add(thread)
        thread.start()

    # -- on a pool thread --------------------------------------------------------------------

    def _work(self) -> None:
        me = threading.current_thread()
        pending = self._pending
        while True:
            try:
                item = pending.popleft()
            except IndexError:
                with self._lock:
                    if me in self._retired or self._shutdown:
                        self._retired.discard(me)
                        return
                    if pending:
                        continue
                    self._idle += 1
                if not self._tokens.get():
                    return
                continue
            self._taken += 1
            try:
                self._runner(item)
            except BaseException:  # a bug: still hand the item back, so its slot is freed
                log.exception("awa worker: the sync handler runner failed")
            self._done.append(item)
            if not self._ringing:
                self._ringing = True
                loop = self._loop
                try:
                    assert loop is not None
                    loop.call_soon_threadsafe(self._ring)
                except RuntimeError:  # the loop is closed: the process is ending
                    return
            del item
            if me in self._retired:
                with self._lock:
                    self._retired.discard(me)
                return
