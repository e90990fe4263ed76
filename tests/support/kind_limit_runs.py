"""Worker runs of the kinds of tests/jobs/kind_limits.py, for the tests of per-kind flow limits
(docs/flow.md, "Per kind"): handlers record their runs in ``katk_runs`` and ``katk_gauge``
(tables the ``katk_tables`` fixture makes, loaded as a plugin by tests/conftest.py) and block
on flags in ``katk_flags``; the helpers below read them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.jobs import kind_limits, worker_env
from tests.jobs.kind_limits import lim1
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

__all__ = [
    "BAD_VALUES",
    "TABLES",
    "action",
    "all_completed",
    "apply_roles",
    "check_outputs",
    "children",
    "has_table",
    "is_leader",
    "katk_tables",
    "kind_row",
    "kind_rows",
    "max_overlap",
    "no_leak",
    "one",
    "park_some",
    "peak",
    "q",
    "release",
    "run_starts",
    "runs_per_job",
    "states",
    "wait_completed",
    "wait_kind_limit",
    "window_violations",
    "worker",
]

TABLES = """
DROP TABLE IF EXISTS katk_runs, katk_gauge, katk_flags;
CREATE TABLE katk_runs (job_id bigint, kind text, queue text, attempt int, pid int,
                        started timestamptz, ended timestamptz);
