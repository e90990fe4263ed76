"""A model of raw ``awa.claim_v3`` claimers for tests/storage/test_kind_limit_claim_walks.py.

Each :class:`Claimer` is one worker-style connection that claims through ``awa.claim_v3`` with
the permits and serial run locks of its running attempts as ``p_held``/``p_serial_held`` and
those of ended attempts as ``p_release``/``p_serial_release``, exactly as the worker does. The
:class:`World` knows every job it enqueued and checks, after every claim, the invariants of
docs/flow.md ("Per kind", "Per-key serialisation"):

- a claimed row carries exactly ``min(weight, limit)`` keys of its own kind (``i`` in
  ``0 .. limit - 1``) and, for a queue limit, ``min(weight, queue limit)`` queue keys, and for a
  job heavier than a limit free keys above the limit up to its weight; no key of another kind,
  no key twice;
- no permit key is carried by two attempts that still hold their permits (across claimers);
- every permit a claimer's attempts carry is held by that claimer's backend (``pg_locks``) and
  its backend holds no permit (class 4282182) that none of its attempts carries;
- per kind, the keys held (over ``0 .. max(limit, seen) - 1``) never pass the limit right
  after a claim that started a job of the kind;
- a job starts at most once; a job of a serial key starts only after every older job of its
  key ended (completed or cancelled) and released the key.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import psycopg

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.support.database import pg
from tests.support.polling import wait_for

__all__ = [
    "COLUMNS",
    "PERMIT_CLASS",
    "SERIAL_CLASS",
    "A",
    "Attempt",
    "B",
    "C",
    "Claimer",
    "F",
    "Job",
    "R",
    "World",
    "assert_clean",
    "assert_no_permit_held",
    "drain",
    "note_holders",
    "open_world",
    "stuck",
]

#: The kinds of the walks: three limited by concurrency, one by rate, one free.
A, B, C, R, F = "kfa.a", "kfa.b", "kfa.c", "kfa.rate", "kfa.free"

PERMIT_CLASS = 4282182
SERIAL_CLASS = 4282183

COLUMNS = (
    "job_id, run_lease, claim_slot, kind, queue, weight, permits, serial_lock, wait_secs, metadata"
)


@dataclasses.dataclass
class Attempt:
    job_id: int
    run_lease: int
    claim_slot: int
    kind: str
    weight: int
    permits: list[int]
    serial_lock: int | None
    serial_key: str | None
    claimer: int


@dataclasses.dataclass
class Job:
    job_id: int
    kind: str
    weight: int
    serial_key: str | None
    state: str = "available"  # available, running, done, cancelled


def _int_array(values: Iterable[int]) -> list[int]:
    return sorted(values)


class Claimer:
    """One claim connection (autocommit, READ COMMITTED) with its running attempts."""

    def __init__(self, conninfo: str, index: int) -> None:
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.conn.execute("SET default_transaction_isolation = 'read committed'")
        self.index = index
        self.worker = uuid.uuid4()
        self.pid = int(self.conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        self.running: dict[int, Attempt] = {}
        self.release: list[int] = []
        self.serial_release: list[int] = []

    def held(self) -> list[int]:
        return [k for a in self.running.values() for k in a.permits]

    def serial_held(self) -> list[int]:
        return [a.serial_lock for a in self.running.values() if a.serial_lock is not None]

    def claim(self, queue: str, units: int, max_weight: int | None = None) -> list[dict[str, Any]]:
        cur = self.conn.cursor(row_factory=psycopg.rows.dict_row)
        rows = cur.execute(
            f"SELECT {COLUMNS} FROM awa.claim_v3(p_queue => %s, p_max => %s, p_worker => %s, "
            "p_max_weight => %s, p_held => %s, p_release => %s, p_serial_held => %s, "
            "p_serial_release => %s)",
            [
                queue,
                units,
                self.worker,
                max_weight,
                self.held(),
                self.release,
                self.serial_held(),
                self.serial_release,
            ],
        ).fetchall()
        self.release = []
        self.serial_release = []
        return rows

    def finish(self, job_ids: Sequence[int], outcome: str = "completed") -> list[tuple[int, int]]:
        items = [
            Finalization(a.job_id, a.run_lease, a.claim_slot, outcome)
            for a in (self.running[j] for j in job_ids)
        ]
        stale = storage.finalize(self.conn, items)
        for j in job_ids:
            a = self.running.pop(j)
            self.release.extend(a.permits)
            if a.serial_lock is not None:
                self.serial_release.append(a.serial_lock)
        return stale

    def adopt_and_end_some(
        self,
        rows: Sequence[dict[str, Any]],
        chance: random.Random,
        lock: threading.Lock,
        owners: dict[int, int],
        keys_running: dict[str, int],
    ) -> None:
        """Take claimed ``rows`` as running attempts, then end about 60 % of all running ones
        (completed): first, under ``lock``, their permits and serial keys leave ``owners`` and
        ``keys_running`` (the shared view of who holds what that concurrent tests check claims
        against; a permit or key is free for others only after the next claim hands it back,
        so forgetting it here hides nothing)."""
        for row in rows:
            self.running[row["job_id"]] = Attempt(
                row["job_id"],
                row["run_lease"],
                row["claim_slot"],
                row["kind"],
                row["weight"] or 1,
                list(row["permits"] or []),
                row["serial_lock"],
                (row["metadata"] or {}).get("awa:serial"),
                self.index,
            )
        done = [j for j in self.running if chance.random() < 0.6]
        if done:
            with lock:
                for j in done:
                    for k in self.running[j].permits:
                        owners.pop(k, None)
                    if self.running[j].serial_key is not None:
                        keys_running.pop(self.running[j].serial_key, None)
            self.finish(done)

    def locks(self) -> set[int]:
        """The permit keys (class 4282182) this claimer's backend holds, as signed int4."""
        rows = self.conn.execute(
            "SELECT ((objid::bigint # 2147483648) - 2147483648)::int FROM pg_locks "
            "WHERE locktype = 'advisory' AND granted AND classid = %s AND objsubid = 2 "
            "AND pid = %s",
            [PERMIT_CLASS, self.pid],
        ).fetchall()
        return {r[0] for r in rows}

    def close(self) -> None:
        self.conn.close()


