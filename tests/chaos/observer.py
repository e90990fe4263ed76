"""Background threads that watch and answer: the observer and the callback resolver.

The observer samples, every second, every terminal fact in ``awa.jobs`` into
``chaos.terminal_seen`` (terminal history ages out after HISTORY_RETENTION, so the checker
cannot read it at the end), any job that shows more than once in ``awa.jobs``, and the rows
held by each ring. The resolver resolves the callbacks that handlers parked in
``chaos.callbacks`` once their delay has passed, with a result or an error.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import psycopg
from django.db import connection

import awa_django
from tests.chaos.common import DJANGO_CONNECTION_ERRORS, Run
from tests.chaos.db import CONNECTION_ERRORS, LedgerConn

__all__ = ["Observer", "Resolver", "StallMonitor"]

# The rings whose rows must shrink back once pins and locks are gone (the queue ring keeps
# HISTORY_RETENTION of history on purpose).
SHRINKING_RINGS = ("claim", "lease")


class Observer:
    """Samples terminal facts, duplicates and ring sizes until ``stop``."""

    def __init__(self, run: Run, stop: threading.Event, interval: float = 1.0) -> None:
        self.run = run
        self.stop = stop
        self.interval = interval
        self.db = LedgerConn(run.url, "observer", patience=2.0)
        self.peak = 0
        self.peak_at = 0.0
        self.latest: int | None = None
        self.samples = 0

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                self.observe_once()
                self.stop.wait(self.interval)
        finally:
            self.db.close()

    def observe_once(self) -> bool:
        """One sample; False when the database could not be reached."""
        try:
            self.db.execute("observe_terminal")
            self.db.execute("observe_duplicates")
            rows = dict(self.db.execute("ring_rows"))
        except CONNECTION_ERRORS:
            return False
        except psycopg.Error as exc:
            self.run.note(f"observer: {type(exc).__name__}: {exc}")
            return False
        held = sum(int(rows.get(ring) or 0) for ring in SHRINKING_RINGS)
        self.latest = held
        self.samples += 1
        if held > self.peak:
            self.peak = held
            self.peak_at = time.monotonic()
        return True


class Resolver:
    """Resolves parked callbacks (``callback_late``) once they are due, until ``stop``."""

    def __init__(self, run: Run, stop: threading.Event) -> None:
        self.run = run
        self.stop = stop
        self.db = LedgerConn(run.url, "resolver", patience=2.0)
        self.outcomes: dict[str, int] = {}

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    self._resolve_due()
                except (*CONNECTION_ERRORS, *DJANGO_CONNECTION_ERRORS):
                    connection.close()
                except Exception as exc:
                    self.run.api_error("resolve_callback", exc)
                    connection.close()
                self.stop.wait(0.1)
        finally:
            connection.close()
            self.db.close()

    def _resolve_due(self) -> None:
        for callback_id, with_error in self.db.execute("callbacks_due"):
            if with_error:
                outcome = awa_django.resolve_callback(callback_id, error="chaos: late error")
            else:
                outcome = awa_django.resolve_callback(callback_id, result={"late": True})
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            self.db.execute("callback_resolved", [outcome, callback_id])


class StallMonitor:
    """Notices when this machine stalls (a 0.1 s sleep that takes over ``threshold``): on two
    cores a starved worker can miss heartbeats with no fault injected, and the checker must not
    blame awa_django for that. ``stalls`` holds (start, end) windows."""

    def __init__(self, stop: threading.Event, threshold: float = 0.5) -> None:
        self.stop = stop
        self.threshold = threshold
        self.stalls: list[tuple[datetime, datetime]] = []

    def loop(self) -> None:
        while not self.stop.is_set():
            before, wall = time.monotonic(), datetime.now(UTC)
            time.sleep(0.1)
            if time.monotonic() - before > self.threshold:
                self.stalls.append((wall, datetime.now(UTC)))
