"""Runs of the kinds of tests/jobs/kind_limit_fast_path.py, for the tests of the claim's fast
path for limited kinds (docs/flow.md, "Per kind"): handlers record their runs with the database
clock in ``fa3_runs``, and the checks are computed from those intervals (a handler's run lies
inside the time its permits and keys are held, so two runs that overlap held their permits at
the same time); raw ``awa.claim_v3`` sessions for the fuzz and the hammer.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import awa_django
from awa_django.operator import clear_kind_limits, set_kind_limits
from tests.jobs import kind_limit_fast_path, worker_env
from tests.jobs.kind_limit_fast_path import FA3_TABLES
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

__all__ = [
    "EPOCH",
    "GRACE",
    "KIND_PERMIT_CLASS",
    "RATES",
    "Run",
    "Session",
    "assert_once",
    "claim_calls",
    "clean_logs",
    "count_done",
    "db_now",
    "fuzz",
    "fuzz_with",
    "held_flow_locks",
    "interrupter",
    "peak_overlap",
    "rate_spans",
    "recorded_runs",
    "running_of",
    "serial_order",
    "set_limit",
    "signal_holder",
    "sound_window_violations",
    "start_workers",
    "started_since",
    "stop_workers",
    "tables",
    "wait_done",
]

assert kind_limit_fast_path  # registers the kinds in this process too (enqueue by name)


Run = dict[str, Any]


EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


#: How long after a limit change a claim may still have started under the old one.
GRACE = timedelta(seconds=0.3)


def tables() -> None:
    with pg() as c:
        c.execute(FA3_TABLES)


def start_workers(
    manage_py: Callable[..., ManagedProcess],
    n: int,
    *,
    concurrency: int,
    queues: Sequence[str] = ("fa3",),
    overrides: dict[str, Any] | None = None,
) -> list[ManagedProcess]:
    env = worker_env(kind_limit_fast_path, **(overrides or {}))
    args = ["awa_worker", "--concurrency", str(concurrency)]
    for q in queues:
        args += ["--queue", q]
    return [manage_py(*args, extra_env=env) for _ in range(n)]


def recorded_runs() -> list[Run]:
    with pg() as c:
        cur = c.execute(
            "SELECT job_id, kind, queue, attempt, pid, started, ended FROM fa3_runs ORDER BY id"
        )
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def count_done(ids: Iterable[int]) -> int:
    with pg() as c:
        row = c.execute(
            "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state = 'completed'", [list(ids)]
        ).fetchone()
        return int(row[0]) if row else 0


def wait_done(ids: list[int], workers: list[ManagedProcess], timeout: float = 40.0) -> None:
    def message() -> str:
        with pg() as c:
            states = c.execute(
                "SELECT state, count(*) FROM awa.jobs WHERE id = ANY(%s) GROUP BY 1", [ids]
            ).fetchall()
            parked = c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()
            sparked = c.execute("SELECT count(*) FROM awa.serial_waiting").fetchone()
        logs = "\n---\n".join(w.output()[-3000:] for w in workers)
        return (
            f"{len(ids)} jobs completed (states {states}, flow_waiting {parked}, "
            f"serial_waiting {sparked}); logs:\n{logs}"
        )

    wait_for(lambda: count_done(ids) == len(ids), timeout=timeout, interval=0.1, message=message)


def peak_overlap(
    runs: Iterable[Run], units: Callable[[Run], int], *, end_default: datetime | None = None
) -> tuple[int, str]:
    """The most units running at once over ``runs`` (ends before starts at the same time)."""
    events: list[tuple[datetime, int, int, str]] = []
    for r in runs:
        end = r["ended"] or end_default
        assert end is not None, f"run without an end: {r}"
        u = units(r)
        events.append((r["started"], 1, u, f"job {r['job_id']} +{u}"))
        events.append((end, 0, -u, ""))
    events.sort(key=lambda e: (e[0], e[1]))
    cur = peak = 0
    where = ""
    for when, _, du, label in events:
        cur += du
        if cur > peak:
            peak, where = cur, f"{label} at {when.isoformat()}"
    return peak, where


def assert_once(runs: list[Run], ids: list[int]) -> None:
    """Every job ran exactly once, as its first attempt."""
    by_job: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        by_job[r["job_id"]].append(r)
    missing = [i for i in ids if i not in by_job]
    twice = {j: [(r["attempt"], r["pid"]) for r in rs] for j, rs in by_job.items() if len(rs) > 1}
    retried = [j for j, rs in by_job.items() if rs[0]["attempt"] != 1]
    assert not missing and not twice and not retried, (missing, twice, retried)


def clean_logs(workers: list[ManagedProcess]) -> None:
    for w in workers:
        out = w.output()
        assert "Traceback" not in out and "ERROR" not in out, out[-5000:]


def stop_workers(workers: list[ManagedProcess]) -> None:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        w.wait(30)


def serial_order(runs: list[Run], keys: dict[int, str]) -> list[str]:
    """Violations of one-at-a-time and enqueue order among first attempts of each key."""
    by_key: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        if r["job_id"] in keys:
            by_key[keys[r["job_id"]]].append(r)
    bad = []
    for key, rs in by_key.items():
        rs.sort(key=lambda r: r["started"])
        for a, b in itertools.pairwise(rs):
            if b["job_id"] < a["job_id"] and a["attempt"] == 1 and b["attempt"] == 1:
                bad.append(f"{key}: job {b['job_id']} ran after younger job {a['job_id']}")
            if a["ended"] is None or b["started"] < a["ended"]:
                bad.append(f"{key}: job {b['job_id']} started while job {a['job_id']} ran")
    return bad


KIND_PERMIT_CLASS = 4282182


class Session:
    """A claim connection that behaves like a worker's: it holds the permits and run locks of
    the jobs it claimed until it hands them back with a later claim."""

    def __init__(self, slots: int) -> None:
        import psycopg

        from tests.support.database import conninfo

        self.conn = psycopg.connect(conninfo(), autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.slots = slots
        self.running: dict[int, dict[str, Any]] = {}
        self.overdrawn = False

    def units(self) -> int:
        return sum(j["weight"] for j in self.running.values())

    def claim(self, queue: str, release: Sequence[int]) -> list[dict[str, Any]]:
        gone = [self.running.pop(j) for j in release]
        held = [k for j in self.running.values() for k in j["permits"]]
        sheld = [j["serial_lock"] for j in self.running.values() if j["serial_lock"] is not None]
        rows = self.conn.execute(
            "SELECT job_id, kind, weight, permits, serial_lock, metadata ->> 'awa:serial',"
            " clock_timestamp() FROM awa.claim_v3(%s, %s, p_max_weight => %s, p_held => %s,"
            " p_release => %s, p_serial_held => %s, p_serial_release => %s)",
            [
                queue,
                self.slots - self.units(),
                self.slots,
                held,
                [k for j in gone for k in j["permits"]],
                sheld,
                [j["serial_lock"] for j in gone if j["serial_lock"] is not None],
            ],
        ).fetchall()
        new = []
        self.overdrawn = sum(r[2] for r in rows if r[0] is not None) > self.slots - self.units()
        for job_id, kind, w, permits, slock, key, at in rows:
            if job_id is None:
                continue
            entry = {
                "job_id": job_id,
                "kind": kind,
                "weight": w,
                "permits": list(permits or []),
                "serial_lock": slock,
                "key": key,
                "at": at,
            }
            self.running[job_id] = entry
            new.append(entry)
        return new


def set_limit(kind: str, limit: int | None) -> None:
    if limit is None:
        clear_kind_limits(kind, actor="fa3")
    else:
        set_kind_limits(kind, global_concurrency=limit, actor="fa3")


RATES = {"fa3.rated": (20.0, 4), "fa3.both": (30.0, 3)}


def fuzz(
    seed: int, steps: int, slots: Sequence[int], weights: Sequence[int], qlimit: int | None
) -> None:
    import random

    from awa_django.operator import set_queue_limits

    rnd = random.Random(seed)
    kinds = {"fa3.k1": 1, "fa3.k2": 2, "fa3.k3": 3, "fa3.k5": 5, "fa3.both": 2}
    limits: dict[str, int | None] = dict(kinds)
    for kind, limit in kinds.items():
        if kind not in RATES:
            set_limit(kind, limit)
    set_kind_limits("fa3.rated", rate_limit=20.0, rate_burst=4, actor="fa3")
    set_kind_limits("fa3.both", global_concurrency=2, rate_limit=30.0, rate_burst=3, actor="fa3")
    sessions = [Session(rnd.choice(slots)) for _ in range(3)]
    queue = "fa3" if qlimit is None else "fa3ql"
    if qlimit is not None:
        set_queue_limits(queue, global_concurrency=qlimit, actor="fa3")
    try:
        fuzz_with(rnd, kinds, limits, sessions, steps, weights, queue, qlimit)
    finally:
        for s in sessions:
            s.conn.close()


def fuzz_with(
    rnd: Any,
    kinds: dict[str, int],
    limits: dict[str, int | None],
    sessions: list[Session],
    steps: int,
    weights: Sequence[int],
    queue: str,
    qlimit: int | None,
) -> None:
    import time

    observer = sessions[0].conn  # reads pg_locks only: takes nothing
    # Each permit key's owner and number: (queue or kind, i) for i below 64.
    key_of: dict[int, tuple[str, int]] = {}
    for owner, fn in [(queue, "awa._flow_key_v1")] + [
        (kind, "awa._flow_kind_key_v1") for kind in [*kinds, "fa3.rated"]
    ]:
        for key, i in observer.execute(
            f"SELECT {fn}(%s, i), i FROM generate_series(0, 63) AS i", [owner]
        ).fetchall():
            key_of[key] = (owner, i)
    enqueued: list[int] = []
    serial_of: dict[int, str] = {}
    weight_of: dict[int, int] = {}
    claimed: dict[int, int] = {}
    claim_at: dict[int, float] = {}
    first_claim_order: dict[str, list[int]] = defaultdict(list)
    problems: list[str] = []

    def enqueue_some(n: int) -> None:
        requests = []
        raw = []
        req_w: list[int] = []
        raw_w: list[int] = []
        for _ in range(n):
            kind = rnd.choice([*kinds, "fa3.rated", "fa3.free", "fa3.free", "fa3.free2"])
            w = rnd.choice(weights)
            key = rnd.choice([None, None, None, "a", "b", "c"])
            if rnd.random() < 0.25:
                bad_w = rnd.choice([w, "3", 2.5, 0, -1, 10001])
                meta: dict[str, Any] = {"awa:weight": bad_w}
                if key is not None:
                    meta["awa:serial"] = key
                raw_w.append(bad_w if type(bad_w) is int and 1 <= bad_w <= 10000 else 1)
                raw.append(
                    {
                        "kind": kind,
                        "queue": queue,
                        "priority": rnd.choice([0, 7]),
                        "args": {"args": [], "kwargs": {}},
                        "metadata": meta,
                    }
                )
            else:
                opts: dict[str, Any] = {
                    "weight": w,
                    "priority": rnd.choice([0, 0, 5, 20]),
                    "queue": queue,
                }
                if key is not None:
                    opts["serial_key"] = key
                requests.append((awa_django.get_job(kind).using(**opts).prepare(), key))
                req_w.append(w)
        if requests:
            for job, (_, key) in zip(
                awa_django.enqueue_many([r for r, _ in requests]), requests, strict=True
            ):
                enqueued.append(job.id)
                weight_of[job.id] = req_w.pop(0)
                if key is not None:
                    serial_of[job.id] = key
        if raw:
            with pg() as c:
                rows = c.execute(
                    "SELECT job_id FROM awa.enqueue_v1(%s::jsonb)", [json.dumps(raw)]
                ).fetchall()
            for (job_id,), spec in zip(rows, raw, strict=True):
                enqueued.append(job_id)
                weight_of[job_id] = raw_w.pop(0)
                if "awa:serial" in spec["metadata"]:
                    serial_of[job_id] = spec["metadata"]["awa:serial"]

    def check(step: str, session: Session, new: list[dict[str, Any]]) -> None:
        if session.overdrawn:
            problems.append(f"{step}: a claim of {session.slots} slots took {new}: over p_max")
        for j in new:
            want_w = min(weight_of[j["job_id"]], session.slots, qlimit or 10000)
            if j["weight"] != want_w:
                problems.append(f"{step}: job {j['job_id']} counts {j['weight']}, not {want_w}")
            claim_at[j["job_id"]] = j["at"].timestamp()
            claimed[j["job_id"]] = claimed.get(j["job_id"], 0) + 1
            if claimed[j["job_id"]] > 1:
                problems.append(f"{step}: job {j['job_id']} claimed twice")
            limit = limits.get(j["kind"])
            # A job counts min(weight, limits) units; one heavier than a limit also holds the
            # permits above it up to its weight (as the claiming session counts it), but only
            # those no other job holds.
            true_w = min(weight_of[j["job_id"]], session.slots)
            owners = [key_of.get(k, ("?", 0))[0] for k in j["permits"]]
            j["qunits"] = owners.count(queue)
            j["kunits"] = owners.count(j["kind"])
            wants = []
            if qlimit:
                wants.append(("queue", j["qunits"], min(true_w, qlimit), true_w))
            wants.append(
                (
                    "kind",
                    j["kunits"],
                    min(j["weight"], limit) if limit else 0,
                    true_w if limit else 0,
                )
            )
            if len(j["permits"]) != j["qunits"] + j["kunits"]:
                problems.append(f"{step}: job {j['job_id']} carries foreign permits {owners}")
            for what, got, low, high in wants:
                if not low <= got <= max(low, high):
                    problems.append(
                        f"{step}: job {j['job_id']} ({j['kind']}, weight {j['weight']}, limit "
                        f"{limit}) carries {got} {what} permits, not {low}..{high}"
                    )
            if j["key"] is not None:
                first_claim_order[j["key"]].append(j["job_id"])
                others = [
                    o["job_id"]
                    for s in sessions
                    for o in s.running.values()
                    if o["key"] == j["key"] and o["job_id"] != j["job_id"]
                ]
                if others:
                    problems.append(f"{step}: key {j['key']} job {j['job_id']} beside {others}")
        for kind in {j["kind"] for j in new}:
            limit = limits.get(kind)
            if limit is None:
                continue
            held = [o["kunits"] for s in sessions for o in s.running.values() if o["kind"] == kind]
            # Past the limit only by a job heavier than it (which then runs alone).
            if sum(held) > max(limit, *held):
                problems.append(f"{step}: {kind} runs {held} units, limit {limit}")
        if qlimit is not None and new:
            held = [o["qunits"] for s in sessions for o in s.running.values()]
            if sum(held) > max(qlimit, *held):
                problems.append(f"{step}: queue runs {held} units, limit {qlimit}")
        all_keys = [k for s in sessions for o in s.running.values() for k in o["permits"]]
        if len(all_keys) != len(set(all_keys)):
            problems.append(f"{step}: a permit key is carried by two running jobs")
        counts: dict[int, int] = dict(
            observer.execute(
                "SELECT pid, count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND classid = %s AND granted GROUP BY pid",
                [KIND_PERMIT_CLASS],
            ).fetchall()
        )
        for s in sessions:
            held = counts.get(s.pid, 0)
            carried = sum(len(o["permits"]) for o in s.running.values())
            if held != carried:
                problems.append(f"{step}: session {s.pid} holds {held} permits, carries {carried}")

    enqueue_some(60)
    for step in range(steps):
        if rnd.random() < 0.15:
            enqueue_some(rnd.randint(1, 15))
        if rnd.random() < 0.08:
            kind = rnd.choice(["fa3.k3", "fa3.k2", "fa3.k5"])
            value = rnd.choice([1, 2, 4, 6, None])
            set_limit(kind, value)
            limits[kind] = value if value is not None else kinds[kind]
        if rnd.random() < 0.05:
            with pg() as c:
                c.execute("SELECT awa.rotate_v3('claim', 0)")
        s = rnd.choice(sessions)
        release = [j for j in s.running if rnd.random() < 0.5]
        new = s.claim(queue, release)
        check(f"step {step}", s, new)
        if len(problems) > 5:
            break
    # Drain: hand everything back and claim until every job was claimed (or nothing moves).
    last_move = time.monotonic()
    while (
        len(claimed) < len(enqueued) and time.monotonic() - last_move < 3.0 and len(problems) <= 5
    ):
        for s in sessions:
            new = s.claim(queue, list(s.running))
            check("drain", s, new)
            if new:
                last_move = time.monotonic()
    missing = sorted(set(enqueued) - set(claimed))
    if missing:
        with pg() as c:
            parked = c.execute(
                "SELECT count(*) FROM awa.flow_waiting WHERE job_id = ANY(%s)", [missing]
            ).fetchone()
            sparked = c.execute(
                "SELECT count(*) FROM awa.serial_waiting WHERE job_id = ANY(%s)", [missing]
            ).fetchone()
            fw = c.execute(
                "SELECT job_id, kind, metadata, serial_lock FROM awa.flow_waiting"
            ).fetchall()
            sw = c.execute(
                "SELECT serial_key, min(job_id), count(*) FROM awa.serial_waiting GROUP BY 1"
            ).fetchall()
            kl = c.execute("SELECT kind, max_running FROM awa.flow_kind_limits").fetchall()
            locks = c.execute(
                "SELECT classid, objid, pid FROM pg_locks WHERE locktype = 'advisory'"
            ).fetchall()
        problems.append(
            f"{len(missing)} of {len(enqueued)} jobs never claimed: {missing[:10]} "
            f"(flow_waiting {parked}: {fw}, serial_waiting {sparked}: {sw}; limits {kl}; "
            f"locks {locks}; sessions {[(s.pid, s.slots, list(s.running)) for s in sessions]})"
        )
    # Each token was taken between the claim's transaction start and the row's return.
    with pg() as c:
        starts = c.execute(
            "SELECT id, kind, extract(epoch FROM attempted_at) FROM awa.jobs"
            " WHERE kind = ANY(%s) AND attempted_at IS NOT NULL",
            [list(RATES)],
        ).fetchall()
    for kind, (rate, burst) in RATES.items():
        mine = [(float(t), claim_at[j]) for j, k, t in starts if k == kind and j in claim_at]
        problems += [f"{kind}: {v}" for v in sound_window_violations(mine, rate, burst)]
    for key, order in first_claim_order.items():
        if order != sorted(order):
            problems.append(f"key {key} claimed out of order: {order}")
    assert problems == [], "\n".join(problems)


def db_now() -> datetime:
    with pg() as c:
        row = c.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def started_since(kind: str, since: datetime) -> int:
    with pg() as c:
        row = c.execute(
            "SELECT count(*) FROM fa3_runs WHERE kind = %s AND started > %s", [kind, since]
        ).fetchone()
    return int(row[0]) if row else 0


def running_of(kind: str) -> Run | None:
    with pg() as c:
        row = c.execute(
            "SELECT job_id, pid, started FROM fa3_runs WHERE kind = %s AND ended IS NULL"
            " ORDER BY id LIMIT 1",
            [kind],
        ).fetchone()
    return {"job_id": row[0], "pid": row[1], "started": row[2]} if row else None


def signal_holder(workers: list[ManagedProcess], pid: int, sig: int) -> ManagedProcess:
    import os

    for w in workers:
        if w.pid == pid:
            w.send_signal(sig)
            return w
    os.kill(pid, sig)  # a supervised child: the process that runs the handler
    return next(w for w in workers if str(pid) in w.output()) if workers else workers[0]


def sound_window_violations(spans: list[tuple[float, float]], rate: float, burst: int) -> list[str]:
    """Windows [a, b] that hold the whole span (earliest, latest possible start) of more jobs
    than ``rate`` x (b - a) + ``burst``."""
    bad = []
    lows = sorted({a for a, _ in spans})
    highs = sorted({b for _, b in spans})
    for a in lows:
        for b in highs:
            if b <= a:
                continue
            n = sum(1 for x, y in spans if x >= a and y <= b)
            if n > rate * (b - a) + burst:
                bad.append(f"{n} started within [{a:.3f}, {b:.3f}] ({b - a:.3f} s)")
    return bad[:3]


def rate_spans(ids: list[int]) -> list[tuple[str, float, float]]:
    """(kind, earliest, latest) time each job's rate token can have been taken: its claim's
    transaction start (attempted_at) and its handler's start (the first attempt's)."""
    with pg() as c:
        rows = c.execute(
            "SELECT j.kind, extract(epoch FROM j.attempted_at), extract(epoch FROM r.started)"
            " FROM awa.jobs j JOIN fa3_runs r ON r.job_id = j.id AND r.attempt = 1"
            " WHERE j.id = ANY(%s)",
            [ids],
        ).fetchall()
    return [(k, float(a), float(b)) for k, a, b in rows]


def interrupter(fn: str, stop: threading.Event, hits: list[int], pause: float) -> None:
    """Cancel (or terminate) every worker backend caught running a claim_v3, until ``stop``."""

    with pg() as c:
        while not stop.is_set():
            rows = c.execute(
                f"SELECT {fn}(pid) FROM pg_stat_activity"
                " WHERE state = 'active' AND query LIKE '%%claim_v3%%'"
                " AND pid <> pg_backend_pid()"
            ).fetchall()
            hit = sum(1 for (ok,) in rows if ok)
            hits.append(hit)
            # One interruption now and then (every claim interrupted is no progress at all).
            stop.wait(pause if hit else 0.002)


def held_flow_locks() -> int:
    with pg() as c:
        row = c.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid IN (4282182, 4282183) AND granted"
        ).fetchone()
    return int(row[0]) if row else 0


def claim_calls() -> int:
    with pg() as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
            " WHERE schemaname = 'awa' AND funcname = 'claim_v3'"
        ).fetchone()
    return int(row[0]) if row else 0