class World:
    """The jobs enqueued, the claimers, the limits in force, and the invariants."""

    def __init__(self, conninfo: str, queue: str, claimers: int) -> None:
        self.conninfo = conninfo
        self.queue = queue
        self.admin = psycopg.connect(conninfo, autocommit=True)
        self.claimers = [Claimer(conninfo, i) for i in range(claimers)]
        self.jobs: dict[int, Job] = {}
        self.limits: dict[str, int | None] = {}
        self.rates: dict[str, tuple[float, int] | None] = {}
        self.queue_limit: int | None = None
        self.violations: list[str] = []
        self.starts: list[int] = []

    # ---- writes -------------------------------------------------------------------------
    def enqueue(
        self,
        specs: Sequence[tuple[str, int, str | None]],
        *,
        rollback: bool = False,
        conn: psycopg.Connection[Any] | None = None,
        priority: int = 0,
    ) -> list[int]:
        """Enqueue ``(kind, weight, serial_key)`` jobs in one transaction (rolled back if
        ``rollback``: a gap in the lane)."""
        payload = []
        for kind, weight, key in specs:
            meta: dict[str, Any] = {}
            if weight != 1:
                meta["awa:weight"] = weight
            if key is not None:
                meta["awa:serial"] = key
            payload.append(
                {"kind": kind, "queue": self.queue, "priority": priority, "metadata": meta or None}
            )
        own = conn is None
        c = conn or psycopg.connect(self.conninfo)
        try:
            rows = c.execute(
                "SELECT job_id FROM awa.enqueue_v1(%s::jsonb)", [json.dumps(payload)]
            ).fetchall()
            ids = [r[0] for r in rows]
            if rollback:
                c.rollback()
                return []
            c.commit()
        finally:
            if own:
                c.close()
        for job_id, (kind, weight, key) in zip(ids, specs, strict=True):
            self.jobs[job_id] = Job(job_id, kind, weight, key)
        return ids

    def cancel(self, job_id: int) -> str:
        row = self.admin.execute("SELECT awa.cancel_v1(%s)", [job_id]).fetchone()
        assert row is not None
        if row[0] is not None and self.jobs[job_id].state == "available":
            self.jobs[job_id].state = "cancelled"
        return str(row[0])

    def set_kind(
        self, kind: str, limit: int | None, rate: float | None = None, burst: int | None = None
    ) -> None:
        if limit is None and rate is None:
            self.admin.execute(
                "SELECT * FROM awa.flow_kind_set_v1(%s, NULL, NULL, NULL, 'katk2', true)", [kind]
            )
        else:
            self.admin.execute(
                "SELECT * FROM awa.flow_kind_set_v1(%s, %s, %s, %s, 'katk2', false)",
                [kind, limit, rate, burst],
            )
        self.limits[kind] = limit
        self.rates[kind] = (rate, burst or 1) if rate is not None else None

    def set_queue(self, limit: int | None) -> None:
        if limit is None:
            self.admin.execute(
                "SELECT * FROM awa.flow_set_v1(%s, NULL, NULL, NULL, 'katk2', true)", [self.queue]
            )
        else:
            self.admin.execute(
                "SELECT * FROM awa.flow_set_v1(%s, %s, NULL, NULL, 'katk2', false)",
                [self.queue, limit],
            )
        self.queue_limit = limit

    # ---- claims and checks --------------------------------------------------------------
    def kind_keys(self, kind: str, n: int) -> list[int]:
        if n <= 0:
            return []
        rows = self.admin.execute(
            "SELECT awa._flow_kind_key_v1(%s, i) FROM generate_series(0, %s - 1) i", [kind, n]
        ).fetchall()
        return [r[0] for r in rows]

    def queue_keys(self, n: int) -> list[int]:
        if n <= 0:
            return []
        rows = self.admin.execute(
            "SELECT awa._flow_key_v1(%s, i) FROM generate_series(0, %s - 1) i", [self.queue, n]
        ).fetchall()
        return [r[0] for r in rows]

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def claim(self, index: int, units: int, max_weight: int | None = None) -> list[Attempt]:
        claimer = self.claimers[index]
        rows = claimer.claim(self.queue, units, max_weight)
        started = []
        for row in rows:
            if row["job_id"] is None:
                continue
            started.append(self._started(claimer, row, max_weight))
        self.check_after_claim({a.kind for a in started})
        return started

    def _started(
        self, claimer: Claimer, row: dict[str, Any], max_weight: int | None = None
    ) -> Attempt:
        job_id = row["job_id"]
        job = self.jobs.get(job_id)
        if job is None:
            self.fail(f"claimed job {job_id} that was never enqueued (a rolled-back row?)")
            job = self.jobs[job_id] = Job(job_id, row["kind"], row["weight"] or 1, None)
        if job.state != "available":
            self.fail(f"job {job_id} claimed while {job.state}")
        if row["kind"] != job.kind:
            self.fail(f"job {job_id} claimed as kind {row['kind']!r}, enqueued as {job.kind!r}")
        job.state = "running"
        self.starts.append(job_id)
        # A weight above what could ever fit counts as that bound (docs/flow.md, "Weights"):
        # the claimer's max_weight and the queue's global limit.
        weight = min(job.weight, max_weight or job.weight, self.queue_limit or job.weight)
        permits = list(row["permits"] or [])
        meta = row["metadata"] or {}
        key = meta.get("awa:serial") if isinstance(meta, dict) else None
        attempt = Attempt(
            job_id,
            row["run_lease"],
            row["claim_slot"],
            row["kind"],
            weight,
            permits,
            row["serial_lock"],
            job.serial_key,
            claimer.index,
        )
        if key != job.serial_key:
            self.fail(f"job {job_id} carries serial key {key!r}, enqueued with {job.serial_key!r}")
        # Its permits: min(weight, limit) of its own kind's keys, the queue's, and for a job
        # heavier than a limit the free keys above that limit up to its weight as the claimer
        # counts it (so that a raised limit counts it in full); nothing else.
        limit = self.limits.get(job.kind)
        full = min(job.weight, max_weight or job.weight)
        own = set(self.kind_keys(job.kind, limit or 0))
        own_above = set(self.kind_keys(job.kind, full)) - own if limit else set()
        qkeys = set(self.queue_keys(self.queue_limit or 0))
        q_above = set(self.queue_keys(full)) - qkeys if self.queue_limit else set()
        kind_part = [k for k in permits if k in own]
        queue_part = [k for k in permits if k in qkeys]
        above = [k for k in permits if k in own_above or k in q_above]
        foreign = [k for k in permits if k not in own and k not in qkeys and k not in above]
        if len(set(permits)) != len(permits):
            self.fail(f"job {job_id} ({job.kind}) carries a permit twice: {permits}")
        if foreign:
            others = {
                other
                for other, lim in self.limits.items()
                if other != job.kind
                and set(self.kind_keys(other, max(lim or 0, 16))) & set(foreign)
            }
            self.fail(
                f"job {job_id} ({job.kind}, weight {job.weight}) carries foreign permits "
                f"{foreign} (kinds {sorted(others)})"
            )
        want = min(weight, limit) if limit else 0
        if len(kind_part) != want:
            self.fail(
                f"job {job_id} ({job.kind}, weight {job.weight}, limit {limit}) carries "
                f"{len(kind_part)} kind permits, not {want}"
            )
        qwant = min(weight, self.queue_limit) if self.queue_limit else 0
        if len(queue_part) != qwant:
            self.fail(
                f"job {job_id} (weight {job.weight}, queue limit {self.queue_limit}) carries "
                f"{len(queue_part)} queue permits, not {qwant}"
            )
        # Serial: every older job of its key ended and released the key.
        if job.serial_key is not None:
            for other in self.jobs.values():
                if other.serial_key != job.serial_key or other.job_id == job_id:
                    continue
                if other.job_id < job_id and other.state in ("available", "running"):
                    self.fail(
                        f"job {job_id} of key {job.serial_key} started before older job "
                        f"{other.job_id} ({other.state})"
                    )
            for c in self.claimers:
                for a in c.running.values():
                    if a.serial_key == job.serial_key:
                        self.fail(
                            f"job {job_id} of key {job.serial_key} started while job "
                            f"{a.job_id} of the key still runs"
                        )
                if c is not claimer and row["serial_lock"] in c.serial_release:
                    self.fail(
                        f"job {job_id} of key {job.serial_key} started before job of the key's "
                        f"claimer {c.index} handed its key back"
                    )
        claimer.running[job_id] = attempt
        return attempt

    def check_after_claim(self, started_kinds: set[str]) -> None:
        # No permit carried by two attempts that hold their permits.
        owners: dict[int, int] = {}
        for c in self.claimers:
            for a in c.running.values():
                for k in a.permits:
                    if k in owners and owners[k] != a.job_id:
                        self.fail(f"permit {k} carried by jobs {owners[k]} and {a.job_id}")
                    owners[k] = a.job_id
        # Each claimer's backend holds exactly the permits its attempts carry (plus those it
        # will release with its next claim).
        for c in self.claimers:
            have = c.locks()
            carry = set(c.held()) | set(c.release)
            if carry - have:
                self.fail(f"claimer {c.index} does not hold permits {sorted(carry - have)}")
            if have - carry:
                self.fail(
                    f"claimer {c.index} holds permits no attempt carries: {sorted(have - carry)}"
                )
        # Per kind: the keys held never pass the limit after a claim that started the kind.
        for kind in started_kinds:
            limit = self.limits.get(kind)
            if not limit:
                continue
            row = self.admin.execute(
                "SELECT in_use FROM awa.flow_kind_status_v1() WHERE kind = %s", [kind]
            ).fetchone()
            if row is not None and row[0] is not None and row[0] > limit:
                self.fail(f"kind {kind}: {row[0]} permits in use, limit {limit}")
            # Attempts started while the kind had no limit carry no permits and do not count
            # (docs/flow.md); the others count the kind permits they carry, a job heavier than
            # the limit counting as the limit.
            own = set(self.kind_keys(kind, 64))
            units = sum(
                min(len([k for k in a.permits if k in own]), limit)
                for c in self.claimers
                for a in c.running.values()
                if a.kind == kind
            )
            if units > limit:
                self.fail(f"kind {kind}: running attempts weigh {units}, limit {limit}")

    def finish(self, index: int, job_ids: Sequence[int]) -> None:
        claimer = self.claimers[index]
        stale = claimer.finish(job_ids)
        if stale:
            self.fail(f"completions refused as stale: {stale}")
        for j in job_ids:
            self.jobs[j].state = "done"

    def finish_all(self) -> None:
        for c in self.claimers:
            if c.running:
                self.finish(c.index, list(c.running))

    def flush(self) -> None:
        """Hand back every claimer's ended permits and keys (a claim of 0 units)."""
        for c in self.claimers:
            c.claim(self.queue, 0)

    def live(self) -> int:
        row = self.admin.execute(
            "SELECT count(*) FROM awa.live_jobs WHERE queue = %s", [self.queue]
        ).fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        for c in self.claimers:
            c.close()
        self.admin.close()


