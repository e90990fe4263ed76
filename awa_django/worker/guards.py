"""What keeps a worker process from running half-alive when its own code cannot.

* :func:`hard_exit` leaves at once (logs flushed), without waiting for threads or tasks that
  would never end.
* :class:`LoopWatchdog` is a thread that watches the event loop: when the loop has not run for
  longer than the heartbeat staleness (at least 10 s; an async handler blocking it, say), the
  process exits with status 70 (its attempts are being rescued anyway), naming the code that
  blocks it; when a graceful stop overruns the shutdown timeout, it exits too. A stopped or
  starved *process* (SIGSTOP, a machine stall) is told apart from a blocked *loop*: the
  watchdog's own sleep then overruns as well, and it starts counting afresh.
* :func:`exit_when_database_replaced` makes a reconnect that reaches a different database (one
  dropped and recreated, say) exit with status 70 before any statement runs there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from typing import NoReturn

from awa_django.db.connection import DatabaseReplaced, on_database_replaced

__all__ = ["EXIT_LOOP_FAILED", "LoopWatchdog", "exit_when_database_replaced", "hard_exit"]

log = logging.getLogger("awa_django.worker")

#: A background loop (or the event loop itself) failed (EX_SOFTWARE): restart the process.
EXIT_LOOP_FAILED = 70


def hard_exit(code: int) -> NoReturn:
    """Exit the process now, without waiting for threads or tasks (logs are flushed)."""
    for handler in logging.getLogger().handlers + logging.getLogger("awa_django").handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def exit_when_database_replaced() -> None:
    """From now on, a connection of this process that reaches a different database than its
    first one did ends the process with status 70 (its supervisor starts it afresh)."""

    def leave(error: DatabaseReplaced) -> None:
        log.critical("awa: %s; exiting with status %d to start afresh", error, EXIT_LOOP_FAILED)
        hard_exit(EXIT_LOOP_FAILED)

    on_database_replaced(leave)


class LoopWatchdog:
    """A daemon thread that exits the process when the event loop stops running.

    ``tick()`` must be called from the loop at least every ``interval`` seconds; ``stopping()``
    when a graceful stop begins, with the longest it may take.
    """

    def __init__(self, *, limit: float, interval: float = 0.5) -> None:
        self.limit = limit
        self.interval = interval
        self._tick = time.monotonic()
        self._stop_by: float | None = None
        self._stop_code = 0
        self._closed = threading.Event()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="awa-watchdog", daemon=True)

    def start(self) -> None:
        self._tick = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._thread.start()

    def tick(self) -> None:
        """The loop ran (call from the loop)."""
        self._tick = time.monotonic()

    def stopping(self, within: float, code: int) -> None:
        """A graceful stop began; exit with ``code`` if the process is still here ``within``
        seconds from now (any thread may call this, a signal handler included)."""
        if self._stop_by is None:
            self._stop_by = time.monotonic() + within
            self._stop_code = code

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._closed.wait(self.interval):
            now = time.monotonic()
            if now - last > max(5 * self.interval, 2.0):
                # This thread overslept too: the whole process was stopped or starved, not the
                # loop blocked. Count afresh.
                self._tick = now
                if self._stop_by is not None:
                    self._stop_by += now - last
            last = now
            if self._stop_by is not None and now > self._stop_by:
                log.critical(
                    "awa worker: the graceful stop overran its time (a handler holds the event "
                    "loop or the interpreter); exiting now with status %d",
                    self._stop_code,
                )
                hard_exit(self._stop_code)
            blocked = now - self._tick
            if blocked > self.limit:
                log.critical(
                    "awa worker: the event loop has not run for %.1f s (more than the heartbeat "
                    "staleness, so this process's attempts are being rescued); exiting with "
                    "status %d. It is blocked in:\n%s",
                    blocked,
                    EXIT_LOOP_FAILED,
                    _stack_of(self._loop_thread),
                )
                hard_exit(EXIT_LOOP_FAILED)


def _stack_of(thread_id: int) -> str:
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "(unknown)"
    return "".join(traceback.format_stack(frame)[-8:])
