"""Health checks for liveness and readiness probes: ``manage.py awa_health`` and the health view
(``awa_django.urls``) both call :func:`check_health`.

Three checks, each one cheap statement on small control tables (never a scan of the rings or of
history), run in one short transaction with a 5 s statement timeout and a 1 s lock timeout, on
a connection of the probe's own (unless the caller is inside a transaction: then on its
connection) that gives up connecting after 5 s and the whole probe after 10 s, also against a
server that accepts connections and never answers:

* ``worker``: a worker process registered from ``host`` (this host by default) was seen within
  ``stale_after`` seconds. Workers refresh their row in ``awa.runtime_instances`` every
  ``RUNTIME_REFRESH_INTERVAL`` from the same event loop that runs their jobs, so a process
  that died, froze (SIGSTOP) or whose loop is blocked stops being seen.
* ``leader``: a session holds the maintenance leader's lock on this database, and the process
  marked as leader was seen within ``stale_after`` seconds (a frozen leader's lock lives on
  with its connection until another process takes over).
* ``lag``: no queue's lag (the age of its oldest waiting job, ``awa.queue_lag_v1``) passes its
  threshold. Paused queues are left out: their jobs wait on purpose.

Guarantees: :func:`check_health` never raises for an unhealthy system or an unreachable
database (a ``database`` check fails instead, saying why); it writes nothing; thresholds are checked
before anything is sent (``InvalidOptionError``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from awa_django.conf import get_awa_settings
from awa_django.db.connection import connection_kwargs
from awa_django.exceptions import InvalidOptionError
from awa_django.limits import QUEUE_NAME_RE
from awa_django.sql import query

#: Seconds a probe waits for a connection, and for the whole probe (connection included).
CONNECT_TIMEOUT = 5
PROBE_DEADLINE = 10.0
#: The largest ``stale_after`` accepted: about a hundred years.
MAX_STALE_AFTER = 3.2e9

__all__ = [
    "HealthCheck",
    "HealthReport",
    "LagThresholds",
    "check_health",
    "default_stale_after",
    "parse_lag_thresholds",
]


@dataclasses.dataclass(frozen=True, slots=True)
class HealthCheck:
    """One check: its ``name`` (``database``, ``worker``, ``leader``, ``lag``), whether it
    passed, and one line saying what was found."""

    name: str
    ok: bool
    detail: str


@dataclasses.dataclass(frozen=True, slots=True)
class HealthReport:
    """The checks that ran, in order. ``ok`` when every one passed."""

    checks: tuple[HealthCheck, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def summary(self) -> str:
        """One line: ``ok: ...`` with every check's detail, or ``unhealthy: ...`` with the
        details of the failing ones only."""
        if self.ok:
            return "ok: " + "; ".join(check.detail for check in self.checks)
        return "unhealthy: " + "; ".join(check.detail for check in self.checks if not check.ok)

    def as_dict(self) -> dict[str, Any]:
        """``{"status": "ok" | "unhealthy", "checks": {name: {"ok", "detail"}}}``."""
        return {
            "status": "ok" if self.ok else "unhealthy",
            "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in self.checks},
        }


@dataclasses.dataclass(frozen=True, slots=True)
class LagThresholds:
    """Lag thresholds in seconds: ``default`` for every queue (None: only the named ones are
    checked), ``per_queue`` for some."""

    default: float | None = None
    per_queue: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.default is not None or bool(self.per_queue)

    def limit(self, queue: str) -> float | None:
        return self.per_queue.get(queue, self.default)


def parse_lag_thresholds(values: Iterable[str]) -> LagThresholds:
    """``["60", "emails=300"]`` → 60 s for every queue, 300 s for ``emails``.

    Each value is ``SECONDS`` or ``QUEUE=SECONDS``, seconds a finite number above 0; raises
    ``InvalidOptionError`` naming the bad value.
    """
    default: float | None = None
    per_queue: dict[str, float] = {}
    for raw in values:
        text = str(raw).strip()
        queue, sep, number = text.rpartition("=")
        if sep and QUEUE_NAME_RE.fullmatch(queue) is None:
            raise InvalidOptionError(
                "max_lag", f"{text[:80]!r}: {queue[:70]!r} is not a valid queue name"
            )
        try:
            seconds = float(number)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds <= 0:
            raise InvalidOptionError(
                "max_lag", f"{text[:80]!r} is not SECONDS or QUEUE=SECONDS (seconds above 0)"
            )
        if sep:
            per_queue[queue] = seconds
        else:
            default = seconds
    return LagThresholds(default, per_queue)


def default_stale_after() -> float:
    """How long a worker or leader may go unseen: ``max(HEARTBEAT_STALENESS, 3 *
    RUNTIME_REFRESH_INTERVAL)``, the bound after which maintenance itself gives up on a
    leader (awa_django/maintenance/leader.py)."""
    awa = get_awa_settings()
    return max(float(awa.HEARTBEAT_STALENESS), 3 * float(awa.RUNTIME_REFRESH_INTERVAL))


def check_health(
    *,
    worker: bool = True,
    host: str | None = None,
    leader: bool = True,
    max_lag: LagThresholds | None = None,
    stale_after: float | None = None,
    using: str | None = None,
) -> HealthReport:
    """Run the checks asked for; see the module docstring. ``host`` defaults to this machine's
    host name (what workers register, ``socket.gethostname()``); ``stale_after`` to
    :func:`default_stale_after`; ``using`` to ``AWA["DATABASE_ALIAS"]``."""
    if stale_after is None:
        stale_after = default_stale_after()
    elif (
        isinstance(stale_after, bool)
        or not isinstance(stale_after, int | float)
        or not math.isfinite(stale_after)
        or stale_after <= 0
        or stale_after > MAX_STALE_AFTER
    ):
        raise InvalidOptionError(
            "stale_after",
            f"must be seconds above 0 and at most {MAX_STALE_AFTER:g}, got {stale_after!r}",
        )
    host = socket.gethostname() if host is None else host
    alias = using or get_awa_settings().DATABASE_ALIAS
    checks: list[HealthCheck] = []
    try:
        if connections[alias].in_atomic_block:
            # Inside a caller's transaction: its connection, its view of the data, and its
            # settings left alone (SET LOCAL would outlive the checks).
            with connections[alias].cursor() as cursor:
                _run_checks(cursor, checks, worker, host, leader, max_lag, stale_after)
        else:
            with _bounded_connection(alias) as conn, conn.cursor() as cursor:
                cursor.execute(query("health_session"))
                _run_checks(cursor, checks, worker, host, leader, max_lag, stale_after)
    except (DatabaseError, psycopg.Error) as exc:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        return HealthReport((HealthCheck("database", False, f"database error: {first}"),))
    if not checks:
        checks.append(HealthCheck("database", True, "database reachable"))
    return HealthReport(tuple(checks))


def _run_checks(
    cursor: Any,
    checks: list[HealthCheck],
    worker: bool,
    host: str,
    leader: bool,
    max_lag: LagThresholds | None,
    stale_after: float,
) -> None:
    if not (worker or leader or max_lag):
        cursor.execute(query("health_schema"))
        row = cursor.fetchone()
        if not (row and row[0]):
            checks.append(
                HealthCheck(
                    "database", False, "the awa schema is not installed (run manage.py migrate)"
                )
            )
        return
    if worker:
        cursor.execute(query("health_workers"), {"host": host, "stale": stale_after})
        checks.append(_worker_check(cursor.fetchone(), host, stale_after))
    if leader:
        cursor.execute(query("health_leader"))
        checks.append(_leader_check(cursor.fetchone(), stale_after))
    if max_lag:
        cursor.execute(query("queue_lag"))
        checks.append(_lag_check(cursor.fetchall(), max_lag))


@contextlib.contextmanager
def _bounded_connection(alias: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection of its own for one probe, which never hangs: connecting gives up after
    :data:`CONNECT_TIMEOUT` seconds, and the whole probe after :data:`PROBE_DEADLINE` (a server
    that accepts connections but never answers, frozen or behind a stuck proxy, never applies
    its own statement_timeout: the socket is shut down under the waiting read instead). Its
    one transaction is rolled back: nothing is written."""
    kwargs = connection_kwargs(alias, application_name="awa:health")
    kwargs["connect_timeout"] = CONNECT_TIMEOUT
    kwargs.pop("isolation_level", None)
    conn = psycopg.connect(**kwargs)
    timer = threading.Timer(PROBE_DEADLINE, _cut, [conn])
    timer.daemon = True
    timer.start()
    try:
        yield conn
    finally:
        timer.cancel()
        with contextlib.suppress(Exception):
            conn.rollback()
        conn.close()


