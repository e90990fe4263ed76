"""Hostile tests of flow control (issue 16), third round: the claim's fast path for limited
kinds (the kind asked for the units left up front, the second pass after an unlimited run, the
probe before the lane lock), judged only by what docs/flow.md promises.

Workers are real subprocesses (``manage_py``); handlers record their runs with the database
clock in ``fa3_runs`` (tests/flowatk3jobs.py), and the checks are computed from those intervals:
a handler's run lies inside the time its permits and keys are held, so two runs that overlap
held their permits at the same time.
"""

from __future__ import annotations

import json
import signal
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import pytest

import awa_django
from awa_django.operator import clear_kind_limits, set_kind_limits
from tests import flowatk3jobs
from tests.flowatk3jobs import FA3_OVERRIDES, FA3_TABLES
from tests.helpers import ManagedProcess, pg, wait_for

pytestmark = pytest.mark.usefixtures("clean_awa")

assert flowatk3jobs  # registers the kinds in this process too (enqueue by name)

Run = dict[str, Any]


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
    env = {"AWA_TEST_OVERRIDES": json.dumps({**FA3_OVERRIDES, **(overrides or {})})}
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
        for a, b in zip(rs, rs[1:], strict=False):
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
    for i in range(180):
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
    workers = _workers(manage_py, 3, concurrency=slots)
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
