"""Several worker hosts: ``python -m tests.fleet.run`` (root; prints figures, exits 1 on a
violation, 0 with a SKIP line when namespaces are unavailable).

Three hosts (network namespaces, :mod:`tests.fleet.net`) each run ``awa_worker --processes 2``
against one embedded PostgreSQL cluster; a producer in the root namespace enqueues a steady
load. Then:

1. steady load: every host runs jobs;
2. a host that is not the maintenance leader is cut off: its running attempts are rescued by
   the others within ``HEARTBEAT_STALENESS + RESCUE_INTERVAL`` (+ slack); the link heals and
   its late completions are refused as stale;
3. the leader's host is cut off: another host takes the maintenance lock (after the frozen
   leader's runtime row is older than ``max(HEARTBEAT_STALENESS, 3 * RUNTIME_REFRESH_INTERVAL)``)
   and rescues that host's attempts; the link heals;
4. the load stops and drains: every committed job completed exactly once, and every execution
   that did not win is a recorded "heartbeat stale" rescue of its attempt.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from awa_django.worker.config import connection_budget, own_connections
from tests.fleet import settings
from tests.fleet.net import Host, unavailable
from tests.fleet.sql import statement
from tests.support.polling import wait_for

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import pgserver  # noqa: E402

__all__ = ["Report", "main", "run"]

T = TypeVar("T")

HOSTS = 3
PROCESSES = 2
RATE = 8.0  # jobs per second
JOB_SECONDS = 2.0
STEADY_SECONDS = 6.0
SLACK = 1.5  # seconds on top of the documented bounds (scheduling on a loaded machine)

STALE_LINE = re.compile(r"stale finalization of job (\d+) attempt lease (\d+)")

AWA = settings.AWA
RESCUE_BOUND = AWA["HEARTBEAT_STALENESS"] + AWA["RESCUE_INTERVAL"] + SLACK
LEADER_BOUND = (
    max(AWA["HEARTBEAT_STALENESS"], 3 * AWA["RUNTIME_REFRESH_INTERVAL"])
    + 2 * AWA["LEADER_ELECTION_INTERVAL"]
    + AWA["RESCUE_INTERVAL"]
    + SLACK
)


@dataclasses.dataclass
class Report:
    """What one run measured, and what it found wrong (``violations`` empty: it passed)."""

    violations: list[str] = dataclasses.field(default_factory=list)
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    def fail(self, text: str) -> None:
        self.violations.append(text)

    def show(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.figures.items()]
        lines += [f"VIOLATION: {v}" for v in self.violations]
        return "\n".join(lines)


def _wait(what: str, fn: Callable[[], T | None], timeout: float, step: float = 0.1) -> T:
    """``tests.support.polling.wait_for`` (the one place tests sleep), with the fleet's argument
    order."""
    return wait_for(fn, timeout=timeout, interval=step, message=what)  # type: ignore[arg-type]


class Fleet:
    """The cluster, the hosts, their workers and the producer of one run."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        tag = uuid.uuid4().hex[:4]
        self.hosts = [Host(i + 1, tag) for i in range(HOSTS)]
        self.server: pgserver.Server | None = None
        self.db: psycopg.Connection[Any] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.producer: subprocess.Popen[bytes] | None = None

    # -- set-up and tear-down --------------------------------------------------------------

    def start(self) -> None:
        for host in self.hosts:
            host.create()
        listen = ",".join([pgserver.HOST, *(h.server_addr for h in self.hosts)])
        self.server = pgserver.start_server(
            self.work_dir / "pgdata",
            fsync=False,
            ephemeral=True,
            database="fleet",
            settings={"listen_addresses": listen},
        )
        self.db = psycopg.connect(self.server.url, autocommit=True)
        hba = Path(self.q("hba_file")[0][0])
        with hba.open("a") as f:
            f.write("host all all 10.231.0.0/16 trust\n")
        self.q("reload")
        env = self.env(self.server.url, "root")
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"],
            env=env,
            cwd=REPO,
            check=True,
        )
        self.db.execute(statement("schema"))
        for host in self.hosts:
            url = f"postgresql://postgres@{host.server_addr}:{self.server.port}/fleet"
            argv = [sys.executable, "-m", "django", "awa_worker", "--processes", str(PROCESSES)]
            argv += ["--queue", "fleet"]
            with (self.work_dir / f"{host.name}.log").open("ab") as log:
                self.workers[host.name] = subprocess.Popen(
                    host.command(argv),
                    env=self.env(url, host.name),
                    cwd=REPO,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        _wait(
            "every worker process to register",
            lambda: self.q("runtimes")[0][0] >= HOSTS * PROCESSES,
            60,
        )

    def env(self, url: str, host: str) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": url,
            "AWA_FLEET_HOST": host,
            "DJANGO_SETTINGS_MODULE": "tests.fleet.settings",
            "PYTHONPATH": str(REPO),
        }

    def start_producer(self, seconds: float) -> None:
        assert self.server is not None
        argv = [sys.executable, "-m", "tests.fleet.producer", str(RATE), str(seconds)]
        argv.append(str(JOB_SECONDS))
        with (self.work_dir / "producer.log").open("ab") as log:
            self.producer = subprocess.Popen(
                argv,
                env=self.env(self.server.url, "root"),
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.heal()
        procs = [*self.workers.values(), *([self.producer] if self.producer else [])]
        for proc in procs:
            if proc.poll() is None:  # the supervisor passes SIGTERM on to its processes
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.db is not None:
            self.db.close()
        if self.server is not None:
            self.server.stop()
        for host in self.hosts:
            host.destroy()

    # -- reading the database ----------------------------------------------------------------

    def q(self, name: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        assert self.db is not None
        cursor = self.db.execute(statement(name), params)
        return cursor.fetchall() if cursor.description else []

    def now(self) -> datetime:
        value: datetime = self.q("now")[0][0]
        return value

    def host_of(self, addr: str | None) -> Host | None:
        return next((h for h in self.hosts if h.addr == addr), None)

    def leader(self) -> Host | None:
        rows = self.q("leader_addr")
        return self.host_of(rows[0][0]) if rows else None

    def stale_logged(self, host: Host) -> set[tuple[int, int]]:
        """(job, lease) of every finalization ``host``'s workers logged as stale."""
        text = (self.work_dir / f"{host.name}.log").read_text(errors="replace")
        return {(int(j), int(lease)) for j, lease in STALE_LINE.findall(text)}

    def rescues_after(self, since: datetime) -> dict[tuple[int, int], datetime]:
        return {(job, attempt): at for job, attempt, at in self.q("rescues") if at >= since}

    # -- the scenario ------------------------------------------------------------------------

    def cut(self, host: Host, report: Report, label: str, bound: float) -> None:
        """Cut ``host`` while jobs run on it; wait for their rescue; heal; wait for its late
        completions."""
        _wait(f"jobs running on {host.name}", lambda: self.q("running_on", [host.name]), 10)
        cut_at = self.now()
        host.cut()
        cut_off = self.q("running_on", [host.name])
        running = {(job, attempt) for job, _, attempt in cut_off}

        def rescued() -> dict[tuple[int, int], datetime] | None:
            found = self.rescues_after(cut_at)
            return found if running <= set(found) else None

        try:
            found = _wait(f"the rescue of {host.name}'s {len(running)} attempts", rescued, 30)
            delays = [(found[key] - cut_at).total_seconds() for key in running]
            report.figures[f"{label}: attempts cut off"] = len(running)
            report.figures[f"{label}: rescue delay (s)"] = (
                f"min {min(delays):.2f}, max {max(delays):.2f}, bound {bound:.1f}"
            )
            if max(delays) > bound:
                report.fail(f"{label}: a rescue took {max(delays):.2f} s > {bound:.1f} s")
        except TimeoutError as exc:
            report.fail(f"{label}: {exc}")
        if label.startswith("leader"):
            try:

                def other_leader() -> Host | None:
                    holder = self.leader()
                    return holder if holder is not host else None

                new = _wait(
                    "another host to take the maintenance lock", other_leader, LEADER_BOUND + 10
                )
                moved = (self.now() - cut_at).total_seconds()
                report.figures[f"{label}: leader moved (seen by)"] = (
                    f"{host.name} -> {new.name} in {moved:.2f} s (bound {LEADER_BOUND:.1f})"
                )
                if moved > LEADER_BOUND:
                    report.fail(f"{label}: the leader moved after {moved:.2f} s")
            except TimeoutError as exc:
                report.fail(f"{label}: {exc}")
        host.heal()
        healed = time.monotonic()
        try:
            _wait(
                f"{host.name}'s cut-off executions to end after the heal",
                lambda: (
                    not any(
                        (job, attempt) in running
                        for job, _, attempt in self.q("running_on", [host.name])
                    )
                ),
                30,
            )
            report.figures[f"{label}: late completions after heal (s)"] = round(
                time.monotonic() - healed, 2
            )
        except TimeoutError as exc:
            report.fail(f"{label}: {exc}")
        # Each late completion reaches the database and is refused: the host's worker logs it.
        expected = {(job, lease) for job, lease, _ in cut_off}
        try:
            _wait(
                f"{host.name} to log its late completions as stale",
                lambda: expected <= self.stale_logged(host),
                15,
            )
        except TimeoutError:
            missing = sorted(expected - self.stale_logged(host))
            report.fail(f"{label}: no stale finalization logged for (job, lease) {missing}")
        report.figures[f"{label}: late completions refused as stale"] = len(
            expected & self.stale_logged(host)
        )

    def check(self, report: Report) -> None:
        jobs = {job: (state, lease) for job, state, lease in self.q("jobs")}
        committed = [job for (job,) in self.q("committed")]
        execs = self.q("executions")
        rescues = collections.Counter((job, attempt) for job, attempt, _ in self.q("rescues"))
        report.figures["jobs committed"] = len(committed)
        for job in committed:
            if job not in jobs:
                report.fail(f"job {job} lost: not in awa.jobs")
            elif jobs[job][0] != "completed":
                report.fail(f"job {job} is {jobs[job][0]}, not completed")
        per_host: collections.Counter[str] = collections.Counter()
        wins: collections.Counter[int] = collections.Counter()
        extra = 0
        for job, lease, attempt, host, _, finished in execs:
            per_host[host] += 1
            final = jobs.get(job)
            if final is not None and lease == final[1] and finished is not None:
                wins[job] += 1
                continue
            extra += 1
            if not rescues[(job, attempt)]:
                report.fail(f"job {job} attempt {attempt} ran again on {host} without a rescue")
        for job in committed:
            if wins[job] != 1:
                report.fail(f"job {job}: {wins[job]} winning executions")
        report.figures["executions per host"] = dict(sorted(per_host.items()))
        report.figures["extra executions (all rescued)"] = extra
        report.figures["rescues"] = sum(rescues.values())
        report.figures["stale finalizations logged"] = {
            host.name: len(self.stale_logged(host)) for host in self.hosts
        }


def run(work_dir: Path | None = None) -> Report:
    """One whole run; raises RuntimeError when namespaces are unavailable."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    report = Report()
    own_dir = work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix="awa-fleet-")) if work_dir is None else work_dir
    report.figures["logs"] = str(work_dir)
    fleet = Fleet(work_dir)
    began = time.monotonic()
    try:
        fleet.start()
        report.figures["start-up (s)"] = round(time.monotonic() - began, 1)
        fleet.start_producer(STEADY_SECONDS + 30)
        # The steady load: as many executions as it starts in STEADY_SECONDS.
        _wait(
            "the steady load's executions",
            lambda: len(fleet.q("executions")) >= int(RATE * STEADY_SECONDS) or None,
            STEADY_SECONDS + 30,
            0.2,
        )
        steady = collections.Counter(host for _, _, _, host, _, _ in fleet.q("executions"))
        report.figures["steady: executions per host"] = dict(sorted(steady.items()))
        conns = dict(fleet.q("worker_hosts"))
        report.figures["connections per host now"] = {
            (h.name): conns.get(h.addr, 0) for h in fleet.hosts
        }
        even = sum(steady.values()) / HOSTS
        for host in fleet.hosts:
            if steady[host.name] < even / 2:
                report.fail(f"steady load: {host.name} ran {steady[host.name]}, even is {even:.0f}")
        budget = connection_budget(PROCESSES, settings.CONCURRENCY)
        report.figures["connection budget per host"] = (
            f"{PROCESSES} x ({settings.CONCURRENCY} + {own_connections()}) = {budget}"
        )
        for host in fleet.hosts:
            if conns.get(host.addr, 0) > budget:
                report.fail(f"{host.name} holds {conns[host.addr]} connections > {budget}")
        leader = _wait("a maintenance leader", fleet.leader, 10)
        other = next(h for h in fleet.hosts if h is not leader)
        fleet.cut(other, report, "non-leader cut", RESCUE_BOUND)
        leader = _wait("a maintenance leader", fleet.leader, 10)
        fleet.cut(leader, report, "leader cut", LEADER_BOUND)
        assert fleet.producer is not None
        if fleet.producer.poll() is None:
            os.killpg(fleet.producer.pid, signal.SIGTERM)
        fleet.producer.wait(timeout=15)
        _wait("every committed job to end", lambda: fleet.q("unfinished")[0][0] == 0, 60, 0.2)
        fleet.check(report)
    except Exception as exc:
        report.fail(f"{type(exc).__name__}: {exc}")
    finally:
        fleet.stop()
        report.figures["total (s)"] = round(time.monotonic() - began, 1)
    if own_dir and not report.violations:
        with contextlib.suppress(OSError):
            for path in work_dir.iterdir():
                if path.is_file():
                    path.unlink()
            work_dir.rmdir()
    return report


def main() -> int:
    reason = unavailable()
    if reason:
        print(f"SKIP fleet: {reason}")
        return 0
    report = run(Path(tempfile.mkdtemp(prefix="awa-fleet-")))
    print(report.show())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