def _cut(conn: psycopg.Connection[Any]) -> None:
    """Shut the probe's socket down: a read waiting on it ends with an error at once."""
    with contextlib.suppress(OSError, psycopg.Error):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{max(seconds, 0.0):.1f} s ago"


def _worker_check(row: Any, host: str, stale_after: float) -> HealthCheck:
    registered, live, seen_ago = row if row else (0, 0, None)
    if live:
        return HealthCheck(
            "worker", True, f"{live} worker(s) on host {host} seen, last {_ago(seen_ago)}"
        )
    if not registered:
        return HealthCheck("worker", False, f"no worker registered on host {host}")
    return HealthCheck(
        "worker",
        False,
        f"no worker on host {host} seen in the last {stale_after:g} s (last seen {_ago(seen_ago)})",
    )


def _leader_check(row: Any, stale_after: float) -> HealthCheck:
    held, instance, seen_ago = row if row else (False, None, None)
    if not held:
        return HealthCheck("leader", False, "no leader (no process holds the maintenance lock)")
    if instance is None or seen_ago is None or seen_ago > stale_after:
        return HealthCheck(
            "leader",
            False,
            f"the leader lock is held, but the leader {instance or '(unknown)'} has not been "
            f"seen in the last {stale_after:g} s (last seen {_ago(seen_ago)})",
        )
    return HealthCheck("leader", True, f"leader {instance} seen {_ago(seen_ago)}")


def _lag_check(rows: list[Any], thresholds: LagThresholds) -> HealthCheck:
    over: list[str] = []
    worst: tuple[float, str] | None = None
    for queue, _available, lag, paused in rows:
        limit = thresholds.limit(queue)
        if limit is None or paused or lag is None:
            continue
        if worst is None or lag > worst[0]:
            worst = (float(lag), queue)
        if lag > limit:
            over.append(f"{queue} {lag:.1f} s > {limit:g} s")
    if over:
        return HealthCheck("lag", False, "queue lag over the limit: " + ", ".join(over))
    if worst is None:
        return HealthCheck("lag", True, "no queue is waiting")
    return HealthCheck("lag", True, f"lag within limits (highest: {worst[1]} {worst[0]:.1f} s)")