def open_world(conninfo: str, queue: str) -> Iterator[World]:
    """A ``World`` of three claimers on ``queue`` for a fixture, closed after the test."""
    w = World(conninfo, queue, 3)
    try:
        yield w
    finally:
        w.close()


def assert_no_permit_held(conn: psycopg.Connection[Any]) -> None:
    """No permit (class 4282182) is held in this database, and every kind with limits shows
    none in use and none parked."""
    assert conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        [PERMIT_CLASS],
    ).fetchone() == (0,)
    status = conn.execute("SELECT kind, in_use, waiting FROM awa.flow_kind_status_v1()").fetchall()
    assert all(s[1] in (0, None) and s[2] == 0 for s in status), status


def note_holders(
    row: dict[str, Any], owners: dict[int, int], keys_running: dict[str, int], errors: list[str]
) -> None:
    """Record that claimed ``row``'s job holds its permits and serial key, reporting in
    ``errors`` any held by another running job (call under the test's lock)."""
    for k in row["permits"] or []:
        if k in owners:
            errors.append(f"permit {k}: job {row['job_id']} and job {owners[k]}")
        owners[k] = row["job_id"]
    key = (row["metadata"] or {}).get("awa:serial")
    if key is not None:
        if key in keys_running:
            errors.append(f"serial key {key}: job {row['job_id']} and job {keys_running[key]}")
        keys_running[key] = row["job_id"]


