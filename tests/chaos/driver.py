"""One chaos run, from a fresh database to its verdict (imported once Django is set up).

``ChaosRun.execute()``: create and migrate the run's database and the ledger, start the worker
fleet, drive producers, the operator and the faults for the run's duration, settle (every queue
resumed, every worker back, every committed job terminal within a bound computed from the
settings, the rings watched while a trickle of jobs keeps them rotating, the workers checked),
stop the workers with SIGTERM and run every check of tests/chaos/check.py. ``report()`` prints
the summary.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
from django.db import connections

from awa_django.conf import get_awa_settings
from awa_django.db.enqueue import forget_known_lanes
from awa_django.maintenance.leader import MaintenanceSettings
from tests.chaos import control, jobs
from tests.chaos.check import (
    CHECKS,
    Data,
    EndFacts,
    Violation,
    by_invariant,
    executions,
    load,
)
from tests.chaos.check import rescues as rescue_count
from tests.chaos.cluster import Cluster
from tests.chaos.common import DJANGO_CONNECTION_ERRORS, Run
from tests.chaos.db import LedgerConn, statement
from tests.chaos.faults import Faults
from tests.chaos.observer import Observer, StallMonitor
from tests.chaos.operators import Operator, resume_all
from tests.chaos.producers import Producer, trickle
from tests.chaos.resolver import Resolver
from tests.chaos.settings import database_settings
from tests.chaos.specs import spread_queues
from tests.chaos.workers import Fleet

__all__ = ["CI", "SOAK", "ChaosRun", "Profile", "point_django_at", "report"]

REPO = Path(__file__).resolve().parents[2]
CHAOS_DIR = REPO / ".pgdata" / "chaos"
SETTINGS_MODULE = "tests.chaos.settings"
WORKERS = 3
TRICKLE_PER_SECOND = 10.0
CATCH_UP_TIMEOUT = 20.0  # seconds for the schedules to fire what fell due during the faults
RING_SLOTS = 8  # claim and lease rings
LOG_PATTERNS = ("Task exception was never retrieved", "Exception in callback", " CRITICAL ")
MAX_PRINTED = 20


@dataclasses.dataclass(frozen=True)
class Profile:
    """How hard a run pushes: seconds of faults, producer threads, spread queues, the gap
    between two faults and between two rounds of a producer (seconds, drawn uniformly)."""

    duration: float
    producers: int
    queues: int
    fault_gap: tuple[float, float]
    pace: tuple[float, float] = (0.02, 0.2)
    limited: int = 3  # producers that feed the concurrency- and rate-limited queues


CI = Profile(duration=45.0, producers=3, queues=48, fault_gap=(1.0, 3.0))
# Three times CI's faults, twice its jobs: a soak longer than the workers can keep up with on a
# shared two-core machine would only measure the backlog. Over 200 busy queues a limited queue
# hands its permits back only at its worker's next turn in the claim line, so one producer feeds
# the limited queues.
SOAK = Profile(duration=150.0, producers=3, queues=200, fault_gap=(1.0, 3.0), pace=(0.06, 0.5))


def point_django_at(url: str) -> None:
    """Aim Django's default connection (every thread's) at this run's database."""
    connections.close_all()
    connections.settings["default"].update(database_settings(url))
    forget_known_lanes()


# -- one run --------------------------------------------------------------------------------------


