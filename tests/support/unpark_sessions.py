"""Claimer sessions and observers for the tests of how jobs parked by their kind come back
(docs/flow.md, "Per kind"; ``awa._flow_unpark_v2``): each ``Claimer`` is a psycopg session that
calls ``awa.claim_v3`` and keeps the permits of the jobs it claimed, as a worker does, passing
them as ``p_held``. The fixtures ``claimers``, ``observer`` (one connection per test for the
reads) and ``upk_tables`` (the runs table of tests/jobs/kind_unpark.py's handlers) are loaded as
a plugin by tests/conftest.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

from awa_django.operator import (
    set_kind_limits,
    set_queue_limits,
)
from tests.support.database import conninfo, pg
from tests.support.factories import WORKER, enqueue_sql

__all__ = [
    "CLAIM",
    "HEAVY",
    "LIGHT",
    "OTHER",
    "Q2",
    "WQ",
    "Claimer",
    "Q",
    "claimers",
    "ended",
    "enqueue",
    "fill_and_park",
    "flag",
    "kind_limit",
    "kind_permits",
    "observer",
    "observer_conns",
    "parked",
    "permits_held",
    "queue_limit",
    "queue_permits",
    "started",
    "states",
    "upk_tables",
    "wjob",
    "worker",
    "wparked",
]

Q = "upk"


Q2 = "upk2"


HEAVY = "upk.heavy"


LIGHT = "upk.light"


OTHER = "upk.other"


CLAIM = (
    "SELECT job_id, weight, permits, serial_lock, kind, run_lease, claim_slot, timeout_secs"
    " FROM awa.claim_v3(%s, %s, %s, p_max_weight => %s, p_held => %s, p_release => %s,"
    " p_serial_held => %s, p_serial_release => %s)"
)


def enqueue(
    kind: str,
    *,
    queue: str = Q,
    weight: int = 1,
    priority: int = 0,
    serial: str | None = None,
    n: int = 1,
) -> list[int]:
    """``n`` jobs of ``kind`` through the raw-SQL producer, committed; their ids."""
    metadata: dict[str, Any] = {"awa:weight": weight}
    if serial is not None:
        metadata["awa:serial"] = serial
    body = {"kind": kind, "queue": queue, "priority": priority, "metadata": metadata}
    with pg() as conn:
        return [job_id for job_id, _ in enqueue_sql(conn, json.dumps([body] * n))]


def kind_limit(kind: str, **limits: Any) -> None:
    set_kind_limits(kind, actor="upk-test", **limits)


def queue_limit(queue: str, **limits: Any) -> None:
    set_queue_limits(queue, actor="upk-test", **limits)


class Claimer:
    """A worker-like session: claims with ``awa.claim_v3``, keeps the permits and serial locks
    of the jobs it claimed (``p_held``/``p_serial_held``) until :meth:`finish` hands them back
    with its next claim (``p_release``/``p_serial_release``)."""

    def __init__(self, wcap: int | None) -> None:
        self.conn = psycopg.connect(conninfo(), autocommit=True)
        self.wcap = wcap
        self.held: dict[int, tuple[list[int], int | None, int, int, int]] = {}
        self.release: list[int] = []
        self.serial_release: list[int] = []
        self.last_marker: tuple[Any, ...] | None = None

    def units(self) -> int:
        return sum(h[2] for h in self.held.values())

    def claim(self, p_max: int | None, queue: str = Q) -> list[int]:
        held = [k for h in self.held.values() for k in h[0]]
        sheld = [h[1] for h in self.held.values() if h[1] is not None]
        rows = self.conn.execute(
            CLAIM,
            [
                queue,
                p_max,
                WORKER,
                self.wcap,
                held,
                self.release,
                sheld,
                self.serial_release,
            ],
        ).fetchall()
        self.release, self.serial_release = [], []
        got = []
        self.last_marker = None
        for job_id, weight, permits, serial_lock, _kind, lease, slot, _t in rows:
            if job_id is None:
                self.last_marker = rows[-1]
                continue
            assert job_id not in self.held, f"job {job_id} claimed twice by one session"
            self.held[job_id] = (list(permits or []), serial_lock, weight, lease, slot)
            got.append(job_id)
        return got

    def finish(self, job_ids: Sequence[int]) -> None:
        """Complete ``job_ids``; their permits and keys go back with the next claim."""
        items = []
        for job_id in job_ids:
            permits, serial_lock, _w, lease, slot = self.held.pop(job_id)
            self.release += permits
            if serial_lock is not None:
                self.serial_release.append(serial_lock)
            items.append(
                {"id": job_id, "lease": lease, "slot": slot, "outcome": "completed", "result": None}
            )
        stale = self.conn.execute(
            "SELECT * FROM awa.finalize_v2(%s::jsonb)", [json.dumps(items)]
        ).fetchall()
        assert stale == [], f"completions refused as stale: {stale}"

    def hand_back(self, job_ids: Sequence[int]) -> None:
        """Complete ``job_ids`` and hand their permits back at once (a claim of 0)."""
        self.finish(job_ids)
        self.claim(0)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def claimers() -> Iterator[Any]:
    made: list[Claimer] = []

    def make(wcap: int | None = 8) -> Claimer:
        made.append(Claimer(wcap))
        return made[-1]

    yield make
    for c in made:
        c.close()


observer_conns: list[psycopg.Connection[Any]] = []


@pytest.fixture
def observer() -> Iterator[None]:
    """One connection per test for the reads below (opening one per read is slow)."""
    with pg() as conn:
        observer_conns.append(conn)
        yield
        observer_conns.clear()


def parked(queue: str | None = None) -> list[int]:
    """Ids of the jobs in awa.flow_waiting (of ``queue``), oldest first."""
    sql = "SELECT job_id FROM awa.flow_waiting"
    params: list[Any] = []
    if queue is not None:
        sql += " WHERE queue = %s"
        params.append(queue)
    rows = observer_conns[0].execute(sql + " ORDER BY job_id", params).fetchall()
    return [r[0] for r in rows]


def permits_held(keys_sql: str, name: str, n: int) -> int:
    row = (
        observer_conns[0]
        .execute(
            "SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
            " AND l.objsubid = 2 AND l.classid = 4282182 AND l.objid IN ("
            f" SELECT (({keys_sql}(%s, i))::bigint & 4294967295)::oid"
            " FROM generate_series(0, %s - 1) i)",
            [name, n],
        )
        .fetchone()
    )
    assert row is not None
    return int(row[0])


def kind_permits(kind: str, n: int = 64) -> int:
    """Permits of ``kind`` (0 .. n-1) held by any session now."""
    return permits_held("awa._flow_kind_key_v1", kind, n)


def queue_permits(queue: str, n: int = 64) -> int:
    """Permits of ``queue`` (0 .. n-1) held by any session now."""
    return permits_held("awa._flow_key_v1", queue, n)


def states(job_ids: Sequence[int]) -> dict[int, str]:
    rows = (
        observer_conns[0]
        .execute("SELECT id, state::text FROM awa.jobs WHERE id = ANY(%s)", [list(job_ids)])
        .fetchall()
    )
    return {r[0]: r[1] for r in rows}


def fill_and_park(
    claimers: Any, limit: int, weight: int
) -> tuple[Claimer, Claimer, list[int], int]:
    """``limit`` light jobs of HEAVY running on ``a`` (every permit of the kind), then one of
    ``weight`` parked by ``b``."""
    a, b = claimers(8), claimers(8)
    light = enqueue(HEAVY, n=limit)
    assert a.claim(8) == light
    [h] = enqueue(HEAVY, weight=weight)
    assert b.claim(8) == [] and parked() == [h]
    return a, b, light, h


WQ = "upkw"


@pytest.fixture
def upk_tables() -> Iterator[None]:
    with pg() as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS upk_runs (job_id bigint, kind text, attempt int,"
            " pid int, started timestamptz, ended timestamptz)"
        )
        conn.execute("CREATE TABLE IF NOT EXISTS upk_flags (name text PRIMARY KEY)")
        conn.execute("TRUNCATE upk_runs, upk_flags")
    yield
    with pg() as conn:
        conn.execute("DROP TABLE IF EXISTS upk_runs, upk_flags")


def worker(manage_py: Any, *args: str, **overrides: Any) -> Any:
    from tests.jobs import kind_unpark, worker_env

    env = worker_env(kind_unpark, **overrides)
    return manage_py("awa_worker", "--queue", WQ, *args, extra_env=env)


def wjob(kind: str, weight: int = 1, block: str | None = None, priority: int = 0) -> int:
    body: dict[str, Any] = {
        "kind": kind,
        "queue": WQ,
        "priority": priority,
        "args": {"args": [], "kwargs": {"block": block} if block else {}},
        "metadata": {"awa:weight": weight},
    }
    with pg() as conn:
        [(job_id, _)] = enqueue_sql(conn, json.dumps([body]))
    return job_id


def ended(job_ids: Sequence[int]) -> bool:
    rows = (
        observer_conns[0]
        .execute(
            "SELECT count(*) FROM upk_runs WHERE job_id = ANY(%s) AND ended IS NOT NULL",
            [list(job_ids)],
        )
        .fetchone()
    )
    return rows is not None and rows[0] == len(job_ids)


def wparked() -> list[int]:
    return parked(WQ)


def flag(name: str) -> None:
    observer_conns[0].execute("INSERT INTO upk_flags VALUES (%s) ON CONFLICT DO NOTHING", [name])


def started(job_id: int) -> bool:
    row = observer_conns[0].execute("SELECT count(*) FROM upk_runs WHERE job_id = %s", [job_id])
    one = row.fetchone()
    return one is not None and one[0] > 0