def drain(w: World, rng: random.Random, timeout: float = 20.0) -> None:
    """Claim and finish until the queue holds nothing live (rate-limited kinds make it wait on
    the database's clock: the loop waits on the live count, with a deadline)."""

    def step() -> bool:
        # The maintenance leader's serial sweep (no leader runs here): hands on keys whose
        # next job was cancelled.
        w.admin.execute("SELECT awa.serial_sweep_v1()")
        for c in w.claimers:
            w.claim(c.index, rng.randint(1, 8))
            if c.running and rng.random() < 0.8:
                w.finish(c.index, list(c.running))
        w.finish_all()
        return w.live() == 0

    wait_for(step, timeout=timeout, interval=0.02, message=lambda: f"drain: {stuck(w)}")
    w.flush()


def stuck(w: World) -> str:
    with pg() as conn:
        live = conn.execute(
            "SELECT id, kind, state, metadata FROM awa.live_jobs WHERE queue = %s ORDER BY id",
            [w.queue],
        ).fetchall()
        fw = conn.execute("SELECT job_id, kind FROM awa.flow_waiting ORDER BY job_id").fetchall()
        sw = conn.execute("SELECT job_id FROM awa.serial_waiting ORDER BY job_id").fetchall()
        st = conn.execute("SELECT * FROM awa.flow_kind_status_v1()").fetchall()
        locks = conn.execute(
            "SELECT pid, classid, objid FROM pg_locks WHERE locktype = 'advisory'"
        ).fetchall()
    return (
        f"{len(live)} live: {live}\nflow_waiting {fw}\nserial_waiting {sw}\nstatus {st}\n"
        f"locks {locks}\nlimits {w.limits} queue {w.queue_limit}"
    )


def assert_clean(w: World) -> None:
    assert not w.violations, "\n".join(w.violations[:20])
    leaked = {c.index: sorted(c.locks()) for c in w.claimers if c.locks()}
    names = {}
    for kind in (A, B, C, R, F):
        names.update({k: f"{kind}/{i}" for i, k in enumerate(w.kind_keys(kind, 16))})
    names.update({k: f"queue/{i}" for i, k in enumerate(w.queue_keys(16))})
    assert not leaked, {i: [names.get(k, k) for k in keys] for i, keys in leaked.items()}
    with pg() as conn:
        assert_no_permit_held(conn)
        assert conn.execute("SELECT count(*) FROM awa.flow_waiting").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM awa.serial_waiting").fetchone() == (0,)
    done = [j for j in w.jobs.values() if j.state == "done"]
    assert len(w.starts) == len(set(w.starts)) == len(done)
    assert all(j.state in ("done", "cancelled") for j in w.jobs.values())
    with pg() as conn:
        states = dict(
            conn.execute(
                "SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [list(w.jobs)]
            ).fetchall()
        )
    for j in w.jobs.values():
        want = "completed" if j.state == "done" else "cancelled"
        assert states.get(j.job_id) == want, (j, states.get(j.job_id))