CREATE TABLE katk_gauge (name text PRIMARY KEY, cur int, peak int);
CREATE TABLE katk_flags (name text PRIMARY KEY);
GRANT ALL ON katk_runs, katk_gauge, katk_flags TO PUBLIC;
"""


@pytest.fixture
def katk_tables(transactional_db: None) -> Any:
    with pg() as c:
        c.execute(TABLES)
    yield
    with pg() as c:
        c.execute("DROP TABLE IF EXISTS katk_runs, katk_gauge, katk_flags")


def q(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with pg() as c:
        cur = c.execute(sql, params or [])
        return list(cur.fetchall()) if cur.description else []


def one(sql: str, params: list[Any] | None = None) -> Any:
    rows = q(sql, params)
    return rows[0][0] if rows else None


def worker(
    manage_py: Callable[..., ManagedProcess],
    *args: str,
    overrides: dict[str, Any] | None = None,
) -> ManagedProcess:
    env = worker_env(kind_limits, **(overrides or {}))
    return manage_py("awa_worker", *args, extra_env=env)


def kind_row(kind: str) -> Any:
    from awa_django.operator.reads import kind_limits

    for row in kind_limits():
        if row.kind == kind:
            return row
    return None


def wait_kind_limit(kind: str, gc: int | None = None, timeout: float = 20) -> Any:
    def ok() -> Any:
        row = kind_row(kind)
        if row is None:
            return None
        if gc is not None and row.global_concurrency != gc:
            return None
        return row

    return wait_for(ok, timeout=timeout, message=f"kind limit row of {kind}")


def peak(name: str) -> int:
    return int(one("SELECT peak FROM katk_gauge WHERE name = %s", [name]) or 0)


def release(flag: str) -> None:
    with pg() as c:
        c.execute("INSERT INTO katk_flags VALUES (%s) ON CONFLICT DO NOTHING", [flag])


def states(ids: list[int]) -> dict[int, str]:
    return dict(q("SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [ids]))


def all_completed(ids: list[int]) -> bool:
    s = states(ids)
    return len(s) == len(ids) and all(v == "completed" for v in s.values())


def wait_completed(ids: list[int], procs: list[ManagedProcess], timeout: float = 60) -> None:
    def msg() -> str:
        s = states(ids)
        counts: dict[str, int] = {}
        for v in s.values():
            counts[v] = counts.get(v, 0) + 1
        out = "\n".join(p.output()[-3000:] for p in procs)
        return f"all jobs completed; states {counts}; kinds {kind_rows()}\n{out}"

    wait_for(lambda: all_completed(ids), timeout=timeout, interval=0.1, message=msg)


def kind_rows() -> list[Any]:
    from awa_django.operator.reads import kind_limits

    return list(kind_limits())


def no_leak(kind: str) -> None:
    """After the load: no permit of the kind held, nothing parked."""

    def ok() -> bool:
        row = kind_row(kind)
        return row is not None and not (row.in_use or 0) and row.waiting == 0

    wait_for(ok, timeout=10, message=f"{kind}: permits back and nothing parked: {kind_row(kind)}")
    assert one("SELECT count(*) FROM awa.flow_waiting") == 0


def max_overlap(kind: str, weights: dict[int, int] | None = None, kill_at: Any = None) -> int:
    """Greatest (weighted) number of handler runs of ``kind`` overlapping, from katk_runs."""
    rows = q(
        "SELECT job_id, started, coalesce(ended, %s::timestamptz, '9999-01-01'::timestamptz)"
        " FROM katk_runs WHERE kind = %s",
        [kill_at, kind],
    )
    events = []
    for job_id, s, e in rows:
        w = (weights or {}).get(job_id, 1)
        events.append((s, 1, w))
        events.append((e, 0, -w))  # ends sort before starts at the same instant
    events.sort(key=lambda ev: (ev[0], ev[1]))
    cur = best = 0
    for _, _, w in events:
        cur += w
        best = max(best, cur)
    return best


def runs_per_job(kind: str) -> dict[int, int]:
    return dict(q("SELECT job_id, count(*) FROM katk_runs WHERE kind = %s GROUP BY 1", [kind]))


def children(pid: int) -> set[int]:
    import subprocess

    res = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return {int(x) for x in res.stdout.split()}


def has_table(name: str) -> bool:
    return bool(one("SELECT to_regclass(%s)", [f"awa.{name}"]))


def run_starts(kind: str) -> list[float]:
    """The claim times of the kind's runs (``attempted_at``: the database clock at which the
    claim spent the rate token), not the handlers' start, which a loaded machine delays by
    varying amounts and so bunches up."""
    rows = q(
        "SELECT extract(epoch FROM j.attempted_at) FROM katk_runs r"
        " JOIN awa.jobs j ON j.id = r.job_id WHERE r.kind = %s ORDER BY 1",
        [kind],
    )
    return [float(r[0]) for r in rows]


def window_violations(starts: list[float], rate: float, burst: int) -> list[str]:
    bad = []
    for i, s in enumerate(starts):
        for t in (0.5, 1.0, 2.0):
            n = sum(1 for x in starts[i:] if x < s + t)
            # 1 of slack: a claim's token and its claimed_at are read a moment apart
            if n > rate * t + burst + 1:
                bad.append(f"{n} starts in {t}s from {s}")
    return bad


def park_some(manage_py: Any, n: int = 5) -> tuple[ManagedProcess, int, list[int]]:
    proc = worker(manage_py, "--concurrency", "8")
    wait_kind_limit("katk.lim1", 1)
    first = lim1.enqueue(block="park").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    rest = [lim1.enqueue(seconds=0.01).id for _ in range(n)]
    wait_for(
        lambda: (kind_row("katk.lim1").waiting or 0) == n,
        timeout=10,
        message=lambda: f"{n} parked: {kind_row('katk.lim1')}",
    )
    return proc, first, rest


BAD_VALUES = [0, -1, 1e300, float("nan"), float("inf"), True, "3", 10_001, 2.5, None]


def is_leader(proc: ManagedProcess) -> bool:
    from awa_django.operator.reads import workers

    pids = {proc.pid, *children(proc.pid)}
    return any(
        getattr(w, "is_leader", False) and getattr(w, "pid", None) in pids for w in workers()
    )


def check_outputs(manage_py: Any, commands: list[list[str]]) -> None:
    for args in commands:
        p = manage_py(*args)
        assert p.wait(60) == 0, p.output()
        out = p.output()
        assert "\x1b" not in out, repr(out[-500:])
        assert "\r" not in out, repr(out[-500:])
        forged = [
            ln
            for ln in out.splitlines()
            if ln.lstrip().startswith("kind:forged") or ln.lstrip().startswith("kind:katk.lim2")
        ]
        assert not forged, f"{args}: forged line(s) {forged!r}\n{out}"


def action(admin_client: Any, kinds: list[str], **fields: str) -> Any:
    data = {
        "action": "limit_kinds",
        "select_across": "1",
        "_selected_action": kinds,
        "awa_selected": kinds,
        "confirm": "yes",
        **fields,
    }
    return admin_client.post("/admin/awa_django/kindlimit/", data)


def apply_roles(manage_py: Any) -> dict[str, str]:
    names = {
        "app": "katk_app",
        "reader": "katk_ops",
        "worker": "katk_wrk",
        "maintenance": "katk_mnt",
    }
    with pg() as c:
        for n in names.values():
            c.execute(
                f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{n}')"
                f" THEN CREATE ROLE {n} LOGIN; END IF; END $$"
            )
    p = manage_py("awa_roles", "--apply", *[a for k, v in names.items() for a in (f"--{k}", v)])
    assert p.wait(60) == 0, p.output()
    return names
