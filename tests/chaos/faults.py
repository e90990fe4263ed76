"""The fault injector: every 1-3 s a seeded RNG injects the next fault.

Fault types come in shuffled cycles, so every type occurs within the first cycle of a run:
SIGKILL a worker; SIGTERM one (a graceful drain that must exit 0, then a replacement); SIGSTOP
a worker (or the maintenance leader) for 0.3-3.5 s, sometimes longer than HEARTBEAT_STALENESS,
then SIGCONT; ``pg_terminate_backend`` of 1-4 ``awa:`` connections; a PostgreSQL restart in
fast or immediate mode (own cluster only); a transaction holding ``ACCESS SHARE`` on a random
ring child for 2-5 s (blocks TRUNCATE); a REPEATABLE READ snapshot pinned for 10-20 s. Stops
and holds overlap; ``cleanup()`` undoes whatever is still active.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import psycopg

from awa_django.sql import RING_SLOTS
from tests.chaos.cluster import Cluster
from tests.chaos.common import Run, child_rng
from tests.chaos.db import CONNECTION_ERRORS, LedgerConn, composed, statement
from tests.chaos.workers import Fleet, Worker

__all__ = ["FaultRecord", "Faults", "NotInjected"]

RESTARTS = ("restart_fast", "restart_immediate")
KINDS = (
    "kill_worker",
    "term_worker",
    "stop_worker",
    "stop_leader",
    "terminate_backends",
    *RESTARTS,
    "lock_holder",
    "pin",
)
RING_CHILDREN = (
    [f"ready_entries_{i}" for i in range(RING_SLOTS["queue"])]
    + [f"done_entries_{i}" for i in range(RING_SLOTS["queue"])]
    + [f"claims_{i}" for i in range(RING_SLOTS["claim"])]
    + [f"claim_closures_{i}" for i in range(RING_SLOTS["claim"])]
    + [f"leases_{i}" for i in range(RING_SLOTS["lease"])]
)


class NotInjected(Exception):
    """A fault found nothing to act on (no live worker, no leader, no awa connection)."""


@dataclasses.dataclass
class FaultRecord:
    """One injected fault; ``pid`` is the worker it targeted, if any."""

    kind: str
    pid: int | None
    detail: str
    started_at: datetime
    ended_at: datetime


@dataclasses.dataclass
class _Pending:
    """Something to undo later: a SIGCONT, or a held transaction to roll back."""

    due: float
    record: FaultRecord
    undo: Callable[[], None]


class Faults:
    """Injects faults (``run_for``); ``records`` is what happened."""

    def __init__(self, run: Run, fleet: Fleet, cluster: Cluster) -> None:
        self.run = run
        self.fleet = fleet
        self.cluster = cluster
        self.rng = child_rng(run.seed, "faults")
        self.db = LedgerConn(run.url, "faults", patience=5.0)
        self.kinds = KINDS if cluster.restartable else tuple(k for k in KINDS if k not in RESTARTS)
        self.records: list[FaultRecord] = []
        self.pending: list[_Pending] = []
        self.lock = threading.Lock()
        self._cycle: list[str] = []

    def run_for(self, seconds: float) -> None:
        """Inject faults for ``seconds``, in the calling thread. It must be the main thread:
        a restarted postmaster gets SIGINT when the thread that started it ends
        (PR_SET_PDEATHSIG follows the parent thread, not the process)."""
        end = time.monotonic() + seconds
        next_at = time.monotonic() + self.rng.uniform(1.0, 3.0)
        while time.monotonic() < end:
            self._undo_due(time.monotonic())
            if time.monotonic() >= next_at:
                self._inject(self._next_kind())
                next_at = time.monotonic() + self.rng.uniform(1.0, 3.0)
            time.sleep(0.05)

    def _next_kind(self) -> str:
        if not self._cycle:
            self._cycle = self.rng.sample(list(self.kinds), len(self.kinds))
        return self._cycle.pop()

    def _inject(self, kind: str) -> None:
        # Draw all of this fault's randomness first, so the schedule does not depend on timing.
        pick = self.rng.random()
        hold = self.rng.uniform(0.3, 3.5)
        count = self.rng.randint(1, 4)
        table = self.rng.choice(RING_CHILDREN)
        lock_for = self.rng.uniform(2.0, 5.0)
        pin_for = self.rng.uniform(10.0, 20.0)
        downtime = self.rng.uniform(0.2, 2.5)
        try:
            if kind == "kill_worker":
                self._kill(pick)
            elif kind == "term_worker":
                self._term(pick)
            elif kind in ("stop_worker", "stop_leader"):
                self._pause(kind, pick, hold)
            elif kind == "terminate_backends":
                self._terminate(pick, count)
            elif kind in RESTARTS:
                self._restart(kind, downtime)
            elif kind == "lock_holder":
                self._hold(kind, lock_for, table)
            else:
                self._hold(kind, pin_for, None)
        except (NotInjected, *CONNECTION_ERRORS, psycopg.Error) as exc:
            self.run.note(f"fault {kind} not injected: {type(exc).__name__}: {exc}")
            return
        self.run.count("faults", kind)

    # -- worker processes ----------------------------------------------------------------------

    def _target(self, pick: float, among: set[int] | None = None) -> Worker | None:
        live = sorted(
            (w for w in self.fleet.live() if among is None or w.pid in among),
            key=lambda w: w.slot,
        )
        return live[int(pick * len(live))] if live else None

    def _kill(self, pick: float) -> None:
        worker = self._target(pick)
        if worker is None or not self.fleet.signal(worker, signal.SIGKILL):
            raise NotInjected("kill_worker: no live target")
        now = datetime.now(UTC)
        self._record("kill_worker", worker.pid, f"slot {worker.slot}", now, now)

    def _term(self, pick: float) -> None:
        """A graceful stop: the worker drains for up to SHUTDOWN_TIMEOUT and exits 0; what it
        leaves running is rescued. Only registered workers are chosen: before that, its signal
        handlers may not be installed yet."""
        registered = {row[0] for row in self.db.execute("fresh_runtimes", [5.0])}
        worker = self._target(pick, registered)
        if worker is None or not self.fleet.signal(worker, signal.SIGTERM):
            raise NotInjected("term_worker: no live target (or it is already draining)")
        now = datetime.now(UTC)
        self._record("term_worker", worker.pid, f"slot {worker.slot}", now, now)

    def _pause(self, kind: str, pick: float, hold: float) -> None:
        worker = self._target(pick)
        if kind == "stop_leader":
            rows = self.db.execute("leader_pid")
            worker = self.fleet.by_pid(rows[0][0]) if rows else None
        if worker is None or not self.fleet.signal(worker, signal.SIGSTOP):
            raise NotInjected(f"{kind}: no live target")
        now = datetime.now(UTC)
        record = self._record(kind, worker.pid, f"slot {worker.slot}, {hold:.2f} s", now, now)

        def resume(worker: Worker = worker) -> None:
            self.fleet.signal(worker, signal.SIGCONT)

        self._defer(hold, record, resume)

    def _terminate(self, pick: float, count: int) -> None:
        rows = self.db.execute("awa_backends")
        if not rows:
            raise NotInjected("terminate_backends: no awa connections")
        start = int(pick * len(rows))
        chosen = (rows[start:] + rows[:start])[:count]
        for backend_pid, application_name, worker_pid in chosen:
            self.db.execute("terminate_backend", [backend_pid])
            now = datetime.now(UTC)
            self._record("terminate_backends", worker_pid, application_name, now, now)

    # -- the server ----------------------------------------------------------------------------

    def _restart(self, kind: str, downtime: float) -> None:
        started = datetime.now(UTC)
        self.cluster.restart(kind.removeprefix("restart_"), downtime=downtime)
        self._record(kind, None, f"down {downtime:.2f} s", started, datetime.now(UTC))

    def _hold(self, kind: str, seconds: float, table: str | None) -> None:
        """A transaction held open: ACCESS SHARE on a ring child, or a pinned snapshot."""
        conn = psycopg.connect(
            self.run.url, autocommit=True, connect_timeout=3, application_name=f"chaos:{kind}"
        )
        try:
            if table is None:
                conn.execute(statement("pin_begin"))
                conn.execute(statement("pin_xid"))
            else:
                conn.execute(statement("lock_begin"))
                conn.execute(composed("lock_child", table=("awa", table)))
        except psycopg.Error:
            conn.close()
            raise
        now = datetime.now(UTC)
        detail = f"{table or 'snapshot'} for {seconds:.1f} s"
        record = self._record(kind, None, detail, now, now)
        self._defer(seconds, record, conn.close)

    # -- book-keeping --------------------------------------------------------------------------

    def _record(
        self, kind: str, pid: int | None, detail: str, started: datetime, ended: datetime
    ) -> FaultRecord:
        record = FaultRecord(kind, pid, detail, started, ended)
        with self.lock:
            self.records.append(record)
        return record

    def _defer(self, seconds: float, record: FaultRecord, undo: Callable[[], None]) -> None:
        with self.lock:
            self.pending.append(_Pending(time.monotonic() + seconds, record, undo))

    def _undo_due(self, now: float) -> None:
        with self.lock:
            due = [p for p in self.pending if p.due <= now]
            self.pending = [p for p in self.pending if p.due > now]
        for item in due:
            with contextlib.suppress(psycopg.Error):
                item.undo()
            item.record.ended_at = datetime.now(UTC)

    def cleanup(self) -> None:
        """Undo everything still active (SIGCONT, roll back held transactions)."""
        self._undo_due(float("inf"))
        self.db.close()

    def last_pin_released(self) -> datetime | None:
        pins = [r.ended_at for r in self.records if r.kind == "pin"]
        return max(pins) if pins else None
