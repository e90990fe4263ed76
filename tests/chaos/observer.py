"""Background threads that watch: the observer and the stall monitor.

The observer samples, every second, every terminal fact in ``awa.jobs`` into
``chaos.terminal_seen`` (terminal history ages out after HISTORY_RETENTION, so the checker
cannot read it at the end; triggers record each terminal write in ``chaos.terminal_written``),
any job that shows more than once in ``awa.jobs``, every job a periodic schedule fired
(``chaos.cron_seen``), two live jobs holding one unique key (``chaos.unique_overlaps``), the
maintenance leader (``chaos.leaders``), the workers' database sessions (``chaos.sessions``: when
one ended, its permits and serial keys went with it) and the rows held by each ring. The
callback resolver is in tests/chaos/resolver.py.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import psycopg

from tests.chaos.common import Run
from tests.chaos.db import CONNECTION_ERRORS, LedgerConn

__all__ = ["Observer", "StallMonitor"]

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
            self.db.execute("observe_jobs")
            self.db.execute("observe_unique")
            self.db.execute("observe_leader")
            self.db.execute("observe_sessions")
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