class ChaosRun:
    """Sets up, drives and checks one seeded run."""

    def __init__(self, cluster: Cluster, seed: int, index: int, profile: Profile) -> None:
        self.cluster = cluster
        self.cfg = get_awa_settings()
        self.profile = profile
        self.db_name = f"chaos_{seed}"
        run_dir = CHAOS_DIR / "runs" / f"seed-{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        url = cluster.create_database(self.db_name)
        self.run = Run(
            seed,
            index,
            profile.duration,
            url,
            run_dir,
            cluster.restartable,
            queues=spread_queues(profile.queues),
        )
        self.threads: list[tuple[threading.Thread, threading.Event]] = []
        self.started = time.monotonic()
        self.timeline: list[str] = []

    # -- phases --------------------------------------------------------------------------------

    def execute(self) -> tuple[list[Violation], Data]:
        """Run every phase; return (violations, loaded data)."""
        self._prepare_database()
        point_django_at(self.run.url)
        env = {**os.environ, "DATABASE_URL": self.run.url, "PYTHONUNBUFFERED": "1"}
        env["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
        self.fleet = Fleet(self.run.run_dir, env, WORKERS)
        self.facts = EndFacts(
            heartbeat_staleness=self.cfg.HEARTBEAT_STALENESS,
            terminal_bound=self.terminal_bound(),
            outage_hold_back=MaintenanceSettings(self.cfg).outage_hold_back,
            retry_backoff_base=self.cfg.RETRY_BACKOFF_BASE,
            retry_after_seconds=jobs.RETRY_AFTER_SECONDS,
            cron_eval_interval=self.cfg.CRON_EVAL_INTERVAL,
        )
        try:
            self.fleet.start()
            self._wait_registered()
            self._drive()
            self._settle()
            return self._check()
        finally:
            self._stop_threads()
            self.fleet.kill_all()

    def _prepare_database(self) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": self.run.url,
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
        }
        result = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"migrate failed:\n{result.stdout}{result.stderr}")

        with psycopg.connect(self.run.url, autocommit=True) as conn:
            conn.execute(statement("schema"))

    def _wait_registered(self, timeout: float = 30.0) -> None:
        db = LedgerConn(self.run.url, "setup")
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                fresh = {row[0] for row in db.execute("fresh_runtimes", [5.0])}
                if {w.pid for w in self.fleet.live()} <= fresh:
                    control.record_settings_limits(db)
                    return
                time.sleep(0.1)
        finally:
            db.close()
        raise RuntimeError(
            f"workers did not register within {timeout:.0f} s; see {self.run.run_dir}"
        )

    def _drive(self) -> None:
        run = self.run
        self.stalls = StallMonitor(self._event())
        self._spawn_loop("stalls", self.stalls.loop, self.stalls.stop)
        self.observer = Observer(run, self._event())
        self.resolver = Resolver(run, self._event())
        self.supervisor_stop = self._event()
        self._spawn("supervisor", self.fleet.supervise, self.supervisor_stop)
        self._spawn_loop("observer", self.observer.loop, self.observer.stop)
        self._spawn_loop("resolver", self.resolver.loop, self.resolver.stop)
        produce = self._event()
        profile = self.profile
        producers = [
            Producer(run, i, produce, profile.pace, profile.limited)
            for i in range(profile.producers)
        ]
        for i, producer in enumerate(producers):
            self._spawn_loop(f"producer-{i}", producer.loop, produce)
        operator = Operator(run, self._event())
        self._spawn_loop("operator", operator.loop, operator.stop)
        self.faults = Faults(run, self.fleet, self.cluster, self.profile.fault_gap)
        self._mark(f"driving for {run.duration:.0f} s")
        self.faults.run_for(run.duration)
        self._mark("stopping faults, producers and operator")
        self.faults.cleanup()
        self._halt(produce)
        self._halt(operator.stop)
        resume_all(self.run)
        self._control(control.restore_limits)
        self._mark("queues resumed, limits restored")

    def _settle(self) -> None:
        self._wait_fleet()
        self._catch_up_schedules()
        self._control(control.pause_schedules)
        self._mark("schedules caught up and paused")
        self._wait_terminal()
        self._watch_rings()
        self._check_workers()

    def _control(self, action: Callable[[LedgerConn], None], patience: float = 60.0) -> None:
        """An operator's change at the end of the drive (retried through a restart)."""
        db = LedgerConn(self.run.url, "control")
        deadline = time.monotonic() + patience
        try:
            while True:
                try:
                    action(db)
                    return
                except DJANGO_CONNECTION_ERRORS:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            connections.close_all()
            db.close()

    def _catch_up_schedules(self) -> None:
        """Wait until the schedules fired what fell due while the faults went on."""
        db = LedgerConn(self.run.url, "settle")
        lag = 1.0 + 2 * self.cfg.CRON_EVAL_INTERVAL
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        try:
            while time.monotonic() < deadline:
                [(behind,)] = db.execute("cron_caught_up", [list(control.SCHEDULES), lag])
                if not behind:
                    return
                time.sleep(0.2)
            self._mark(f"the schedules did not catch up within {CATCH_UP_TIMEOUT:.0f} s")
        finally:
            db.close()

    def _wait_fleet(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.fleet.live()) < WORKERS and time.monotonic() < deadline:
            time.sleep(0.1)

    def terminal_bound(self) -> float:
        """How long every committed job may take to end once faults stop: max attempts x (the
        longest handler + staleness + rescue tick + backoff), plus the longest callback wait
        and deadline hang, plus slack."""
        cfg = self.cfg
        backoff = cfg.RETRY_BACKOFF_BASE * 2**5 * 1.25
        per_attempt = 2.0 + cfg.HEARTBEAT_STALENESS + cfg.RESCUE_INTERVAL + backoff
        return round(5 * per_attempt + 8.0 + jobs.HANG_SECONDS + 10.0)

    def _wait_terminal(self) -> None:
        db = LedgerConn(self.run.url, "settle")
        bound = self.facts.terminal_bound
        deadline = time.monotonic() + bound
        started = time.monotonic()
        try:
            while True:
                self.observer.observe_once()
                left = db.execute("unfinished")
                if not left:
                    self._mark(
                        f"all committed jobs terminal after {time.monotonic() - started:.1f} s"
                    )
                    return
                if time.monotonic() >= deadline:
                    self.facts.terminal_wait_timed_out = True
                    self._mark(f"{len(left)} committed job(s) not terminal within {bound:.0f} s")
                    return
                time.sleep(0.5)
        finally:
            db.close()

    def _watch_rings(self) -> None:
        """Keep a trickle of jobs flowing (an idle ring stops rotating by design) and wait for
        the claim and lease rings to shrink back to a small fraction of their peak."""
        cfg = self.cfg
        steady = RING_SLOTS * cfg.CLAIM_ROTATE_INTERVAL * TRICKLE_PER_SECOND * 2
        peak = self.observer.peak
        # Rows of attempts only: the claim ring's cursor markers are not counted (ledger.sql).
        threshold = max(math.ceil(0.2 * peak), math.ceil(3 * steady) + 50)
        bound = 3 * RING_SLOTS * cfg.CLAIM_ROTATE_INTERVAL + 10.0
        stop = self._event()
        self._spawn_loop("trickle", lambda: trickle(self.run, stop, TRICKLE_PER_SECOND), stop)
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if self.observer.observe_once() and (self.observer.latest or 0) <= threshold:
                break
            time.sleep(0.5)
        self._halt(stop)
        self.facts.ring_peak = peak
        self.facts.ring_final = self.observer.latest
        self.facts.ring_threshold = threshold
        self.facts.ring_bound = bound
        self._mark(f"rings: peak {peak}, now {self.observer.latest}, allowed {threshold}")
        self._wait_terminal_short()

    def _wait_terminal_short(self) -> None:
        """The trickle's own jobs end within a few seconds."""
        db = LedgerConn(self.run.url, "settle")
        deadline = time.monotonic() + 10.0
        try:
            while time.monotonic() < deadline:
                self.observer.observe_once()
                if not db.execute("unfinished") or self.facts.terminal_wait_timed_out:
                    return
                time.sleep(0.5)
        finally:
            db.close()

    def _check_workers(self, timeout: float = 6.0) -> None:
        """Every worker the driver runs is alive with a fresh runtime row (or half-alive)."""
        db = LedgerConn(self.run.url, "settle")
        freshness = max(2.5, 3 * self.cfg.RUNTIME_REFRESH_INTERVAL + 1.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                live = {w.pid for w in self.fleet.live()}
                fresh = {row[0] for row in db.execute("fresh_runtimes", [freshness])}
                if (live <= fresh and len(live) == WORKERS) or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        finally:
            db.close()
        self.facts.workers_alive = sorted(live)
        self.facts.workers_fresh = fresh & live
        with self.fleet.lock:
            self.facts.workers_dead_at_end = sorted(
                w.pid for w in self.fleet.workers.values() if not w.alive()
            )

    # -- the end -------------------------------------------------------------------------------

    def _check(self) -> tuple[list[Violation], Data]:
        self._halt(self.observer.stop)
        self.observer.observe_once()
        self._halt(self.resolver.stop)
        self._halt(self.supervisor_stop)
        self._halt(self.stalls.stop)
        self.facts.stop_codes = self.fleet.stop_all(self.cfg.SHUTDOWN_TIMEOUT + 7.0)
        self._mark("workers stopped")
        self.observer.observe_once()  # what their graceful stops finished
        self.observer.db.close()
        self._scan_logs()
        self.facts.api_errors = list(self.run.api_errors)
        self._write_events()
        with psycopg.connect(self.run.url, autocommit=True) as conn:
            data = load(conn)
        violations = [v for check in CHECKS for v in check(data, self.facts)]
        self._mark("checked")
        return violations, data

    def _scan_logs(self) -> None:
        for death in self.fleet.deaths:
            if death.cause.startswith("exited"):
                lines = [line for line in _read(death.log_path).splitlines() if line.strip()]
                tail = " | ".join(line.strip()[:160] for line in lines[-3:])
                self.facts.own_exits.append((death.pid, death.cause, tail))
        for worker in self.fleet.every:
            seen: set[str] = set()
            for line in _read(worker.log_path).splitlines():
                for pattern in LOG_PATTERNS:
                    if pattern in line and pattern not in seen:
                        seen.add(pattern)
                        rel = worker.log_path.relative_to(REPO)
                        self.facts.log_findings.append((str(rel), line.strip()[:300]))

    def _write_events(self) -> None:
        db = LedgerConn(self.run.url, "events")
        try:
            for death in self.fleet.deaths:
                db.execute("worker_death", [death.pid, death.died_at, death.cause])
            for f in self.faults.records:
                db.execute("fault_insert", [f.kind, f.pid, f.detail, f.started_at, f.ended_at])
            for start, end in self.stalls.stalls:
                db.execute("fault_insert", ["stall", None, "the driver stalled", start, end])
        finally:
            db.close()

    # -- threads -------------------------------------------------------------------------------

    def _event(self) -> threading.Event:
        return threading.Event()

    def _spawn(
        self, name: str, target: Callable[[threading.Event], None], stop: threading.Event
    ) -> None:
        thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
        self.threads.append((thread, stop))
        thread.start()

    def _spawn_loop(self, name: str, target: Callable[[], None], stop: threading.Event) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self.threads.append((thread, stop))
        thread.start()

    def _halt(self, stop: threading.Event, timeout: float = 90.0) -> None:
        stop.set()
        for thread, event in self.threads:
            if event is stop:
                thread.join(timeout)
                if thread.is_alive():
                    self.run.note(f"thread {thread.name} did not stop within {timeout:.0f} s")

    def _stop_threads(self) -> None:
        for _, stop in self.threads:
            stop.set()
        if getattr(self, "faults", None) is not None:
            self.faults.cleanup()

    def _mark(self, text: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:6.1f}s {text}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# -- reporting ----------------------------------------------------------------------------------


def _counter(counter: Counter[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counter.items())) or "-"


def report(chaos: ChaosRun, violations: list[Violation], data: Data, elapsed: float) -> None:
    run = chaos.run
    own = sum(1 for d in chaos.fleet.deaths if d.cause.startswith("exited"))
    print(
        f"\n=== chaos run seed={run.seed} duration={run.duration:.0f}s ({elapsed:.0f}s in all) "
        f"db={chaos.db_name} logs={run.run_dir.relative_to(REPO)}"
    )
    if not run.restartable:
        print("  note: DATABASE_URL is set: PostgreSQL restarts are skipped")
    print(f"  faults:  {_counter(run.faults)}")
    print(f"  actions: {_counter(run.actions)}")
    print(f"  paths:   {_counter(run.paths)}")
    print(
        f"  jobs: committed={len(data.committed)} rolled_back={len(data.rolled_back)} "
        f"indeterminate={len(data.indeterminate)} executions={executions(data)} "
        f"rescues={rescue_count(data)} worker_restarts={chaos.fleet.restarts} (own exits {own})"
    )
    stalls = chaos.stalls.stalls
    if stalls:
        longest = max((end - start).total_seconds() for start, end in stalls)
        print(f"  machine stalls: {len(stalls)} (longest {longest:.1f} s)")
    resolved = " ".join(f"{k}={v}" for k, v in sorted(chaos.resolver.outcomes.items())) or "-"
    print(f"  callbacks resolved late: {resolved}")
    for line in feature_lines(data):
        print(f"  {line}")
    for line in chaos.timeline:
        print(f"  {line}")
    for note in run.notes[:10]:
        print(f"  note: {note}")
    counts = by_invariant(violations)
    print(f"  violations: {len(violations)} {counts if counts else ''}")
    shown = sample(violations, MAX_PRINTED)
    for violation in shown:
        print(f"    {violation}")
    if violations:
        path = run.run_dir / "violations.txt"
        path.write_text("".join(f"{v}\n" for v in violations))
        if len(violations) > len(shown):
            print(f"    ... {len(violations) - len(shown)} more in {path.relative_to(REPO)}")


def feature_lines(data: Data) -> list[str]:
    """What the run did with each feature, for the summary."""
    f = data.features
    queues = {e.queue for rows in data.execs.values() for e in rows if e.queue}
    by_scope: Counter[str] = Counter()
    for rows in data.execs.values():
        for e in rows:
            option = f.options.get(e.job_id)
            if e.queue in ("chaos-limit", "chaos-rate", "chaos-serial"):
                by_scope[e.queue] += 1
            if e.kind == "chaos.limited":
                by_scope["kind chaos.limited"] += 1
            if option is not None and option.retry and e.attempt > 1:
                by_scope["retries with a policy"] += 1
    unique = f.unique_enqueues
    duplicates = sum(1 for u in unique if u.duplicate)
    fires = Counter(fire.name for fire in f.cron_fires if not fire.manual)
    calls = Counter(f"{c.via}:{c.outcome}{'(replayed)' if c.replayed else ''}" for c in f.calls)
    return [
        f"queues run: {len(queues)}; flow executions: {_counter(by_scope)}",
        f"limit changes: {sum(1 for c in f.limit_changes if c.began.year > 2000)} "
        f"(uncertain {sum(1 for c in f.limit_changes if not c.certain)})",
        f"unique: enqueues={len(unique)} duplicates={duplicates} "
        f"rollback races={len(f.unique_rollbacks)}",
        f"periodic: {_counter(fires)} manual={sum(1 for x in f.cron_fires if x.manual)} "
        f"schedule actions={len(f.schedule_actions)}",
        f"callback waits: {len(f.parks)}; calls: {_counter(calls)}",
    ]


def sample(violations: list[Violation], limit: int) -> list[Violation]:
    """At most ``limit`` violations, taken in turn from each invariant that has some."""
    groups: dict[str, list[Violation]] = {}
    for violation in violations:
        groups.setdefault(violation.invariant, []).append(violation)
    shown: list[Violation] = []
    while len(shown) < limit and any(groups.values()):
        for group in groups.values():
            if group and len(shown) < limit:
                shown.append(group.pop(0))
    return shown
