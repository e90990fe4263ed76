"""Hostile tests of flow control (issue 16), third round: the claim's fast path for limited
kinds (the kind asked for the units left up front, the second pass after an unlimited run, the
probe before the lane lock), judged only by what docs/flow.md promises.

Workers are real subprocesses (``manage_py``); handlers record their runs with the database clock in
``fa3_runs`` (tests/jobs/kind_limit_fast_path.py), and the checks are computed from those intervals:
a handler's run lies inside the time its permits and keys are held, so two runs that overlap held
their permits at the same time."""

from __future__ import annotations

import itertools
import json
import signal
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import awa_django
from awa_django.operator import clear_kind_limits, set_kind_limits
from tests.jobs import kind_limit_fast_path, worker_env
from tests.jobs import kind_limit_fast_path as flowatk3jobs
from tests.jobs.kind_limit_fast_path import FA3_TABLES
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.usefixtures("clean_awa")

assert flowatk3jobs  # registers the kinds in this process too (enqueue by name)

Run = dict[str, Any]

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
#: How long after a limit change a claim may still have started under the old one.
_GRACE = timedelta(seconds=0.3)


def _tables() -> None:
    with pg() as c:
        c.execute(FA3_TABLES)


def _workers(
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


def _runs() -> list[Run]:
    with pg() as c:
        cur = c.execute(
            "SELECT job_id, kind, queue, attempt, pid, started, ended FROM fa3_runs ORDER BY id"
        )
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _done(ids: Iterable[int]) -> int:
    with pg() as c:
        row = c.execute(
            "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state = 'completed'", [list(ids)]
        ).fetchone()
        return int(row[0]) if row else 0


def _wait_done(ids: list[int], workers: list[ManagedProcess], timeout: float = 40.0) -> None:
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

    wait_for(lambda: _done(ids) == len(ids), timeout=timeout, interval=0.1, message=message)


def _peak(
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


def _once(runs: list[Run], ids: list[int]) -> None:
    """Every job ran exactly once, as its first attempt."""
    by_job: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        by_job[r["job_id"]].append(r)
    missing = [i for i in ids if i not in by_job]
    twice = {j: [(r["attempt"], r["pid"]) for r in rs] for j, rs in by_job.items() if len(rs) > 1}
    retried = [j for j, rs in by_job.items() if rs[0]["attempt"] != 1]
    assert not missing and not twice and not retried, (missing, twice, retried)


def _clean_logs(workers: list[ManagedProcess]) -> None:
    for w in workers:
        out = w.output()
        assert "Traceback" not in out and "ERROR" not in out, out[-5000:]


def _stop(workers: list[ManagedProcess]) -> None:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        w.wait(30)


def _serial_order(runs: list[Run], keys: dict[int, str]) -> list[str]:
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


def test_mixed_lane_kinds_weights_keys_on_three_workers(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """One queue, every lane a mix: jobs of kinds limited to 3 and 5 (weights 1 .. 9, some above
    the limit, some above the process's slots), jobs of no limit, jobs with serial keys of no
    kind limit and of a limited kind. Three workers of 4 slots. Every job runs once, as attempt
    1; a kind never runs more than its limit counted by min(weight, limit, slots); a key runs
    one at a time, in enqueue order."""
    _tables()
    slots = 4
    plan: list[tuple[str, int, str | None]] = []
    for i in range(330):
        r = i % 9
        if r in (0, 4):
            plan.append(("fa3.k3", [1, 2, 3, 7][i % 4], None))
        elif r in (1, 6):
            plan.append(("fa3.k5", [1, 4, 9][i % 3], None))
        elif r == 2:
            plan.append(("fa3.free", [1, 3][i % 2], None))
        elif r == 3:
            plan.append(("fa3.free2", 1, f"s{i % 5}"))
        elif r == 5:
            plan.append(("fa3.k3", 1, f"s{i % 5}"))
        else:
            plan.append(("fa3.free", 1, None))
    ids: list[int] = []
    weight: dict[int, int] = {}
    keys: dict[int, str] = {}
    for kind, w, key in plan:
        job = awa_django.enqueue(kind, kwargs={"seconds": 0.02}, weight=w, serial_key=key)
        ids.append(job.id)
        weight[job.id] = w
        if key is not None:
            keys[job.id] = key
    # Rings rotating and pruned under the claims all the while.
    rings = {"CLAIM_ROTATE_INTERVAL": 0.2, "PRUNE_INTERVAL": 0.1, "HISTORY_RETENTION": 30.0}
    workers = _workers(manage_py, 3, concurrency=slots, overrides=rings)
    _wait_done(ids, workers)
    runs = _runs()
    _once(runs, ids)
    for kind, limit in (("fa3.k3", 3), ("fa3.k5", 5)):
        peak, where = _peak(
            (r for r in runs if r["kind"] == kind),
            lambda r, limit=limit: min(weight[r["job_id"]], limit, slots),  # type: ignore[misc]
        )
        assert peak <= limit, f"{kind}: {peak} units at once ({where})"
    assert _serial_order(runs, keys) == []
    _stop(workers)
    _clean_logs(workers)


# --- SQL-level fuzzing of awa.claim_v3: sessions that claim, hold and hand back like workers ---

_KIND_PERMIT_CLASS = 4282182


class _Session:
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


def _set_limit(kind: str, limit: int | None) -> None:
    if limit is None:
        clear_kind_limits(kind, actor="fa3")
    else:
        set_kind_limits(kind, global_concurrency=limit, actor="fa3")


_RATES = {"fa3.rated": (20.0, 4), "fa3.both": (30.0, 3)}


def _fuzz(
    seed: int, steps: int, slots: Sequence[int], weights: Sequence[int], qlimit: int | None
) -> None:
    import random

    from awa_django.operator import set_queue_limits

    rnd = random.Random(seed)
    kinds = {"fa3.k1": 1, "fa3.k2": 2, "fa3.k3": 3, "fa3.k5": 5, "fa3.both": 2}
    limits: dict[str, int | None] = dict(kinds)
    for kind, limit in kinds.items():
        if kind not in _RATES:
            _set_limit(kind, limit)
    set_kind_limits("fa3.rated", rate_limit=20.0, rate_burst=4, actor="fa3")
    set_kind_limits("fa3.both", global_concurrency=2, rate_limit=30.0, rate_burst=3, actor="fa3")
    sessions = [_Session(rnd.choice(slots)) for _ in range(3)]
    queue = "fa3" if qlimit is None else "fa3ql"
    if qlimit is not None:
        set_queue_limits(queue, global_concurrency=qlimit, actor="fa3")
    try:
        _fuzz_with(rnd, kinds, limits, sessions, steps, weights, queue, qlimit)
    finally:
        for s in sessions:
            s.conn.close()


def _fuzz_with(
    rnd: Any,
    kinds: dict[str, int],
    limits: dict[str, int | None],
    sessions: list[_Session],
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

    def check(step: str, session: _Session, new: list[dict[str, Any]]) -> None:
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
                [_KIND_PERMIT_CLASS],
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
            _set_limit(kind, value)
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
            [list(_RATES)],
        ).fetchall()
    for kind, (rate, burst) in _RATES.items():
        mine = [(float(t), claim_at[j]) for j, k, t in starts if k == kind and j in claim_at]
        problems += [f"{kind}: {v}" for v in _sound_window_violations(mine, rate, burst)]
    for key, order in first_claim_order.items():
        if order != sorted(order):
            problems.append(f"key {key} claimed out of order: {order}")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(
    ("seed", "slots", "weights", "qlimit"),
    [
        (1, (6, 8, 10), (1, 1, 1, 2, 3, 4, 7, 12), None),
        (2, (6, 8, 10), (1, 1, 1, 2, 3, 4, 7, 12), 5),
        (3, (2, 3), (1, 1, 2), None),
        # Sessions smaller than the heavy jobs (before migration 0015 such a session stranded
        # a parked job whose min(weight, limit) was above its slots).
        (4, (2, 3, 5), (1, 1, 2, 3, 4, 7), None),
    ],
)
def test_claim_v3_fuzz_kinds_weights_keys_limits(
    seed: int, slots: tuple[int, ...], weights: tuple[int, ...], qlimit: int | None
) -> None:
    """Three claim sessions of 2-8 slots claim from one queue where kinds limited to 1, 2, 3
    and 5 (some changed at runtime: lowered, raised, cleared), unlimited kinds and serial keys
    mix, with weights 1-12 (and raw-SQL producers' bad weights), new jobs arriving and the claim
    ring rotating. After every claim: each new job carries min(weight, limit) permits of its
    kind, a kind's running units never pass its limit, no permit is carried twice or held by a
    session for no running job, a key runs once at a time; at the end every job was claimed
    exactly once and each key's jobs in enqueue order."""
    _fuzz(seed, 250, slots, weights, qlimit)


def test_parked_heavy_job_not_stranded_on_small_workers(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Kind limited to 3, workers of 2 slots, jobs of weight 3. docs/flow.md: a weight above
    what the claiming process can run counts as that bound ("a heavy job can never block its
    lane for ever"), and "a parked job is never stranded". A runs (2 of the kind's 3 permits);
    B, claimed by the other worker meanwhile, cannot have 2 and is parked; once A ended, B
    must run."""
    _tables()
    workers = _workers(manage_py, 2, concurrency=2)
    a = awa_django.enqueue("fa3.k3", kwargs={"seconds": 0.8}, weight=3).id
    wait_for(lambda: any(r["job_id"] == a for r in _runs()), timeout=15, message="A running")
    b = awa_django.enqueue("fa3.k3", kwargs={"seconds": 0.0}, weight=3).id
    with pg() as c:
        wait_for(
            lambda: (
                c.execute("SELECT 1 FROM awa.flow_waiting WHERE job_id = %s", [b]).fetchone()
                or _done([b])
            ),
            timeout=10,
            message="B parked (or run)",
        )
    _wait_done([a, b], workers, timeout=4)
    _stop(workers)


def _db_now() -> datetime:
    with pg() as c:
        row = c.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _started_since(kind: str, since: datetime) -> int:
    with pg() as c:
        row = c.execute(
            "SELECT count(*) FROM fa3_runs WHERE kind = %s AND started > %s", [kind, since]
        ).fetchone()
    return int(row[0]) if row else 0


def test_kind_limit_changed_mid_drain(manage_py: Callable[..., ManagedProcess]) -> None:
    """A kind without limits drains on two workers of 6 slots beside unlimited jobs in the same
    lanes while the operator sets its limit to 1, raises it to 4, lowers it to 2, clears it,
    and sets 1 again (0 is refused, nothing written). docs/flow.md: a change takes effect with
    the next claim (within POLL_INTERVAL); a lowered limit holds at once. From 0.3 s after each
    change on, no job of the kind starts while the limit's worth of its jobs run; every job
    runs once."""
    _tables()
    ids = []
    for i in range(450):
        kind = "fa3.plain" if i % 3 else "fa3.free"
        ids.append(awa_django.enqueue(kind, kwargs={"seconds": 0.03}).id)
    workers = _workers(manage_py, 2, concurrency=6)
    wait_for(lambda: _started_since("fa3.plain", _EPOCH) >= 20, timeout=15, message="a start")
    phases: list[tuple[datetime, int | None]] = []
    befores: list[datetime] = []  # the clock before each change: the previous phase's end
    for limit in (1, 4, 2, None, 1):
        befores.append(_db_now())
        _set_limit("fa3.plain", limit)
        at = _db_now()
        phases.append((at, limit))
        if limit == 1 and len(phases) == 1:
            with pytest.raises(awa_django.AwaError):
                set_kind_limits("fa3.plain", global_concurrency=0, actor="fa3")
            with pg() as c:
                row = c.execute(
                    "SELECT max_running FROM awa.flow_kind_limits WHERE kind = 'fa3.plain'"
                ).fetchone()
            assert row == (1,)
        wait_for(
            lambda at=at: _started_since("fa3.plain", at) >= 15,  # type: ignore[misc]
            timeout=20,
            message=f"15 starts under limit {limit}",
        )
    befores.append(_db_now())
    _set_limit("fa3.plain", None)  # the rest drains unlimited (not checked)
    _wait_done(ids, workers, timeout=60)
    runs = [r for r in _runs() if r["kind"] == "fa3.plain"]
    _once(_runs(), ids)
    bounds = befores[1:]
    bad = []
    for (at, limit), until in zip(phases, bounds, strict=True):
        if limit is None:
            continue
        for r in runs:
            if r["started"] <= at + _GRACE or r["started"] > until:
                continue
            running = [o for o in runs if o["started"] <= r["started"] < o["ended"]]
            if len(running) > limit:
                bad.append(
                    f"limit {limit} (set at {at.time()}): job {r['job_id']} started beside "
                    + ", ".join(
                        f"job {o['job_id']} (pid {o['pid']}, {o['started'].time()} -"
                        f" {o['ended'].time()})"
                        for o in running
                    )
                )
    assert bad == [], f"phases {[(a.time().isoformat(), lim) for a, lim in phases]}: " + "\n".join(
        bad[:6]
    )
    _stop(workers)
    _clean_logs(workers)


def _running_of(kind: str) -> Run | None:
    with pg() as c:
        row = c.execute(
            "SELECT job_id, pid, started FROM fa3_runs WHERE kind = %s AND ended IS NULL"
            " ORDER BY id LIMIT 1",
            [kind],
        ).fetchone()
    return {"job_id": row[0], "pid": row[1], "started": row[2]} if row else None


def _signal_holder(workers: list[ManagedProcess], pid: int, sig: int) -> ManagedProcess:
    import os

    for w in workers:
        if w.pid == pid:
            w.send_signal(sig)
            return w
    os.kill(pid, sig)  # a supervised child: the process that runs the handler
    return next(w for w in workers if str(pid) in w.output()) if workers else workers[0]


def test_sigkill_of_kind_permit_holder_mid_drain(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Jobs of a kind limited to 1, serial-keyed jobs of a kind limited to 2 and free jobs on
    three workers; the worker running the limited kind's job is SIGKILLed. docs/flow.md: its
    session ends and frees the permits at once, the limit holds throughout (the killed handler
    counts as running until the kill), the killed attempt is rescued and retried, the key's
    jobs go on, and every job completes."""
    _tables()
    ids, keys = [], {}
    for i in range(90):
        if i % 3 == 0:
            ids.append(awa_django.enqueue("fa3.k1", kwargs={"seconds": 0.1}).id)
        elif i % 3 == 1:
            job = awa_django.enqueue("fa3.k2", kwargs={"seconds": 0.05}, serial_key=f"c{i % 2}")
            ids.append(job.id)
            keys[job.id] = f"c{i % 2}"
        else:
            ids.append(awa_django.enqueue("fa3.free", kwargs={"seconds": 0.02}).id)
    workers = _workers(
        manage_py, 3, concurrency=3, overrides={"HEARTBEAT_STALENESS": 2.0, "RESCUE_INTERVAL": 0.2}
    )
    wait_for(lambda: _started_since("fa3.k1", _EPOCH) >= 5, timeout=15, message="k1 starts")
    victim = wait_for(lambda: _running_of("fa3.k1"), timeout=10, message="a k1 job running")
    assert victim is not None
    # The clock just before the kill: read after it, a permit the kill freed and another
    # worker took meanwhile would show an overlap that never was.
    killed_at = _db_now()
    _signal_holder(workers, victim["pid"], signal.SIGKILL)
    alive = [w for w in workers if w.pid != victim["pid"]]
    _wait_done(ids, alive, timeout=40)
    runs = _runs()
    for r in runs:
        if r["ended"] is None:
            assert r["pid"] == victim["pid"], r
    for kind, limit in (("fa3.k1", 1), ("fa3.k2", 2)):
        peak, where = _peak(
            (r for r in runs if r["kind"] == kind), lambda r: 1, end_default=killed_at
        )
        assert peak <= limit, f"{kind}: {peak} at once ({where})"
    first = [r for r in runs if r["attempt"] == 1 and r["pid"] != victim["pid"]]
    assert _serial_order(first, keys) == []
    _stop(alive)
    _clean_logs(alive)


def test_sigstop_of_kind_permit_holder(manage_py: Callable[..., ManagedProcess]) -> None:
    """The worker running a job of a kind limited to 1 is frozen (SIGSTOP). docs/flow.md: while
    it is frozen its permit stays taken, "fewer than the limit run, never more"; the leader
    rescues its attempt and terminates its backend (awa.flow_reap_v1), after which the other
    workers run the kind again. The frozen job also holds a serial key: once its session is
    gone, the leader's sweep hands the key on and the key's other jobs run while it is still
    frozen. After SIGCONT everything completes."""
    _tables()
    held = awa_django.enqueue("fa3.k1", kwargs={"seconds": 2.0}, serial_key="S").id
    ids = [held]
    ids += [awa_django.enqueue("fa3.k1", kwargs={"seconds": 0.02}).id for _ in range(20)]
    ids += [
        awa_django.enqueue("fa3.free", kwargs={"seconds": 0.01}, serial_key="S").id
        for _ in range(8)
    ]
    overrides = {
        "HEARTBEAT_STALENESS": 1.0,
        "RUNTIME_REFRESH_INTERVAL": 0.2,
        "HEARTBEAT_INTERVAL": 0.1,
        "RESCUE_INTERVAL": 0.2,
    }
    workers = _workers(manage_py, 2, concurrency=2, overrides=overrides)
    victim = wait_for(
        lambda: next((r for r in _runs() if r["job_id"] == held), None),
        timeout=15,
        message="the key's first job running",
    )
    assert victim is not None
    frozen = _signal_holder(workers, victim["pid"], signal.SIGSTOP)
    stopped_at = _db_now()
    try:
        others = [w for w in workers if w is not frozen]
        with pg() as c:
            wait_for(
                lambda: c.execute(
                    "SELECT count(*) FILTER (WHERE kind = 'fa3.k1') >= 5"
                    " AND count(*) FILTER (WHERE kind = 'fa3.free') >= 3"
                    " FROM fa3_runs WHERE pid <> %s AND started > %s",
                    [victim["pid"], stopped_at],
                ).fetchone()[0],  # type: ignore[index]
                timeout=20,
                message=lambda: (
                    "the kind and the key to run again while their holder is frozen; logs:\n"
                    + "\n".join(w.output()[-3000:] for w in others)
                ),
            )
    finally:
        frozen.send_signal(signal.SIGCONT)
    _wait_done(ids, workers, timeout=30)
    runs = [r for r in _runs() if r["kind"] == "fa3.k1" and r["pid"] != victim["pid"]]
    peak, where = _peak(runs, lambda r: 1)
    assert peak <= 1, where
    _stop(workers)


def _sound_window_violations(
    spans: list[tuple[float, float]], rate: float, burst: int
) -> list[str]:
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


def _rate_spans(ids: list[int]) -> list[tuple[str, float, float]]:
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


def test_kind_rate_changed_mid_drain_beside_free_jobs(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Jobs of a kind limited to 20/s (burst 4) interleaved with free jobs in the same lanes,
    on two workers; mid-drain the operator lowers the rate to 8/s (burst 2), then raises it to
    40/s (burst 5). docs/flow.md: over any window of t seconds at most rate x t + burst start
    (by the claim's database clock), a change takes effect with the next claim, and the other
    jobs of the queue are not held behind the rate (no head-of-line blocking)."""
    _tables()
    rated, free = [], []
    for _ in range(110):
        rated.append(awa_django.enqueue("fa3.rated").id)
        free.append(awa_django.enqueue("fa3.free").id)
    workers = _workers(manage_py, 2, concurrency=4)
    phases: list[tuple[datetime, datetime, float, int]] = []
    start = _db_now()
    wait_for(lambda: _started_since("fa3.rated", _EPOCH) >= 30, timeout=15, message="30 starts")
    for rate, burst, n in ((8.0, 2, 15), (40.0, 5, 0)):
        before = _db_now()
        set_kind_limits("fa3.rated", rate_limit=rate, rate_burst=burst, actor="fa3")
        after = _db_now()
        phases.append((before, after, rate, burst))
        if n:
            wait_for(
                lambda after=after, n=n: _started_since("fa3.rated", after) >= n,  # type: ignore[misc]
                timeout=15,
                message=f"{n} starts at {rate}/s",
            )
    _wait_done(rated + free, workers, timeout=30)
    with pg() as c:
        claims = [
            t
            for (t,) in c.execute(
                "SELECT attempted_at FROM awa.jobs WHERE id = ANY(%s) ORDER BY 1", [rated]
            ).fetchall()
        ]
        free_done = c.execute(
            "SELECT max(finalized_at) FROM awa.jobs WHERE id = ANY(%s)", [free]
        ).fetchone()
    bad: list[str] = []
    windows = [(start, phases[0][0], 20.0, 4)]
    windows.append((phases[0][1] + _GRACE, phases[1][0], 8.0, 2))
    windows.append((phases[1][1] + _GRACE, claims[-1] + _GRACE, 40.0, 5))
    spans = _rate_spans(rated)
    for lo, hi, rate, burst in windows:
        mine = [(a, b) for _, a, b in spans if lo.timestamp() <= a <= hi.timestamp()]
        bad += _sound_window_violations(mine, rate, burst)
    assert bad == [], bad[:5]
    _once(_runs(), rated + free)
    # The free jobs do not wait behind the rated ones: all done before the rated drain's end
    # (it takes over 5 s; free jobs alone take well under 1).
    assert free_done is not None and free_done[0] < claims[-1] - timedelta(seconds=2), (
        free_done,
        claims[-1],
    )
    _stop(workers)
    _clean_logs(workers)


@pytest.mark.parametrize("changing", [False, True], ids=["fixed", "changing"])
def test_claim_v3_concurrent_sessions_hammer(changing: bool) -> None:
    """Four claim sessions in threads claim and hand back at once (the races of the fast path:
    probe before the lane lock, kinds asked up front and given back, the second pass), on a
    queue where kinds limited to 1, 2, 3 and 5, unlimited kinds and serial keys mix with
    weights 1-4 and producers keep adding jobs (Python COPY and raw SQL). Observed holding
    intervals (from the claim's return to the call that hands back) lie inside the real
    ones: a kind's units over overlapping intervals never pass its limit, a permit key and a
    serial key are never held twice at once, each job is claimed once, and all are claimed.
    ``changing``: a thread also sets the limits of two of the kinds (1-6, cleared) all the while,
    and jobs of kinds limited by rate (alone, and with 2 permits) mix in: each job still carries
    the permits of a limit in force, nothing is lost or claimed twice, rates hold over every
    window, and the sessions hold exactly the permits their running jobs carry."""
    import random
    import time

    kinds = {"fa3.k1": 1, "fa3.k2": 2, "fa3.k3": 3, "fa3.k5": 5}
    for kind, limit in kinds.items():
        _set_limit(kind, limit)
    set_kind_limits("fa3.rated", rate_limit=20.0, rate_burst=4, actor="fa3")
    set_kind_limits("fa3.both", global_concurrency=2, rate_limit=30.0, rate_burst=3, actor="fa3")
    extra = ["fa3.rated", "fa3.both"] if changing else []
    changed = {"fa3.k3", "fa3.k5"} if changing else set()
    enqueued: list[int] = []
    serial_of: dict[int, str] = {}
    lock = threading.Lock()

    def produce(seed: int, n: int) -> None:
        rnd = random.Random(seed)
        for _ in range(n):
            batch = []
            for _ in range(rnd.randint(1, 8)):
                kind = rnd.choice([*kinds, *extra, "fa3.free", "fa3.free2"])
                key = rnd.choice([None, None, "p", "q"])
                opts: dict[str, Any] = {
                    "weight": rnd.choice([1, 1, 2, 4]),
                    "priority": rnd.choice([0, 3, 9]),
                }
                if key:
                    opts["serial_key"] = key
                batch.append((awa_django.get_job(kind).using(**opts).prepare(), key))
            if rnd.random() < 0.3:
                raw = [r.payload_value() for r, _ in batch]
                with pg() as c:
                    got = [
                        j
                        for (j,) in c.execute(
                            "SELECT job_id FROM awa.enqueue_v1(%s::jsonb)", [json.dumps(raw)]
                        ).fetchall()
                    ]
            else:
                from django.db import connection

                got = [j.id for j in awa_django.enqueue_many([r for r, _ in batch])]
                connection.close()
            with lock:
                enqueued.extend(got)
                for j, (_, key) in zip(got, batch, strict=True):
                    if key:
                        serial_of[j] = key

    held: list[dict[str, Any]] = []  # every claimed job with its observed holding interval
    errors: list[BaseException] = []
    stop = threading.Event()

    def claimer(seed: int) -> None:
        rnd = random.Random(seed)
        s = _Session(rnd.choice([4, 6]))  # >= every min(weight, limit): see the stranding bug
        try:
            since: dict[int, float] = {}
            while not stop.is_set():
                release = [j for j in s.running if rnd.random() < 0.6]
                t_release = time.monotonic()
                entries = {j: s.running[j] for j in release}
                new = s.claim("fa3", release)
                t_claimed = time.monotonic()
                for j, e in entries.items():
                    held.append({**e, "from": since.pop(j), "to": t_release})
                for e in new:
                    since[e["job_id"]] = t_claimed
            for j, e in s.running.items():
                held.append({**e, "from": since[j], "to": time.monotonic()})
            with pg() as c:
                row = c.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND classid = %s AND pid = %s AND granted",
                    [_KIND_PERMIT_CLASS, s.pid],
                ).fetchone()
            carried = sum(len(e["permits"]) for e in s.running.values())
            if row is None or row[0] != carried:
                raise AssertionError(f"session {s.pid} holds {row} permits, carries {carried}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            s.conn.close()

    def change_limits() -> None:
        rnd = random.Random(99)
        while not stop.is_set():
            _set_limit(rnd.choice(sorted(changed)), rnd.choice([1, 2, 4, 6, None]))
            stop.wait(0.03)  # a change every 30 ms, until the test stops the thread
        from django.db import connection

        connection.close()

    produce(0, 20)
    initial = set(enqueued)
    producers = [threading.Thread(target=produce, args=(i, 40)) for i in (1, 2)]
    claimers = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    if changing:
        claimers.append(threading.Thread(target=change_limits))
    for t in producers + claimers:
        t.start()
    for t in producers:
        t.join()

    def unclaimed() -> str:
        missing = sorted(set(enqueued) - {h["job_id"] for h in held})
        with pg() as c:
            where = c.execute(
                "SELECT 'flow', job_id, kind, metadata FROM awa.flow_waiting"
                " WHERE job_id = ANY(%s) UNION ALL SELECT 'serial', job_id, kind, metadata"
                " FROM awa.serial_waiting WHERE job_id = ANY(%s)",
                [missing, missing],
            ).fetchall()
            limits = c.execute("SELECT kind, max_running, rate, burst FROM awa.flow_kind_limits")
        return (
            f"{len(enqueued) - len(missing)} of {len(enqueued)} claimed; missing {missing[:10]}"
            f" parked {where[:10]}; limits {limits.fetchall()}"
        )

    try:
        wait_for(
            lambda: len({h["job_id"] for h in held}) >= len(enqueued) or errors,
            timeout=30,
            message=unclaimed,
        )
    finally:
        stop.set()
        for t in claimers:
            t.join()
    assert errors == []
    problems: list[str] = []
    counts: dict[int, int] = defaultdict(int)
    for h in held:
        counts[h["job_id"]] += 1
    problems += [f"job {j} claimed {n} times" for j, n in counts.items() if n > 1]
    missing = set(enqueued) - set(counts)
    if missing:
        problems.append(f"never claimed: {sorted(missing)[:10]}")

    def overlap(items: list[dict[str, Any]], units: Callable[[dict[str, Any]], int]) -> int:
        events = sorted(
            [(h["from"], 1, units(h)) for h in items] + [(h["to"], 0, -units(h)) for h in items]
        )
        cur = peak = 0
        for _, _, u in events:
            cur += u
            peak = max(peak, cur)
        return peak

    for kind, limit in kinds.items():
        if kind in changed:
            continue
        mine = [h for h in held if h["kind"] == kind]
        bad = [h for h in mine if len(h["permits"]) != min(h["weight"], limit)]
        if bad:
            problems.append(f"{kind}: jobs with the wrong number of permits: {bad[:3]}")
        peak = overlap(mine, lambda h: len(h["permits"]))
        if peak > limit:
            problems.append(f"{kind}: {peak} units held at once, limit {limit}")
    by_permit: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for h in held:
        for k in h["permits"]:
            by_permit[k].append(h)
    for k, items in by_permit.items():
        if overlap(items, lambda h: 1) > 1:
            problems.append(f"permit key {k} held by two jobs at once")
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for h in held:
        if h["job_id"] in serial_of:
            by_key[serial_of[h["job_id"]]].append(h)
    for key, items in by_key.items():
        if overlap(items, lambda h: 1) > 1:
            problems.append(f"serial key {key} held by two jobs at once")
        # Two producers' concurrent jobs of a key are ordered as they become visible; the jobs
        # enqueued before the claimers started were all visible: none of them may be claimed
        # after a younger job of its key.
        order = [h["job_id"] for h in sorted(items, key=lambda h: h["from"])]
        for i, j in enumerate(order):
            if j in initial and any(o > j for o in order[:i]):
                problems.append(f"serial key {key}: job {j} claimed after a younger one")
    # Each token was taken between the claim's transaction start and the row's return.
    with pg() as c:
        began = dict(
            c.execute(
                "SELECT id, extract(epoch FROM attempted_at) FROM awa.jobs"
                " WHERE kind = ANY(%s) AND attempted_at IS NOT NULL",
                [list(_RATES)],
            ).fetchall()
        )
    for kind, (rate, burst) in _RATES.items():
        tokens = [
            (float(began[h["job_id"]]), h["at"].timestamp())
            for h in held
            if h["kind"] == kind and h["job_id"] in began
        ]
        problems += [f"{kind}: {v}" for v in _sound_window_violations(tokens, rate, burst)]
    assert problems == [], "\n".join(problems[:10])


def _interrupter(fn: str, stop: threading.Event, hits: list[int], pause: float) -> None:
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


def _held_flow_locks() -> int:
    with pg() as c:
        row = c.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid IN (4282182, 4282183) AND granted"
        ).fetchone()
    return int(row[0]) if row else 0


def test_claims_cancelled_mid_statement(manage_py: Callable[..., ManagedProcess]) -> None:
    """A hostile environment cancels (pg_cancel_backend) every claim statement it catches
    running, while two workers drain a queue where kinds limited to 1 and 2 (weights 1-2),
    serial keys and free jobs mix. docs/flow.md: a claim that fails part-way leaves no permit or
    key behind (awa.flow_reset_v1, awa.serial_reset_v1); a cancel does not end the session, so
    the limits hold throughout. Every job completes, no kind runs over its limit, and once the
    workers are idle no permit or run lock is held."""
    _tables()
    ids, keys, weight = [], {}, {}
    for i in range(240):
        kind = ["fa3.k1", "fa3.k2", "fa3.free", "fa3.k2"][i % 4]
        key = f"z{i % 3}" if i % 5 == 0 else None
        heavy = 1 + (i % 7 == 0)
        job = awa_django.enqueue(kind, kwargs={"seconds": 0.01}, weight=heavy, serial_key=key)
        ids.append(job.id)
        weight[job.id] = heavy
        if key:
            keys[job.id] = key
    stop = threading.Event()
    hits: list[int] = []
    t = threading.Thread(target=_interrupter, args=("pg_cancel_backend", stop, hits, 0.15))
    workers = _workers(manage_py, 2, concurrency=4)
    t.start()
    try:
        _wait_done(ids, workers, timeout=60)
    finally:
        stop.set()
        t.join()
    assert sum(hits) > 0, "no claim was caught running"
    wait_for(
        lambda: _held_flow_locks() == 0,
        timeout=10,
        message=lambda: f"{_held_flow_locks()} permits or run locks still held by idle workers",
    )
    runs = _runs()
    for kind, limit in (("fa3.k1", 1), ("fa3.k2", 2)):
        peak, where = _peak(
            (r for r in runs if r["kind"] == kind),
            lambda r, limit=limit: min(weight[r["job_id"]], limit),  # type: ignore[misc]
        )
        assert peak <= limit, f"{kind}: {peak} at once ({where}); {sum(hits)} cancels"
    assert _serial_order([r for r in runs if r["attempt"] == 1], keys) == []
    for w in workers:
        assert w.proc.poll() is None, w.output()[-3000:]
    _stop(workers)


def test_claim_connections_terminated(manage_py: Callable[..., ManagedProcess]) -> None:
    """A hostile environment terminates (pg_terminate_backend) the backend of claims it catches
    running, now and then, while two workers drain limited kinds, serial keys and free jobs.
    docs/flow.md allows an overrun of one attempt per lost permit or key while a handler that
    lost its session runs (logged); it promises that the worker reconnects and takes its running
    handlers' permits back, that nothing is lost: every job completes, no attempt is delivered
    twice, and once the workers are idle no permit or run lock is held."""
    _tables()
    ids = []
    for i in range(200):
        kind = ["fa3.k1", "fa3.k2", "fa3.free", "fa3.k3"][i % 4]
        key = f"t{i % 3}" if i % 5 == 0 else None
        ids.append(awa_django.enqueue(kind, kwargs={"seconds": 0.01}, serial_key=key).id)
    stop = threading.Event()
    hits: list[int] = []
    t = threading.Thread(target=_interrupter, args=("pg_terminate_backend", stop, hits, 1.0))
    workers = _workers(manage_py, 2, concurrency=4)
    t.start()
    try:
        _wait_done(ids, workers, timeout=60)
    finally:
        stop.set()
        t.join()
    assert sum(hits) > 0, "no claim was caught running"
    wait_for(
        lambda: _held_flow_locks() == 0,
        timeout=10,
        message=lambda: f"{_held_flow_locks()} permits or run locks still held by idle workers",
    )
    seen: dict[tuple[int, int], int] = defaultdict(int)
    for r in _runs():
        seen[(r["job_id"], r["attempt"])] += 1
    assert [k for k, n in seen.items() if n > 1] == []
    for w in workers:
        assert w.proc.poll() is None, w.output()[-3000:]
    _stop(workers)


def test_lowered_kind_limit_counts_old_permits_on_the_fast_path() -> None:
    """docs/flow.md: a lowered limit holds at once, a claim counts every held permit of the
    kind before it takes one. A session holds 5 permits of a kind limited to 5; the limit goes
    to 1. Claims of 1 slot (limit >= units left: the fast path asks the kind up front) take
    nothing until all the old permits are back, then exactly one job at a time. Raised to 3,
    the next claims take up to 3."""
    kind = "fa3.k5"
    _set_limit(kind, 5)
    ids = [awa_django.enqueue(kind).id for _ in range(12)]
    ids += [awa_django.enqueue("fa3.free").id for _ in range(3)]
    a, b, c = _Session(5), _Session(1), _Session(1)
    try:
        got = a.claim("fa3", [])
        assert [j["kind"] for j in got] == [kind] * 5, got
        _set_limit(kind, 1)
        assert [j["kind"] for j in b.claim("fa3", [])] in ([], ["fa3.free"])
        first = list(a.running)
        a.claim("fa3", first[:3])  # 2 old permits still held: free jobs only
        assert all(
            j["kind"] == "fa3.free"
            for s in (a, b)
            for j in s.running.values()
            if j["job_id"] not in first
        )
        for s in (b, c):
            new = s.claim("fa3", [j for j in s.running if s.running[j]["kind"] == "fa3.free"])
            assert all(j["kind"] != kind for j in new), new
        a.claim("fa3", list(a.running))  # every old permit back; a may take one job of the kind
        running_kind = [j for s in (a, b, c) for j in s.running.values() if j["kind"] == kind]
        assert len(running_kind) <= 1, running_kind
        for s in (b, c):
            s.claim("fa3", [j for j in s.running if s.running[j]["kind"] == "fa3.free"])
        running_kind = [j for s in (a, b, c) for j in s.running.values() if j["kind"] == kind]
        assert len(running_kind) == 1, running_kind
        _set_limit(kind, 3)
        for s in (b, c, a):
            s.claim("fa3", [])
        running_kind = [j for s in (a, b, c) for j in s.running.values() if j["kind"] == kind]
        assert len(running_kind) == 3, running_kind
        assert sum(len(j["permits"]) for j in running_kind) == 3
    finally:
        for s in (a, b, c):
            s.conn.close()


def test_cancel_of_a_job_parked_by_its_kind_ahead_of_its_key(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """A job of a kind limited to 1 (busy with a long job) is parked by its kind; younger jobs
    of its serial key (of no limited kind) park behind it. Cancelling the parked job: docs/flow.md
    says cancel removes a parked job and the leader's sweep hands on a key whose next job was
    cancelled before it ran, so the key's other jobs run (while the long job still runs: they
    need no permit of the kind); the cancelled job never runs; the kind's other parked job runs
    once the long one ended."""
    _tables()
    workers = _workers(manage_py, 2, concurrency=3)
    long = awa_django.enqueue("fa3.k1", kwargs={"seconds": 2.5}).id
    wait_for(lambda: _running_of("fa3.k1"), timeout=15, message="the long job running")
    a = awa_django.enqueue("fa3.k1", serial_key="K").id
    b = awa_django.enqueue("fa3.free", serial_key="K").id
    c = awa_django.enqueue("fa3.free2", serial_key="K").id
    d = awa_django.enqueue("fa3.k1").id

    def parked() -> bool:
        with pg() as conn:
            flow = conn.execute(
                "SELECT count(*) FROM awa.flow_waiting WHERE job_id = ANY(%s)", [[a, d]]
            ).fetchone()
            serial = conn.execute(
                "SELECT count(*) FROM awa.serial_waiting WHERE job_id = ANY(%s)", [[b, c]]
            ).fetchone()
        return flow == (2,) and serial == (2,)

    wait_for(parked, timeout=10, message="a and d parked by the kind, b and c behind the key")
    assert awa_django.cancel(a) == "available"
    _wait_done([b, c], workers, timeout=10)
    runs = {r["job_id"]: r for r in _runs()}
    assert runs[long]["ended"] is None, "b and c waited for the kind's permit"
    _wait_done([long, d], workers, timeout=15)
    assert a not in {r["job_id"] for r in _runs()}
    _stop(workers)
    _clean_logs(workers)


def test_kind_limits_across_two_queues(manage_py: Callable[..., ManagedProcess]) -> None:
    """Jobs of a kind limited to 2 and of a kind limited to 20/s (burst 4) in two queues at
    once, beside free jobs, on two workers serving both (one of them through a per-queue cap
    of 2). docs/flow.md: a kind's limits hold across every queue its jobs are in; permits freed
    in one queue reach the other's parked jobs within POLL_INTERVAL; every job runs once."""
    _tables()
    ids, rated = [], []
    for i in range(70):
        queue = "fa3" if i % 2 else "fa3b"
        ids.append(awa_django.enqueue("fa3.k2", kwargs={"seconds": 0.02}, queue=queue).id)
        job = awa_django.enqueue("fa3.rated", queue=queue)
        rated.append(job.id)
        ids.append(job.id)
        ids.append(awa_django.enqueue("fa3.free", queue=queue).id)
    env = worker_env(kind_limit_fast_path)
    workers = [
        manage_py(
            "awa_worker", "--concurrency", "4", "--queue", "fa3", "--queue", "fa3b", extra_env=env
        ),
        manage_py(
            "awa_worker", "--concurrency", "4", "--queue", "fa3=2", "--queue", "fa3b", extra_env=env
        ),
    ]
    _wait_done(ids, workers, timeout=40)
    runs = _runs()
    _once(runs, ids)
    peak, where = _peak((r for r in runs if r["kind"] == "fa3.k2"), lambda r: 1)
    assert peak <= 2, where
    spans = [(a, b) for _, a, b in _rate_spans(rated)]
    assert _sound_window_violations(spans, 20.0, 4) == []
    _stop(workers)
    _clean_logs(workers)


def _claim_calls() -> int:
    with pg() as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
            " WHERE schemaname = 'awa' AND funcname = 'claim_v3'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_no_busy_polling_while_a_kind_binds(manage_py: Callable[..., ManagedProcess]) -> None:
    """A kind limited to 1 runs a long job; 40 more of it wait (parked) and nothing else is
    there. docs/flow.md: a claim that ran out of permits waits for one of its own handlers to
    end or for POLL_INTERVAL (no busy polling), also for workers that start with a backlog
    (their backlog retry backs off to POLL_INTERVAL). Two workers make at most a few claims per
    POLL_INTERVAL (0.05 s) each over 3 s."""
    _tables()
    with pg() as c:
        c.execute("SELECT current_database()")
        name = c.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        c.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")
    try:
        awa_django.enqueue("fa3.k1", kwargs={"seconds": 4.5})
        for _ in range(40):
            awa_django.enqueue("fa3.k1")
        workers = _workers(manage_py, 2, concurrency=4)
        wait_for(lambda: _running_of("fa3.k1"), timeout=15, message="the long job running")
        with pg() as c:
            wait_for(
                lambda: (
                    c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()[0]  # type: ignore[index]
                    == 40
                ),
                timeout=10,
                message="40 jobs parked",
            )
        before = _claim_calls()
        t0 = _db_now()
        wait_for(
            lambda: (_db_now() - t0).total_seconds() >= 3.0,
            timeout=10,
            interval=0.2,
            message="3 s to pass on the database clock",
        )
        calls = _claim_calls() - before
        # Two workers polling every 0.05 s make ~120 claims in 3 s (stats flush lag of 1 s
        # either way); busy polling makes thousands.
        assert 0 < calls <= 400, f"{calls} claim_v3 calls in 3 s while the kind binds"
        for w in workers:
            w.kill()
    finally:
        with pg() as c:
            c.execute(f'ALTER DATABASE "{name}" RESET track_functions')


def test_cleared_kind_limit_unparks_everything(manage_py: Callable[..., ManagedProcess]) -> None:
    """A kind the operator limited to 1 runs a long job and 30 more wait, parked; some of them
    heavier than the workers' slots. The operator clears the limit (no limit in code or
    settings): docs/flow.md, jobs of kinds whose limits were cleared are un-parked by the next
    claim. They all run while the long job still runs, several at once."""
    _tables()
    _set_limit("fa3.plain", 1)
    long = awa_django.enqueue("fa3.plain", kwargs={"seconds": 5.0}).id
    workers = _workers(manage_py, 2, concurrency=4)
    wait_for(lambda: _running_of("fa3.plain"), timeout=15, message="the long job running")
    rest = [
        awa_django.enqueue("fa3.plain", kwargs={"seconds": 0.1}, weight=1 + 5 * (i % 4 == 0)).id
        for i in range(30)
    ]
    with pg() as c:
        wait_for(
            lambda: (
                c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()[0]  # type: ignore[index]
                == 30
            ),
            timeout=10,
            message="30 jobs parked",
        )
    clear_kind_limits("fa3.plain", actor="fa3")
    _wait_done(rest, workers, timeout=4.5)
    runs = {r["job_id"]: r for r in _runs()}
    assert runs[long]["ended"] is None, "the parked jobs waited for the long one"
    peak, _ = _peak((r for r in runs.values() if r["job_id"] in rest), lambda r: 1)
    assert peak > 1
    _clean_logs(workers)


def test_operator_kind_override_survives_worker_start(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """docs/flow.md: an operator's kind limit wins over settings, also across worker restarts,
    until cleared, which writes the project's settings back. A kind limited to 5 in code is set
    to 1 by the operator; workers starting (and writing the settings of their kinds) leave it
    at 1, and their drain holds it; cleared, it is 5 again."""
    from awa_django.operator import kind_limits

    _tables()
    _set_limit("fa3.k5", 1)
    ids = [awa_django.enqueue("fa3.k5", kwargs={"seconds": 0.02}).id for _ in range(25)]
    workers = _workers(manage_py, 2, concurrency=4)
    wait_for(
        lambda: all(
            "flow limits from settings" in w.output() or "started" in w.output() for w in workers
        ),
        timeout=15,
        message="the workers started",
    )
    _wait_done(ids, workers, timeout=20)
    (row,) = [k for k in kind_limits() if k.kind == "fa3.k5"]
    assert (row.global_concurrency, row.source) == (1, "operator")
    peak, where = _peak((r for r in _runs() if r["kind"] == "fa3.k5"), lambda r: 1)
    assert peak <= 1, where
    clear_kind_limits("fa3.k5", actor="fa3")
    (row,) = [k for k in kind_limits() if k.kind == "fa3.k5"]
    assert (row.global_concurrency, row.source) == (5, "settings")
    _stop(workers)


def test_key_order_while_its_oldest_job_waits_for_its_kind(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """The oldest job of each of three serial keys is of a kind limited to 1 that a long job
    holds; younger jobs of the keys are of no limited kind. docs/flow.md: they park behind it,
    and while it waits the leader's sweep (every RESCUE_INTERVAL, 0.2 s here) may hand a key on
    to a younger job, which parks again at once: one at a time and enqueue order within the key
    hold. None of the younger jobs starts before its key's oldest job ended."""
    _tables()
    workers = _workers(manage_py, 2, concurrency=4)
    long = awa_django.enqueue("fa3.k1", kwargs={"seconds": 2.5}).id
    wait_for(lambda: _running_of("fa3.k1"), timeout=15, message="the long job running")
    keys: dict[int, str] = {}
    ids = [long]
    for key in ("x", "y", "w"):
        for kind in ("fa3.k1", "fa3.free", "fa3.free2", "fa3.free"):
            job = awa_django.enqueue(kind, kwargs={"seconds": 0.02}, serial_key=key)
            keys[job.id] = key
            ids.append(job.id)
    _wait_done(ids, workers, timeout=25)
    runs = _runs()
    _once(runs, ids)
    assert _serial_order(runs, keys) == []
    _stop(workers)
    _clean_logs(workers)


def test_parked_heavy_job_not_stranded_sql() -> None:
    """The SQL form of test_parked_heavy_job_not_stranded_on_small_workers: two claim sessions of 2
    slots, jobs of weight 3 of a kind limited to 3 (each counts 2: the slots). The first holds
    2 permits; the second's job cannot have 2 and is parked. Once the first hands its permits
    back, rounds of claims of both sessions must take the parked job."""
    _set_limit("fa3.k3", 3)
    a_id = awa_django.enqueue("fa3.k3", weight=3).id
    b_id = awa_django.enqueue("fa3.k3", weight=3).id
    a, b = _Session(2), _Session(2)
    try:
        assert [j["job_id"] for j in a.claim("fa3", [])] == [a_id]
        assert b.claim("fa3", []) == []
        with pg() as c:
            assert c.execute("SELECT job_id FROM awa.flow_waiting").fetchall() == [(b_id,)]
        got = [j["job_id"] for j in a.claim("fa3", [a_id])]  # the hand-back claims too
        got += [j["job_id"] for _ in range(5) for s in (a, b) for j in s.claim("fa3", [])]
        assert got == [b_id]
    finally:
        a.conn.close()
        b.conn.close()


@pytest.mark.slow
def test_queue_rate_and_kind_rate_together(manage_py: Callable[..., ManagedProcess]) -> None:
    """A queue limited to 25 jobs/s (burst 3) holds jobs of a kind limited to 20/s (burst 4),
    of a kind limited to 2 at once and 30/s (burst 3), and free jobs, on two workers.
    docs/flow.md: queue limits and kind limits both apply to a job: over any window of t
    seconds at most 25 t + 3 jobs of the queue start, at most 20 t + 4 of the first kind,
    30 t + 3 of the second; every job runs once."""
    from awa_django.operator import set_queue_limits

    _tables()
    set_queue_limits("fa3r", rate_limit=25.0, rate_burst=3, actor="fa3")
    ids = []
    for i in range(75):
        kind = ["fa3.rated", "fa3.free", "fa3.both"][i % 3]
        ids.append(awa_django.enqueue(kind, queue="fa3r").id)
    workers = _workers(manage_py, 2, concurrency=4, queues=("fa3r",))
    _wait_done(ids, workers, timeout=30)
    _once(_runs(), ids)
    spans = _rate_spans(ids)
    bad = _sound_window_violations([(a, b) for _, a, b in spans], 25.0, 3)
    for kind, (rate, burst) in _RATES.items():
        mine = [(a, b) for k, a, b in spans if k == kind]
        bad += [f"{kind}: {v}" for v in _sound_window_violations(mine, rate, burst)]
    assert bad == [], bad[:5]
    _stop(workers)
    _clean_logs(workers)


@pytest.mark.slow
def test_whole_fleet_killed_with_jobs_parked(manage_py: Callable[..., ManagedProcess]) -> None:
    """Every worker is SIGKILLed while one job of a kind limited to 1 runs and 20 more wait
    parked (with serial keys among them). docs/flow.md: parked jobs are rows, tied to no
    session, never stranded. A worker started afterwards runs every job, the kind one at a
    time, each key in enqueue order (the killed job is cancelled: its retry would hold the
    kind for another 30 s)."""
    _tables()
    overrides = {"HEARTBEAT_STALENESS": 2.0, "RESCUE_INTERVAL": 0.2}
    first = _workers(manage_py, 2, concurrency=3, overrides=overrides)
    long = awa_django.enqueue("fa3.k1", kwargs={"seconds": 30.0}).id
    wait_for(lambda: _running_of("fa3.k1"), timeout=15, message="the long job running")
    ids, keys = [long], {}
    for i in range(20):
        key = f"f{i % 2}" if i % 3 == 0 else None
        job = awa_django.enqueue("fa3.k1", kwargs={"seconds": 0.01}, serial_key=key)
        ids.append(job.id)
        if key:
            keys[job.id] = key
    with pg() as c:
        wait_for(
            lambda: (
                c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()[0]  # type: ignore[index]
                >= 10
            ),
            timeout=10,
            message="jobs parked",
        )
    for w in first:
        w.kill()
    # The long job's attempt died with its worker; cancelled, so that no retry of it holds
    # the kind's permit for another 30 s.
    assert awa_django.cancel(long) == "running"
    with pg() as c:
        c.execute("UPDATE fa3_runs SET ended = clock_timestamp() WHERE ended IS NULL")
    # The killed attempt is cancelled, and its permit went with its session: the later worker
    # needs no quick rescue, and a production-like staleness keeps a loaded machine's slow
    # heartbeat from retrying a live attempt (which failed "ran once" in one full run).
    later = _workers(
        manage_py, 1, concurrency=3, overrides={**overrides, "HEARTBEAT_STALENESS": 60.0}
    )
    _wait_done(ids[1:], later, timeout=30)
    runs = [r for r in _runs() if r["job_id"] != long]
    _once(runs, ids[1:])
    peak, where = _peak((r for r in runs if r["kind"] == "fa3.k1"), lambda r: 1)
    assert peak <= 1, where
    assert _serial_order(runs, keys) == []
    later[0].kill()


@pytest.mark.slow
def test_kind_rate_is_reached_under_contention(manage_py: Callable[..., ManagedProcess]) -> None:
    """docs/flow.md: parked by the rate, the kind runs at its rate while the queue's other jobs
    are picked up at once. Three workers of 8 slots contend for 44 jobs of a kind limited to
    20/s (burst 4) among 132 free jobs: the kind's starts span about (44 - 4) / 20 = 2 s,
    never under it (the rate holds) and not much over (tokens the claims ask for up front and
    give back do not starve it): within 1.6 times that plus half a second."""
    _tables()
    rated, ids = [], []
    for i in range(176):
        job = awa_django.enqueue("fa3.rated" if i % 4 == 0 else "fa3.free")
        ids.append(job.id)
        if i % 4 == 0:
            rated.append(job.id)
    workers = _workers(manage_py, 3, concurrency=8)
    _wait_done(ids, workers, timeout=30)
    with pg() as c:
        row = c.execute(
            "SELECT extract(epoch FROM max(attempted_at) - min(attempted_at)) FROM awa.jobs"
            " WHERE id = ANY(%s)",
            [rated],
        ).fetchone()
    assert row is not None
    span = float(row[0])
    assert 2.0 - 0.1 <= span <= 2.0 * 1.6 + 0.5, f"44 jobs at 20/s (burst 4) took {span:.2f} s"
    _stop(workers)
    _clean_logs(workers)


def test_several_rated_kinds_in_crossed_lane_orders(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Four kinds limited by rate (one also to 2 at once) meet in lanes of four priorities,
    each lane leading with another kind, beside free jobs, on three workers. docs/flow.md: a
    claim waits only for the rate state of the first rate-limited kind it meets and passes over
    a later one another claim holds, "so two claims never wait for each other": no deadlock, no
    claim error in any worker's log, each kind within its rate over every window, every job
    once."""
    _tables()
    kinds = ["fa3.rated", "fa3.r1", "fa3.r2", "fa3.r3"]
    rates = {"fa3.rated": (20.0, 4), "fa3.r1": (40.0, 4), "fa3.r2": (40.0, 4), "fa3.r3": (40.0, 4)}
    ids = []
    for i in range(40):
        for p in range(4):
            order = kinds[p:] + kinds[:p]
            kind = order[i % 4] if i % 5 else "fa3.free"
            ids.append(awa_django.enqueue(kind, priority=p * 5, kwargs={"seconds": 0.01}).id)
    workers = _workers(manage_py, 3, concurrency=6)
    _wait_done(ids, workers, timeout=40)
    runs = _runs()
    _once(runs, ids)
    # A job's token was taken between its claim's transaction start (attempted_at) and its
    # handler's start: only a window that holds both ends of more jobs than the rate allows is
    # a violation whatever the claims' clocks were.
    spans = _rate_spans(ids)
    bad = []
    for kind, (rate, burst) in rates.items():
        mine = [(a, b) for k, a, b in spans if k == kind]
        bad += [f"{kind}: {v}" for v in _sound_window_violations(mine, rate, burst)]
    assert bad == [], bad[:5]
    peak, where = _peak((r for r in runs if r["kind"] == "fa3.r3"), lambda r: 1)
    assert peak <= 2, where
    for w in workers:
        assert "deadlock" not in w.output(), w.output()[-3000:]
    _stop(workers)
    _clean_logs(workers)


@pytest.mark.slow
def test_parked_job_not_stranded_by_per_queue_cap(manage_py: Callable[..., ManagedProcess]) -> None:
    """The stranding with a per-queue cap instead of small processes: three workers of 8 slots
    serving the queue with ``--queue fa3=1``, jobs of weight 2 of a kind limited to 2 (each
    counts 1: the cap). Two run (one permit each); the third worker's job is parked; it must
    run once they end."""
    _tables()
    env = worker_env(kind_limit_fast_path)
    workers = [
        manage_py("awa_worker", "--concurrency", "8", "--queue", "fa3=1", extra_env=env)
        for _ in range(3)
    ]
    ids = [awa_django.enqueue("fa3.k2", kwargs={"seconds": 0.8}, weight=2).id for _ in range(2)]
    wait_for(lambda: len(_runs()) == 2, timeout=15, message="two running")
    ids.append(awa_django.enqueue("fa3.k2", weight=2).id)
    with pg() as c:
        wait_for(
            lambda: c.execute("SELECT 1 FROM awa.flow_waiting").fetchone() or _done(ids[2:]),
            timeout=10,
            message="the third parked (or run)",
        )
    _wait_done(ids, workers, timeout=5)
    _stop(workers)


@pytest.mark.parametrize("burst", [1, None], ids=["burst1", "default_burst"])
def test_parked_heavy_job_not_stranded_by_burst_one(burst: int | None) -> None:
    """A kind limited to 2 at once and 10/s with a burst of 1; jobs of weight 2, claim sessions
    of 8 slots (nothing small here). docs/flow.md: a rate limit counts jobs started, not
    weight; a parked job is never stranded. The first job runs (2 permits); the second is
    parked; once the first is handed back, claims over the next second must take it. The
    default burst at 10/s is ceil(10 / 10) = 1: the same."""
    set_kind_limits(
        "fa3.both", global_concurrency=2, rate_limit=10.0, rate_burst=burst, actor="fa3"
    )
    a_id = awa_django.enqueue("fa3.both", weight=2).id
    b_id = awa_django.enqueue("fa3.both", weight=2).id
    a, b = _Session(8), _Session(8)
    try:
        assert [j["job_id"] for j in a.claim("fa3", [])] == [a_id]
        assert b.claim("fa3", []) == []
        with pg() as c:
            assert c.execute("SELECT job_id FROM awa.flow_waiting").fetchall() == [(b_id,)]
        # The hand-back claims too: once the next token is due (0.1 s), it may take the job.
        back = [j["job_id"] for j in a.claim("fa3", [a_id])]
        got = back or wait_for(
            lambda: [j["job_id"] for s in (a, b) for j in s.claim("fa3", [])],
            timeout=5,
            message="the parked job to be claimed",
        )
        assert got == [b_id]
    finally:
        a.conn.close()
        b.conn.close()


@pytest.mark.slow
def test_parked_heavy_job_not_stranded_by_burst_one_workers(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """The burst-1 stranding on real workers of 4 slots: a kind limited to 2 at once and
    10/s with a burst of 1, three jobs of weight 2. They must all run within a few seconds
    (0.1 s apart by the rate, one at a time by the permits)."""
    _tables()
    set_kind_limits("fa3.both", global_concurrency=2, rate_limit=10.0, rate_burst=1, actor="fa3")
    workers = _workers(manage_py, 2, concurrency=4)
    ids = [awa_django.enqueue("fa3.both", kwargs={"seconds": 0.3}, weight=2).id for _ in range(3)]
    _wait_done(ids, workers, timeout=6)
    _stop(workers)
