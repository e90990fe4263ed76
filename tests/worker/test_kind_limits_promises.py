"""Hostile tests of per-kind flow limits (docs/flow.md, "Per kind").

Each test asserts what the docs promise; a failing test is a finding. Workers are real
subprocesses (``manage_py``) with the job kinds of tests/jobs/kind_limits.py; handlers record their
runs in ``katk_runs`` / ``katk_gauge`` (tables of the test database made here).
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.jobs import kind_limits, worker_env
from tests.jobs.kind_limits import fails_once, free, lim1, lim2, odd_name, plain
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.usefixtures("clean_awa", "katk_tables")

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


# --------------------------------------------------------------------------------------------
# Ledger: the kind limit across several processes and queues
# --------------------------------------------------------------------------------------------


def test_kind_limit_holds_across_four_workers_two_queues_mixed_kinds(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "6") for _ in range(4)]
    wait_kind_limit("katk.lim2", 2)
    ids = []
    for i in range(40):
        ids.append(lim2.using(queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.06).id)
        ids.append(free.using(queue="katk" if i % 3 else "katk-b").enqueue().id)
        ids.append(free.enqueue().id)
    wait_completed(ids, procs)
    assert peak("katk.lim2") <= 2
    assert max_overlap("katk.lim2") <= 2
    assert peak("katk.lim2") == 2, "the kind never ran at its limit"
    assert set(runs_per_job("katk.lim2").values()) == {1}
    no_leak("katk.lim2")


def test_kind_limit_counts_weight(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(3)]
    wait_kind_limit("katk.lim2", 2)
    weights = {}
    ids = []
    for i in range(24):
        w = 2 if i % 3 == 0 else 1
        j = lim2.using(weight=w, queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.05)
        weights[j.id] = w
        ids.append(j.id)
    wait_completed(ids, procs)
    assert max_overlap("katk.lim2", weights) <= 2
    no_leak("katk.lim2")


def test_weight_above_kind_limit_still_runs(manage_py: Any) -> None:
    procs = [worker(manage_py)]
    wait_kind_limit("katk.lim2", 2)
    ids = [lim2.using(weight=50).enqueue(seconds=0.02).id for _ in range(3)]
    ids += [lim2.enqueue(seconds=0.02).id for _ in range(3)]
    wait_completed(ids, procs, timeout=20)
    assert max_overlap("katk.lim2", {i: 2 for i in ids[:3]}) <= 2
    no_leak("katk.lim2")


def _children(pid: int) -> set[int]:
    import subprocess

    res = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return {int(x) for x in res.stdout.split()}


def test_sigstop_non_leader_worker_is_reaped_and_kind_progresses(manage_py: Any) -> None:
    leader = worker(manage_py, "--concurrency", "4")
    frozen = worker(manage_py, "--concurrency", "4", "--no-maintenance")
    wait_kind_limit("katk.lim1", 1)
    wait_for(
        lambda: (
            one("SELECT count(*) FROM awa.runtime_instances") >= 2
            if _has_table("runtime_instances")
            else True
        ),
        timeout=10,
    )
    # park a job on the frozen worker: enqueue until it runs one there
    first = None
    for _ in range(20):
        j = lim1.enqueue(block="hold").id
        wait_for(lambda j=j: one("SELECT pid FROM katk_runs WHERE job_id = %s", [j]), timeout=20)
        if one("SELECT pid FROM katk_runs WHERE job_id = %s", [j]) == frozen.pid:
            first = j
            break
        release("hold")
        wait_completed([j], [leader, frozen])
        q("DELETE FROM katk_flags")
    assert first is not None, "could not get a job onto the frozen worker"
    frozen.send_signal(signal.SIGSTOP)
    try:
        ids = [lim1.enqueue(seconds=0.02).id for _ in range(5)]
        # the leader reaps the frozen worker's permit; its attempt is rescued and retried
        release("hold")
        wait_completed(ids, [leader], timeout=40)
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_completed([first], [leader, frozen], timeout=40)
    no_leak("katk.lim1")


def _has_table(name: str) -> bool:
    return bool(one("SELECT to_regclass(%s)", [f"awa.{name}"]))


def test_claim_connection_terminated_no_leak_all_complete(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "4") for _ in range(2)]
    wait_kind_limit("katk.lim2", 2)
    ids = [lim2.enqueue(seconds=0.15).id for _ in range(30)]
    ids += [free.enqueue().id for _ in range(30)]
    for _ in range(5):
        wait_for(
            lambda: (
                one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND classid = 4282182"
                )
                > 0
            ),
            timeout=20,
        )
        q(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = 4282182 AND pid <> pg_backend_pid()"
        )
    wait_completed(ids, procs, timeout=90)
    no_leak("katk.lim2")
    assert all(p.proc.poll() is None for p in procs), "a worker died"


# --------------------------------------------------------------------------------------------
# Head-of-line blocking
# --------------------------------------------------------------------------------------------


def test_parked_backlog_does_not_stall_other_kinds_in_same_queue(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "4")]
    wait_kind_limit("katk.lim1", 1)
    blocked = lim1.enqueue(block="hol").id
    backlog = [lim1.enqueue(seconds=0.01).id for _ in range(300)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [blocked]), timeout=20)
    others = [free.enqueue().id for _ in range(50)]
    t0 = time.monotonic()
    wait_completed(others, procs, timeout=15)
    assert time.monotonic() - t0 < 5
    release("hol")
    wait_completed([blocked, *backlog], procs, timeout=60)
    assert peak("katk.lim1") == 1
    no_leak("katk.lim1")


def test_limited_kind_progresses_behind_big_backlog_of_other_kinds(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "4")]
    wait_kind_limit("katk.lim2", 2)
    limited = [lim2.enqueue(seconds=0.05).id for _ in range(20)]
    from awa_django import enqueue_many

    reqs = [free.prepare(seconds=0.01) for _ in range(3000)]
    backlog = [j.id for j in enqueue_many(reqs)]
    t0 = time.monotonic()
    wait_completed(limited, procs, timeout=30)
    took = time.monotonic() - t0
    left = one(
        "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state <> 'completed'", [backlog]
    )
    # 20 jobs at 2 at a time x 0.05 s is ~0.5 s; the backlog takes > 7 s on 2 free slots
    assert took < 6, f"limited kind took {took:.1f}s behind the backlog"
    assert left > 0


# --------------------------------------------------------------------------------------------
# Rate
# --------------------------------------------------------------------------------------------


def _starts(kind: str) -> list[float]:
    """The claim times of the kind's runs (``attempted_at``: the database clock at which the
    claim spent the rate token), not the handlers' start, which a loaded machine delays by
    varying amounts and so bunches up."""
    rows = q(
        "SELECT extract(epoch FROM j.attempted_at) FROM katk_runs r"
        " JOIN awa.jobs j ON j.id = r.job_id WHERE r.kind = %s ORDER BY 1",
        [kind],
    )
    return [float(r[0]) for r in rows]


def _window_violations(starts: list[float], rate: float, burst: int) -> list[str]:
    bad = []
    for i, s in enumerate(starts):
        for t in (0.5, 1.0, 2.0):
            n = sum(1 for x in starts[i:] if x < s + t)
            # 1 of slack: a claim's token and its claimed_at are read a moment apart
            if n > rate * t + burst + 1:
                bad.append(f"{n} starts in {t}s from {s}")
    return bad


def test_rate_limited_backlog_does_not_delay_other_kinds_notify(manage_py: Any) -> None:
    """POLL_INTERVAL long: other kinds in the queue must be picked up by NOTIFY, not the poll."""
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 5.0})]
    wait_kind_limit("katk.rated")
    from awa_django import operator  # noqa: F401
    from awa_django.operator.actions import set_kind_limits
    from tests.jobs.kind_limits import rated

    set_kind_limits("katk.rated", rate_limit=1, rate_burst=1, actor="atk")
    ids = [rated.enqueue().id for _ in range(30)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE kind='katk.rated'") >= 1, timeout=10)
    lat = []
    for _ in range(5):
        j = free.using(queue="katk-rate").enqueue().id
        wait_completed([j], procs, timeout=10)
        lat.append(
            one(
                "SELECT extract(epoch FROM r.started - j.created_at) FROM katk_runs r"
                " JOIN awa.jobs j ON j.id = r.job_id WHERE r.job_id = %s",
                [j],
            )
        )
    assert max(lat) < 1.0, f"other kinds' start latencies behind a rate-parked kind: {lat}"
    del ids


# --------------------------------------------------------------------------------------------
# Runtime changes
# --------------------------------------------------------------------------------------------


def test_lowering_kind_limit_holds_at_once(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim2", 2)
    a = lim2.enqueue(block="a").id
    b = lim2.enqueue(block="b").id
    rest = [lim2.enqueue(seconds=0.05).id for _ in range(8)]
    wait_for(
        lambda: one("SELECT gauge.cur FROM katk_gauge gauge WHERE name='katk.lim2'") == 2,
        timeout=20,
    )
    set_kind_limits("katk.lim2", global_concurrency=1, actor="atk")
    with pg() as c:
        c.execute("UPDATE katk_gauge SET peak = cur WHERE name = 'katk.lim2'")
    release("a")
    wait_completed([a], procs)
    # b still runs: nothing else of the kind may start while it does
    started_before = one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest])
    release("b")
    wait_completed([b, *rest], procs)
    assert started_before == 0 or max_overlap("katk.lim2") <= 2
    # after lowering: never two at once among b and the rest
    rows = q("SELECT job_id, started, ended FROM katk_runs WHERE job_id = ANY(%s)", [[b, *rest]])
    rows.sort(key=lambda r: r[1])
    for (j1, _s1, e1), (j2, s2, _e2) in itertools.pairwise(rows):
        assert s2 >= e1, f"jobs {j1} and {j2} overlapped under limit 1"
    no_leak("katk.lim2")


def test_clearing_operator_limit_releases_parked_promptly(manage_py: Any) -> None:
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})]
    first = plain.enqueue(block="first").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    rest = [plain.enqueue(block="rest").id for _ in range(5)]
    wait_for(lambda: (kind_row("katk.plain").waiting or 0) == 5, timeout=10, message="5 parked")
    t0 = time.monotonic()
    clear_kind_limits("katk.plain", actor="atk")
    wait_for(
        lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest]) == 5,
        timeout=10,
        message="parked jobs start after the limit is cleared",
    )
    took = time.monotonic() - t0
    assert took < 1.5, f"cleared kind's parked jobs took {took:.2f}s to start (POLL_INTERVAL 1)"
    release("first")
    release("rest")
    wait_completed([first, *rest], procs)
    assert one("SELECT count(*) FROM awa.flow_waiting") == 0


def test_raising_kind_limit_unparks_within_poll_interval(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})]
    first = plain.enqueue(block="go").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    rest = [plain.enqueue(block="go").id for _ in range(5)]
    wait_for(lambda: (kind_row("katk.plain").waiting or 0) == 5, timeout=10)
    t0 = time.monotonic()
    set_kind_limits("katk.plain", global_concurrency=4, actor="atk")
    wait_for(
        lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest]) == 3,
        timeout=10,
    )
    assert time.monotonic() - t0 < 1.5
    assert one("SELECT cur FROM katk_gauge WHERE name = 'katk.plain'") == 4
    release("go")
    wait_completed([first, *rest], procs)
    assert peak("katk.plain") == 4
    no_leak("katk.plain")


# --------------------------------------------------------------------------------------------
# Parked jobs: cancel, drain, counts, status, burst
# --------------------------------------------------------------------------------------------


def _park_some(manage_py: Any, n: int = 5) -> tuple[ManagedProcess, int, list[int]]:
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


def test_parked_jobs_show_available_and_cancel_works(manage_py: Any) -> None:
    import awa_django
    from awa_django.operator.reads import queue_stats

    proc, first, rest = _park_some(manage_py)
    assert set(states(rest).values()) == {"available"}
    stats = {s.queue: s for s in queue_stats()}
    assert stats["katk"].available == 5
    assert stats["katk"].running == 1
    awa_django.cancel(rest[0])
    assert states([rest[0]])[rest[0]] == "cancelled"
    release("park")
    wait_completed([first, *rest[1:]], [proc])
    assert states([rest[0]])[rest[0]] == "cancelled"
    assert one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [rest[0]]) == 0
    no_leak("katk.lim1")


def test_drain_removes_parked_jobs(manage_py: Any) -> None:
    proc, first, rest = _park_some(manage_py)
    out = manage_py("awa_queue", "drain", "katk")
    assert out.wait(60) == 0, out.output()
    release("park")
    wait_for(lambda: states([first]).get(first) not in ("running", "available"), timeout=20)
    wait_for(
        lambda: (
            all(v not in ("available",) for v in states(rest).values())
            or len(states(rest)) < len(rest)
        ),
        timeout=10,
        message=lambda: f"parked jobs drained: {states(rest)}",
    )
    assert one("SELECT count(*) FROM awa.flow_waiting") == 0
    assert one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest]) == 0
    del proc


def test_awa_status_and_limits_show_parked_and_in_use(manage_py: Any) -> None:
    proc, first, rest = _park_some(manage_py)
    out = manage_py("awa_queue", "limits", extra_env=worker_env(kind_limits))
    assert out.wait(60) == 0
    text = out.output()
    line = next((x for x in text.splitlines() if "katk.lim1" in x), "")
    assert "in use 1" in line and "5 parked" in line, text
    st = manage_py("awa_status", "--json")
    assert st.wait(60) == 0
    status = json.loads(st.output())
    entry = next(k for k in status["kind_limits"] if k["kind"] == "katk.lim1")
    assert entry["in_use"] == 1 and entry["waiting"] == 5, entry
    katk = next(x for x in status["queues"] if x["queue"] == "katk")
    assert katk["available"] == 5 and katk["running"] == 1, katk
    release("park")
    wait_completed([first, *rest], [proc])
    no_leak("katk.lim1")


def test_admin_job_list_shows_parked_jobs(manage_py: Any, admin_client: Any) -> None:
    proc, first, rest = _park_some(manage_py)
    from django.urls import reverse

    resp = None
    for name in ("admin:awa_django_job_changelist", "admin:awa_django_livejob_changelist"):
        try:
            url = reverse(name)
        except Exception:
            continue
        resp = admin_client.get(url, {"state": "available"})
        break
    if resp is None:
        pytest.skip("job changelist url not found")
    assert resp.status_code == 200
    body = resp.content.decode()
    for j in rest:
        assert str(j) in body
    release("park")
    wait_completed([first, *rest], [proc])


def test_burst_worker_waits_for_parked_and_exits_when_done(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=1, actor="atk")
    ids = [plain.enqueue(seconds=0.3).id for _ in range(6)]
    w = worker(manage_py, "--burst", "--concurrency", "8", "--queue", "katk")
    rc = w.wait(60)
    assert rc == 0, w.output()
    assert all_completed(ids), states(ids)
    assert peak("katk.plain") == 1


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

BAD_VALUES = [0, -1, 1e300, float("nan"), float("inf"), True, "3", 10_001, 2.5, None]


@pytest.mark.parametrize("value", BAD_VALUES[:-1], ids=repr)
def test_bad_global_concurrency_refused_everywhere(value: Any) -> None:
    from awa_django import InvalidOptionError, job
    from awa_django.operator.actions import set_kind_limits

    with pytest.raises(InvalidOptionError):
        set_kind_limits("katk.plain", global_concurrency=value, actor="atk")
    with pytest.raises(InvalidOptionError):

        @job(name=f"katk.bad_gc_{abs(hash(repr(value)))}", global_concurrency=value)
        def bad() -> None: ...

    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


@pytest.mark.parametrize(
    "value",
    [0, -1, 1e300, float("nan"), float("inf"), -float("inf"), True, "3", 1_000_001, 0.0001],
    ids=repr,
)
def test_bad_rate_refused(value: Any) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    with pytest.raises(InvalidOptionError):
        set_kind_limits("katk.plain", rate_limit=value, actor="atk")
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


@pytest.mark.parametrize(
    "burst", [0, -1, 1_000_001, 10**30, True, "5", 2.5, float("nan")], ids=repr
)
def test_bad_burst_refused(burst: Any) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    with pytest.raises(InvalidOptionError):
        set_kind_limits("katk.plain", rate_limit=5, rate_burst=burst, actor="atk")
    with pytest.raises(InvalidOptionError):
        set_kind_limits("katk.plain", rate_burst=5, actor="atk")  # burst without a rate
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


@pytest.mark.parametrize(
    "name",
    ["", " ", "x" * 256, "a\x00b", "a\ud800b", None, 5, b"katk.plain", "\t\n"],
    ids=repr,
)
def test_bad_kind_names_refused(name: Any) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    with pytest.raises(InvalidOptionError):
        set_kind_limits(name, global_concurrency=1, actor="atk")
    with pytest.raises(InvalidOptionError):
        clear_kind_limits(name, actor="atk")
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


def test_command_clear_restores_job_decorator_limits(manage_py: Any) -> None:
    env = worker_env(kind_limits)
    p = manage_py(
        "awa_queue", "limit", "--kind", "katk.lim2", "--global-concurrency", "7", extra_env=env
    )
    assert p.wait(60) == 0, p.output()
    assert kind_row("katk.lim2").global_concurrency == 7
    p = manage_py("awa_queue", "limit", "--kind", "katk.lim2", "--clear", extra_env=env)
    assert p.wait(60) == 0, p.output()
    row = kind_row("katk.lim2")
    assert row is not None and row.global_concurrency == 2 and row.source == "settings", row


def test_settings_kinds_bad_values_refuse_worker_start(manage_py: Any) -> None:
    for bad in (
        {"katk.plain": {"global_concurrency": 0}},
        {"katk.plain": {"rate_limit": "nan"}},
        {"katk.plain": {"global_concurrency": True}},
        {"": {"global_concurrency": 1}},
        {"katk.plain": {"rate_burst": 3}},
        {"katk.plain": {"concurrency": 3}},
    ):
        w = worker(manage_py, "--burst", overrides={"KINDS": bad})
        rc = w.wait(60)
        assert rc != 0, f"worker started with AWA['KINDS'] = {bad}: {w.output()[-1000:]}"
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


# --------------------------------------------------------------------------------------------
# Settings vs operator
# --------------------------------------------------------------------------------------------


def test_settings_kinds_wins_over_job_decorator(manage_py: Any) -> None:
    procs = [
        worker(
            manage_py,
            "--concurrency",
            "8",
            overrides={"KINDS": {"katk.lim2": {"global_concurrency": 1}}},
        )
        for _ in range(2)
    ]
    wait_kind_limit("katk.lim2", 1)
    ids = [lim2.enqueue(seconds=0.03).id for _ in range(12)]
    wait_completed(ids, procs)
    assert peak("katk.lim2") == 1


def test_operator_override_survives_worker_restart(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.lim2", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    ids = [lim2.enqueue(seconds=0.03).id for _ in range(12)]
    wait_completed(ids, procs)
    assert peak("katk.lim2") == 1
    row = kind_row("katk.lim2")
    assert row.source == "operator" and row.global_concurrency == 1


# --------------------------------------------------------------------------------------------
# Kind + serial key; raw SQL; odd names; unknown kinds; retries
# --------------------------------------------------------------------------------------------


def test_kind_and_serial_key_order_and_one_at_a_time(manage_py: Any) -> None:
    # A production-like HEARTBEAT_STALENESS: with the tests' 2 s, a loaded machine (the full
    # parallel suite) can take that long from claim to finalize, and rescue then retries the
    # attempt, which releases its key (docs/flow.md: retries may run out of order).
    steady = {"HEARTBEAT_STALENESS": 60.0}
    procs = [worker(manage_py, "--concurrency", "8", overrides=steady) for _ in range(3)]
    wait_kind_limit("katk.lim2", 2)
    by_key: dict[str, list[int]] = {}
    ids = []
    for i in range(36):
        key = f"k{i % 4}"
        j = lim2.using(serial_key=key, queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.03)
        by_key.setdefault(key, []).append(j.id)
        ids.append(j.id)
        if i % 5 == 0:
            ids.append(free.using(serial_key=key).enqueue().id)
    wait_completed(ids, procs, timeout=60)
    # Each job ran once, as its first attempt: nothing failed and nothing was rescued, so a
    # second run would be a second delivery (or a retry whose reason the message shows).
    again = q(
        "SELECT r.job_id, r.attempt, r.pid, j.errors FROM katk_runs r"
        " JOIN awa.jobs j ON j.id = r.job_id"
        " WHERE r.job_id IN (SELECT job_id FROM katk_runs GROUP BY 1 HAVING count(*) > 1)"
        " OR r.attempt > 1 ORDER BY 1, 2"
    )
    logged = [
        line
        for p in procs
        for line in p.output().splitlines()
        if " WARNING " in line or " ERROR " in line
    ]
    assert again == [], (again, logged)
    assert max_overlap("katk.lim2") <= 2
    # Serial keys are per queue: order and overlap are checked per (key, queue).
    for key, kids in by_key.items():
        for queue in ("katk", "katk-b"):
            rows = q(
                "SELECT job_id, started, ended, attempt, pid FROM katk_runs"
                " WHERE job_id = ANY(%s) AND queue = %s ORDER BY started",
                [kids, queue],
            )
            assert [r[0] for r in rows] == sorted(r[0] for r in rows), (key, queue, rows)
            for a, b in itertools.pairwise(rows):
                assert b[1] >= a[2], f"key {key} in {queue}: {a[0]} and {b[0]} overlapped"
    no_leak("katk.lim2")
    assert one("SELECT count(*) FROM awa.serial_waiting") == 0


def test_raw_sql_producer_jobs_are_limited(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim2", 2)
    ids = []
    with pg() as c:
        for _i in range(10):
            ids.append(
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2('katk.lim2', 'katk', 0, %s, 5)",
                    [json.dumps({"args": [], "kwargs": {"seconds": 0.05}})],
                ).fetchone()[0]
            )
        rows = c.execute(
            "SELECT job_id FROM awa.enqueue_v1(%s)",
            [
                json.dumps(
                    [
                        {
                            "kind": "katk.lim2",
                            "queue": "katk-b",
                            "args": {"args": [0.05], "kwargs": {}},
                        }
                        for _ in range(10)
                    ]
                )
            ],
        ).fetchall()
        ids += [r[0] for r in rows]
    wait_completed(ids, procs)
    assert max_overlap("katk.lim2") <= 2
    no_leak("katk.lim2")


def test_raw_sql_weight_junk_with_limited_kind(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8")]
    wait_kind_limit("katk.lim2", 2)
    ids = []
    with pg() as c:
        for w in ["0", "-5", '"3"', "1e9", "null", "{}", "2.5", "99999999999"]:
            ids.append(
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2('katk.lim2', 'katk', 0, %s, 5,"
                    " p_metadata => %s::jsonb)",
                    [json.dumps({"args": [0.03], "kwargs": {}}), '{"awa:weight": ' + w + "}"],
                ).fetchone()[0]
            )
    wait_completed(ids, procs, timeout=30)
    assert max_overlap("katk.lim2") <= 2
    no_leak("katk.lim2")


def test_odd_kind_name_is_limited(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk:ünï/código", 1)
    ids = [odd_name.enqueue(seconds=0.03).id for _ in range(10)]
    wait_completed(ids, procs)
    assert peak("katk:ünï/código") == 1
    no_leak("katk:ünï/código")


def test_limit_on_kind_without_job_does_not_strand_or_leak(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("ghost.kind", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8")]
    ghosts = []
    with pg() as c:
        for _ in range(5):
            ghosts.append(
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2('ghost.kind', 'katk', 0, %s, 1)",
                    [json.dumps({"args": [], "kwargs": {}})],
                ).fetchone()[0]
            )
    others = [free.enqueue().id for _ in range(10)]
    wait_completed(others, procs, timeout=20)
    wait_for(
        lambda: (
            all(v in ("failed", "cancelled") or v == "completed" for v in states(ghosts).values())
            and len(states(ghosts)) == 5
        ),
        timeout=30,
        message=lambda: f"ghost jobs end: {states(ghosts)} {kind_row('ghost.kind')}",
    )
    row = kind_row("ghost.kind")
    assert row is not None and not row.in_use and row.waiting == 0


def test_retries_of_limited_kind_respect_limit(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.fails_once", 1)
    ids = [fails_once.enqueue(seconds=0.03).id for _ in range(8)]
    wait_completed(ids, procs, timeout=60)
    assert peak("katk.fails_once") == 1
    assert one("SELECT count(*) FROM katk_runs WHERE kind = 'katk.fails_once'") == 16
    no_leak("katk.fails_once")


def test_kind_limit_and_queue_limit_together(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits, set_queue_limits

    set_queue_limits("katk", global_concurrency=3, actor="atk")
    set_kind_limits("katk.plain", global_concurrency=2, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(3)]
    ids = [plain.enqueue(seconds=0.05).id for _ in range(20)]
    ids += [free.enqueue(seconds=0.05).id for _ in range(20)]
    wait_completed(ids, procs, timeout=60)
    assert peak("katk.plain") <= 2
    rows = q("SELECT started, ended FROM katk_runs WHERE queue = 'katk'")
    ev = sorted([(s, 1) for s, _ in rows] + [(e, 0) for _, e in rows], key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, k in ev:
        cur += 1 if k else -1
        best = max(best, cur)
    assert best <= 3
    no_leak("katk.plain")


def test_lim_name_kind_prefix_does_not_collide_with_queue(manage_py: Any) -> None:
    """A kind named like a queue's permit input must not share the queue's permits in a way that
    lets either pass its limit (docs: collisions only make limits stricter)."""
    from awa_django.operator.actions import set_kind_limits, set_queue_limits

    set_queue_limits("katk", global_concurrency=1, actor="atk")
    set_kind_limits("katk.plain", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8")]
    ids = [plain.enqueue(seconds=0.02).id for _ in range(5)]
    wait_completed(ids, procs, timeout=30)
    assert peak("katk.plain") == 1
    no_leak("katk.plain")


# --------------------------------------------------------------------------------------------
# Outcomes that end the handler early or late
# --------------------------------------------------------------------------------------------


def test_wait_for_callback_frees_kind_permit(manage_py: Any) -> None:
    from tests.jobs.kind_limits import waits

    procs = [worker(manage_py, "--concurrency", "8")]
    wait_kind_limit("katk.waits", 1)
    ids = [waits.enqueue(seconds=0.02).id for _ in range(4)]
    wait_for(
        lambda: set(states(ids).values()) == {"waiting_external"},
        timeout=20,
        message=lambda: f"all four wait for their callback: {states(ids)} {kind_row('katk.waits')}",
    )
    row = kind_row("katk.waits")
    assert not row.in_use and row.waiting == 0, row
    del procs


def test_deadline_abandoned_handler_keeps_kind_permit(manage_py: Any) -> None:
    """docs: a handler told to stop (deadline) keeps its permits until it returns: the retry and
    the other jobs of the kind never overlap it."""
    from tests.jobs.kind_limits import overrun

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.overrun", 1)
    [overrun.enqueue(seconds=1.2).id for _ in range(2)]
    wait_for(
        lambda: (
            one("SELECT count(*) FROM katk_runs WHERE kind = 'katk.overrun' AND ended IS NOT NULL")
            >= 3
        ),
        timeout=60,
        message=lambda: f"three runs ended: {q('SELECT * FROM katk_runs')}",
    )
    assert max_overlap("katk.overrun") <= 1, q(
        "SELECT job_id, attempt, pid, started, ended FROM katk_runs ORDER BY started"
    )
    del procs


def test_kind_with_both_rate_and_concurrency(manage_py: Any) -> None:
    from tests.jobs.kind_limits import both

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.both", 2)
    ids = [
        both.using(queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.3).id for i in range(20)
    ]
    wait_completed(ids, procs, timeout=60)
    assert max_overlap("katk.both") <= 2
    assert not _window_violations(_starts("katk.both"), 10, 2)[:5]
    no_leak("katk.both")


def test_many_limited_kinds_in_one_queue(manage_py: Any) -> None:
    import awa_django

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(3)]
    wait_kind_limit("katk.r3")
    wait_kind_limit("katk.c3", 1)
    ids = []
    for i in range(120):
        kind = f"katk.r{i % 4}" if i % 2 else f"katk.c{i % 4}"
        ids.append(awa_django.enqueue(kind, kwargs={"seconds": 0.02 if "c" in kind else 0}).id)
        if i % 3 == 0:
            ids.append(free.using(queue="katk-multi").enqueue().id)
    wait_completed(ids, procs, timeout=60)
    for i in range(4):
        assert max_overlap(f"katk.c{i}") <= 1
        assert not _window_violations(_starts(f"katk.r{i}"), 10, 2)[:5], i
    assert one("SELECT count(*) FROM awa.flow_waiting") == 0


def test_burst_worker_with_rate_parked_jobs(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", rate_limit=4, rate_burst=1, actor="atk")
    ids = [plain.enqueue().id for _ in range(8)]
    ids += [free.enqueue().id for _ in range(8)]
    w = worker(manage_py, "--burst", "--concurrency", "8", "--queue", "katk")
    rc = w.wait(60)
    assert rc == 0, w.output()
    assert all_completed(ids), states(ids)
    span = _starts("katk.plain")
    assert span[-1] - span[0] >= 7 / 4 - 0.3


def test_unique_limited_job_keeps_key_while_parked(manage_py: Any) -> None:
    _, _first, _rest = _park_some(manage_py, n=2)
    a = lim1.using(unique_key="only-one").enqueue(seconds=0.01)
    wait_for(lambda: (kind_row("katk.lim1").waiting or 0) == 3, timeout=10)
    b = lim1.using(unique_key="only-one").enqueue(seconds=0.01)
    assert b.id == a.id
    release("park")


def test_dlq_retry_of_limited_kind_still_limited(manage_py: Any) -> None:
    import awa_django

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim2", 2)
    with pg() as c:
        c.execute("INSERT INTO katk_flags VALUES ('x')")
    # jobs that fail for good: unknown kwarg -> TypeError, max_attempts 1
    ids = [lim2.using(max_attempts=1).enqueue(seconds=0.05).id for _ in range(6)]
    wait_completed(ids, procs)
    # retry completed-history is not the DLQ; just recheck the limit with a fresh batch from
    # several producers at once (raw SQL and Python interleaved)
    more = [awa_django.enqueue("katk.lim2", kwargs={"seconds": 0.05}).id for _ in range(6)]
    wait_completed(more, procs)
    assert max_overlap("katk.lim2") <= 2


# --------------------------------------------------------------------------------------------
# Frozen leader, admin, roles
# --------------------------------------------------------------------------------------------


def _is_leader(proc: ManagedProcess) -> bool:
    from awa_django.operator.reads import workers

    pids = {proc.pid, *_children(proc.pid)}
    return any(
        getattr(w, "is_leader", False) and getattr(w, "pid", None) in pids for w in workers()
    )


def test_frozen_leader_holding_kind_permit_is_replaced_and_kind_progresses(
    manage_py: Any,
) -> None:
    first_w = worker(manage_py, "--concurrency", "4")
    wait_kind_limit("katk.lim1", 1)
    from awa_django.operator.reads import workers

    wait_for(
        lambda: any(getattr(w, "is_leader", False) for w in workers()),
        timeout=20,
        message=lambda: f"a leader: {workers()}",
    )
    second = worker(manage_py, "--concurrency", "4")
    wait_for(lambda: len(workers()) >= 2, timeout=20)
    leader_proc = first_w if _is_leader(first_w) else second
    other = second if leader_proc is first_w else first_w
    held = None
    for _ in range(30):
        j = lim1.enqueue(block="fl").id
        wait_for(lambda j=j: one("SELECT pid FROM katk_runs WHERE job_id = %s", [j]), timeout=20)
        pid = one("SELECT pid FROM katk_runs WHERE job_id = %s", [j])
        if pid in {leader_proc.pid, *_children(leader_proc.pid)}:
            held = j
            break
        release("fl")
        wait_completed([j], [first_w, second])
        q("DELETE FROM katk_flags")
    assert held is not None
    leader_proc.send_signal(signal.SIGSTOP)
    try:
        ids = [lim1.enqueue(seconds=0.02).id for _ in range(5)]
        release("fl")
        wait_completed(ids, [other], timeout=60)
    finally:
        leader_proc.send_signal(signal.SIGCONT)
    wait_completed([held], [first_w, second], timeout=60)
    no_leak("katk.lim1")


def test_admin_add_kind_limit_bad_input_writes_nothing(admin_client: Any) -> None:
    url = "/admin/awa_django/kindlimit/add/"
    assert admin_client.get(url).status_code == 200
    bad = [
        {"kind": "", "global_concurrency": "1"},
        {"kind": "katk.plain", "global_concurrency": "0"},
        {"kind": "katk.plain", "global_concurrency": "-1"},
        {"kind": "katk.plain", "global_concurrency": "1e300"},
        {"kind": "katk.plain", "rate_limit": "nan"},
        {"kind": "katk.plain", "rate_limit": "inf"},
        {"kind": "katk.plain", "rate_limit": "1e300"},
        {"kind": "katk.plain", "rate_limit": "0"},
        {"kind": "katk.plain", "rate_burst": "5"},
        {"kind": "katk.plain", "rate_limit": "5", "rate_burst": "99999999999999999999"},
        {"kind": "katk.plain"},
        {"kind": "katk.pl\x00ain", "global_concurrency": "1"},
        {"kind": "x" * 300, "global_concurrency": "1"},
        {"kind": "not.registered", "global_concurrency": "1"},
        {"kind": " ", "global_concurrency": "1"},
    ]
    for data in bad:
        resp = admin_client.post(url, data)
        assert resp.status_code in (200, 400), (data, resp.status_code)
        assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0, data
    resp = admin_client.post(url, {"kind": "katk.plain", "global_concurrency": "3"})
    assert resp.status_code in (200, 302)
    row = kind_row("katk.plain")
    assert row is not None and row.global_concurrency == 3 and row.source == "operator"
    assert "admin" in (row.updated_by or "")


def test_operator_role_cannot_change_kind_limit_app_role_enqueues_limited(
    manage_py: Any,
) -> None:
    from django.db import connection

    names = {
        "app": "katk_app",
        "operator": "katk_ops",
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
    base = psycopg.conninfo.conninfo_to_dict(
        __import__("tests.support.database", fromlist=["conninfo"]).conninfo()
    )

    def as_role(role: str) -> psycopg.Connection[Any]:
        return psycopg.connect(**{**base, "user": role}, autocommit=True)

    with as_role(names["operator"]) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(
                "SELECT * FROM awa.flow_kind_set_v1('katk.lim2', 1, NULL, NULL, 'x', false, NULL)"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(
                "SELECT * FROM awa.flow_kind_sync_v1(%s, true)",
                ['{"katk.lim2": {"global_concurrency": 9}}'],
            )
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0
    with as_role(names["app"]) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(
                "SELECT * FROM awa.flow_kind_set_v1('katk.lim2', 100, NULL, NULL, 'x', false, NULL)"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("DELETE FROM awa.flow_kind_limits")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("INSERT INTO awa.flow_waiting (job_id) VALUES (1)")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim2", 2)
    ids = []
    with as_role(names["app"]) as c:
        for _ in range(10):
            ids.append(
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2('katk.lim2', 'katk', 0, %s, 5)",
                    [json.dumps({"args": [0.05], "kwargs": {}})],
                ).fetchone()[0]
            )
    wait_completed(ids, procs)
    assert max_overlap("katk.lim2") <= 2
    del connection


# --------------------------------------------------------------------------------------------
# More outcomes, pause, deploys, extremes
# --------------------------------------------------------------------------------------------


def test_snoozing_limited_job_frees_permit(manage_py: Any) -> None:
    from tests.jobs.kind_limits import snoozer

    procs = [worker(manage_py, "--concurrency", "8")]
    wait_kind_limit("katk.snoozer", 1)
    ids = [snoozer.enqueue().id for _ in range(4)]
    # all four snooze (2 s) on their first run: none may wait for another's snooze
    wait_for(
        lambda: one("SELECT count(DISTINCT job_id) FROM katk_runs") == 4,
        timeout=1.9,
        message=lambda: f"four first runs before any snooze ends: {kind_row('katk.snoozer')}",
    )
    wait_completed(ids, procs, timeout=30)
    no_leak("katk.snoozer")


def test_cancel_running_limited_job_frees_permit(manage_py: Any) -> None:
    import awa_django
    from tests.jobs.kind_limits import coop

    procs = [worker(manage_py, "--concurrency", "8")]
    wait_kind_limit("katk.coop", 1)
    a = coop.enqueue().id
    b = coop.enqueue().id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    running = one("SELECT job_id FROM katk_runs")
    awa_django.cancel(running)
    other = b if running == a else a
    wait_for(
        lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [other]) == 1,
        timeout=5,
        message=lambda: f"the other job starts: {kind_row('katk.coop')}",
    )
    awa_django.cancel(other)
    no_leak("katk.coop")
    del procs


def test_paused_queue_keeps_parked_jobs_parked(manage_py: Any) -> None:
    proc, first, rest = _park_some(manage_py, n=4)
    p = manage_py("awa_queue", "pause", "katk")
    assert p.wait(60) == 0
    release("park")
    wait_completed([first], [proc])
    # while paused, nothing of the queue starts (give the worker several polls to misbehave)
    t_end = time.monotonic() + 1.0
    wait_for(lambda: time.monotonic() > t_end, timeout=2)
    assert one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest]) == 0
    p = manage_py("awa_queue", "resume", "katk")
    assert p.wait(60) == 0
    wait_completed(rest, [proc], timeout=20)
    no_leak("katk.lim1")


def test_deploy_dropping_settings_limit_unparks(manage_py: Any) -> None:
    old = worker(
        manage_py,
        "--concurrency",
        "8",
        overrides={"KINDS": {"katk.settings_limited": {"global_concurrency": 1}}},
    )
    wait_kind_limit("katk.settings_limited", 1)
    from tests.jobs.kind_limits import settings_limited

    first = settings_limited.enqueue(block="dep").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    rest = [settings_limited.enqueue(seconds=0.01).id for _ in range(5)]
    wait_for(lambda: (kind_row("katk.settings_limited").waiting or 0) == 5, timeout=10)
    old.send_signal(signal.SIGTERM)
    release("dep")
    assert old.wait(30) == 0, old.output()
    new = worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})
    wait_completed([first, *rest], [new], timeout=15)
    row = kind_row("katk.settings_limited")
    assert row is None or (row.global_concurrency is None and row.waiting == 0), row


def test_huge_concurrency_and_weight_within_bounds_runs(manage_py: Any) -> None:
    """gc 10,000 and weight 10,000 are both documented as valid: the job must run, and the
    worker must not break (10,000 advisory locks per job would overflow the lock table)."""
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=10_000, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8")]
    ids = [plain.using(weight=10_000).enqueue().id for _ in range(2)]
    ids += [free.enqueue().id for _ in range(5)]
    wait_completed(ids, procs, timeout=60)
    no_leak("katk.plain")
    assert procs[0].proc.poll() is None


@pytest.mark.parametrize("change", ["raise", "clear", "to_concurrency"])
def test_slow_rate_changed_takes_effect_within_poll_interval(manage_py: Any, change: str) -> None:
    """A kind parked by a slow rate (one job per 20 s): raising or clearing the rate must take
    effect within one POLL_INTERVAL (docs: "A change takes effect with the next claim: within
    one POLL_INTERVAL"), not when the soft wait of the old rate runs out."""
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    set_kind_limits("katk.plain", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})]
    ids = [plain.enqueue().id for _ in range(10)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    wait_for(
        lambda: (kind_row("katk.plain").waiting or 0) == 9,
        timeout=10,
        message=lambda: f"9 parked: {kind_row('katk.plain')}",
    )
    t0 = time.monotonic()
    if change == "raise":
        set_kind_limits("katk.plain", rate_limit=1000, rate_burst=100, actor="atk")
    elif change == "clear":
        clear_kind_limits("katk.plain", actor="atk")
    else:
        set_kind_limits("katk.plain", global_concurrency=5, actor="atk")
    wait_completed(ids, procs, timeout=25)
    took = time.monotonic() - t0
    assert took < 2.5, f"after the change ({change}) the parked jobs took {took:.1f}s to run"


def test_slow_queue_rate_raised_takes_effect_at_once(manage_py: Any) -> None:
    """The same as above for a queue's rate (comparison: docs/flow.md "Rate limits")."""
    from awa_django.operator.actions import set_queue_limits

    set_queue_limits("katk", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})]
    ids = [plain.enqueue().id for _ in range(10)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    t0 = time.monotonic()
    set_queue_limits("katk", rate_limit=1000, rate_burst=100, actor="atk")
    wait_completed(ids, procs, timeout=25)
    took = time.monotonic() - t0
    assert took < 2.5, f"after raising the queue rate the jobs took {took:.1f}s to run"


def test_kind_rate_state_not_ahead_after_raise(manage_py: Any) -> None:
    """Direct check of the documented invariant: after a raise, the kind's GCRA state (tat) is
    never further ahead of now than burst x T of the new limits allows, once a claim ran."""
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 0.2})]
    ids = [plain.enqueue().id for _ in range(3)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    set_kind_limits("katk.plain", rate_limit=10, rate_burst=1, actor="atk")

    def ahead() -> float:
        return float(
            one(
                "SELECT coalesce(extract(epoch FROM max(tat) - now()), 0)"
                " FROM awa.flow_kind_rate_state WHERE kind = 'katk.plain'"
            )
        )

    # claims run every POLL_INTERVAL (0.2 s): within 3 s the state must be back within
    # burst x T = 0.1 s of now (docs: "never further ahead than the current limits allow")
    wait_for(
        lambda: ahead() <= 0.15,
        timeout=3,
        message=lambda: f"tat within 0.1 s of now after the raise; it is {ahead():.1f}s ahead",
    )
    wait_completed(ids, procs, timeout=25)


def test_kind_rate_set_again_after_clear_takes_effect_at_once(manage_py: Any) -> None:
    """docs: "a rate set again after it was cleared, takes effect at once rather than after
    what a slower rate had accumulated"."""
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    set_kind_limits("katk.plain", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 0.5})]
    first = [plain.enqueue().id for _ in range(2)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    clear_kind_limits("katk.plain", actor="atk")
    wait_completed(first, procs, timeout=5)
    set_kind_limits("katk.plain", rate_limit=20, rate_burst=5, actor="atk")
    t0 = time.monotonic()
    ids = [plain.enqueue().id for _ in range(10)]
    wait_completed(ids, procs, timeout=30)
    took = time.monotonic() - t0
    assert took < 2.5, f"10 jobs at 20/s burst 5 took {took:.1f}s after the rate was set again"


def test_operator_throttle_then_clear_back_to_job_rate(manage_py: Any) -> None:
    """An operator throttles a kind to a crawl during an incident, then clears the override:
    the kind must go back to its @job rate (20/s burst 5) at once."""
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits
    from tests.jobs.kind_limits import rated

    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 0.5})]
    wait_kind_limit("katk.rated")
    set_kind_limits("katk.rated", rate_limit=0.05, rate_burst=1, actor="atk")
    ids = [rated.enqueue().id for _ in range(11)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    row = clear_kind_limits("katk.rated", actor="atk")
    assert row is not None and row.rate_limit == 20
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=30)
    took = time.monotonic() - t0
    assert took < 2.5, f"10 jobs at 20/s burst 5 took {took:.1f}s after the throttle was cleared"


@pytest.mark.parametrize(
    "name",
    [
        "katk.x\nkind:katk.lim2 limit 10000 (in use 0), settings",
        "katk.x\x1b[2J\x1b[Hkind:forged",
        "katk.x\rkind:forged",
    ],
    ids=["newline", "ansi", "cr"],
)
def test_kind_name_cannot_forge_limits_output(manage_py: Any, name: str) -> None:
    """A kind named by a raw-SQL producer or an operator may hold any text: either the name is
    refused, or `awa_queue limits` and `awa_status` print it so that it cannot forge a line or
    drive the terminal."""
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    try:
        set_kind_limits(name, global_concurrency=1, actor="atk")
    except InvalidOptionError:
        return
    check_outputs(manage_py, [["awa_queue", "limits"]])


@pytest.mark.parametrize(
    "name",
    [
        "katk.x\nkind:katk.lim2 limit 10000 (in use 0), settings",
        "katk.x\x1b[2J\x1b[Hkind:forged",
        "katk.x\rkind:forged",
    ],
    ids=["newline", "ansi", "cr"],
)
def test_kind_name_cannot_forge_status_output(manage_py: Any, name: str) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    try:
        set_kind_limits(name, global_concurrency=1, actor="atk")
    except InvalidOptionError:
        return
    check_outputs(manage_py, [["awa_status"]])


@pytest.mark.parametrize("actor", ["atk\nkind:forged limit 1", "atk\x1b[2J"], ids=["nl", "ansi"])
def test_actor_cannot_forge_limits_output(manage_py: Any, actor: str) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    try:
        set_kind_limits("katk.plain", global_concurrency=1, actor=actor)
    except InvalidOptionError:
        return
    check_outputs(manage_py, [["awa_queue", "limits"], ["awa_status"]])


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


def test_parked_job_deadline_counts_from_its_run(manage_py: Any) -> None:
    """A job parked for longer than its deadline must not be rescued for it: the deadline is
    the attempt's, and parking counts no attempt."""
    proc = worker(manage_py, "--concurrency", "8")
    wait_kind_limit("katk.lim1", 1)
    first = lim1.enqueue(block="dl").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    parked = [lim1.using(deadline=1.0, max_attempts=1).enqueue(seconds=0.3).id for _ in range(2)]
    wait_for(lambda: (kind_row("katk.lim1").waiting or 0) == 2, timeout=10)
    t_end = time.monotonic() + 2.5
    wait_for(lambda: time.monotonic() > t_end, timeout=3)  # parked longer than their deadline
    release("dl")
    wait_completed([first, *parked], [proc], timeout=20)


def test_queue_concurrency_one_with_parked_kind(manage_py: Any) -> None:
    """A process that may run one job of the queue at a time: parked jobs of the kind and the
    queue's other jobs all run (un-parking never needs more room than the claim has)."""
    procs = [worker(manage_py, "--queue", "katk=1", "--concurrency", "1") for _ in range(2)]
    wait_kind_limit("katk.lim1", 1)
    ids = []
    for _ in range(15):
        ids.append(lim1.enqueue(seconds=0.02).id)
        ids.append(free.enqueue().id)
    wait_completed(ids, procs, timeout=60)
    assert peak("katk.lim1") == 1
    no_leak("katk.lim1")


def test_key_order_holds_when_oldest_of_key_waits_for_kind(manage_py: Any) -> None:
    """The oldest job of a key is parked by its kind while the key is otherwise free; younger
    jobs of the key, of an unlimited kind, must not overtake it however often the leader's
    sweep hands the key on (RESCUE_INTERVAL 0.2 s here)."""
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim1", 1)
    a = lim1.enqueue(block="ka").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [a]), timeout=20)
    k1 = lim1.using(serial_key="s").enqueue(seconds=0.05).id
    wait_for(lambda: (kind_row("katk.lim1").waiting or 0) == 1, timeout=10)
    younger = [free.using(serial_key="s").enqueue(seconds=0.02).id for _ in range(3)]
    t_end = time.monotonic() + 2.0  # ten sweeps
    wait_for(lambda: time.monotonic() > t_end, timeout=3)
    ran = one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [younger])
    assert ran == 0, f"{ran} younger job(s) of key s ran before its oldest (parked by its kind)"
    release("ka")
    wait_completed([a, k1, *younger], procs, timeout=20)
    rows = q(
        "SELECT job_id, started, ended FROM katk_runs WHERE job_id = ANY(%s) ORDER BY started",
        [[k1, *younger]],
    )
    assert [r[0] for r in rows] == [k1, *younger]
    for x, y in itertools.pairwise(rows):
        assert y[1] >= x[2]
    no_leak("katk.lim1")
    assert one("SELECT count(*) FROM awa.serial_waiting") == 0


def test_parked_kind_holds_no_queue_permit(manage_py: Any) -> None:
    from awa_django.operator.actions import set_queue_limits
    from awa_django.operator.reads import queue_limits

    set_queue_limits("katk", global_concurrency=2, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim1", 1)
    a = lim1.enqueue(block="qp").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [a]), timeout=20)
    parked = [lim1.enqueue(seconds=0.01).id for _ in range(6)]
    wait_for(lambda: (kind_row("katk.lim1").waiting or 0) == 6, timeout=10)
    others = [free.enqueue(seconds=0.02).id for _ in range(20)]
    wait_completed(others, procs, timeout=20)

    def queue_in_use() -> int:
        return next((r.in_use or 0) for r in queue_limits() if r.queue == "katk")

    wait_for(
        lambda: queue_in_use() == 1,
        timeout=5,
        message=lambda: f"queue permits in use 1 (the blocked job): {queue_in_use()}",
    )
    release("qp")
    wait_completed([a, *parked], procs, timeout=20)
    wait_for(lambda: queue_in_use() == 0, timeout=5)
    no_leak("katk.lim1")


def test_rated_kind_with_one_serial_key(manage_py: Any) -> None:
    from tests.jobs.kind_limits import rated

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.rated")
    ids = [rated.using(serial_key="one").enqueue(seconds=0.02).id for _ in range(20)]
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=30)
    took = time.monotonic() - t0
    rows = q("SELECT job_id, started, ended FROM katk_runs ORDER BY started")
    assert [r[0] for r in rows] == ids
    for x, y in itertools.pairwise(rows):
        assert y[1] >= x[2]
    assert not _window_violations(_starts("katk.rated"), 20, 5)[:5]
    # 20 jobs at 20/s (burst 5), one at a time for 20 ms each: about 1 s; allow 5
    assert took < 5, f"20 jobs of one key at 20/s took {took:.1f}s"


def test_kind_rate_runs_at_rate_without_notify(manage_py: Any) -> None:
    from tests.jobs.kind_limits import rated

    procs = [
        worker(manage_py, "--concurrency", "8", overrides={"NOTIFY": False, "POLL_INTERVAL": 1.0})
        for _ in range(2)
    ]
    wait_kind_limit("katk.rated")
    ids = [rated.enqueue().id for _ in range(60)]
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=60)
    took = time.monotonic() - t0
    assert not _window_violations(_starts("katk.rated"), 20, 5)[:5]
    assert took < 6, f"60 jobs at 20/s burst 5 took {took:.1f}s without NOTIFY (POLL_INTERVAL 1)"


def test_kind_concurrency_handoff_without_notify(manage_py: Any) -> None:
    procs = [
        worker(manage_py, "--concurrency", "8", overrides={"NOTIFY": False, "POLL_INTERVAL": 1.0})
        for _ in range(2)
    ]
    wait_kind_limit("katk.lim1", 1)
    ids = [
        lim1.using(queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.05).id for i in range(20)
    ]
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=60)
    took = time.monotonic() - t0
    assert peak("katk.lim1") == 1
    # 20 x 50 ms = 1 s of work; a freed permit seen only at the next poll (1 s) would take 20 s
    assert took < 12, f"20 jobs of a kind limited to 1 took {took:.1f}s without NOTIFY"


def test_queue_and_kind_rate_together(manage_py: Any) -> None:
    from awa_django.operator.actions import set_queue_limits
    from tests.jobs.kind_limits import rated

    set_queue_limits("katk-rate", rate_limit=10, rate_burst=2, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.rated")
    ids = [rated.enqueue().id for _ in range(30)]
    ids += [free.using(queue="katk-rate").enqueue().id for _ in range(10)]
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=60)
    took = time.monotonic() - t0
    starts = [
        float(r[0])
        for r in q(
            "SELECT extract(epoch FROM started) FROM katk_runs WHERE queue = 'katk-rate' ORDER BY 1"
        )
    ]
    assert not _window_violations(starts, 10, 2)[:5]
    assert not _window_violations(_starts("katk.rated"), 20, 5)[:5]
    # 40 jobs at the queue's 10/s: about 4 s; kind tokens must not be wasted by the queue's rate
    assert took < 7, f"40 jobs at the queue's 10/s took {took:.1f}s"


def _action(admin_client: Any, kinds: list[str], **fields: str) -> Any:
    data = {
        "action": "limit_kinds",
        "select_across": "1",
        "_selected_action": kinds,
        "awa_selected": kinds,
        "confirm": "yes",
        **fields,
    }
    return admin_client.post("/admin/awa_django/kindlimit/", data)


def test_admin_kind_action_bad_values_change_nothing(admin_client: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=2, actor="atk")
    for fields in (
        {"global_concurrency": "0"},
        {"global_concurrency": "-3"},
        {"rate_limit": "nan"},
        {"rate_limit": "inf"},
        {"rate_limit": "-1"},
        {"rate_limit": "1e300"},
        {"rate_burst": "4"},
        {"rate_limit": "5", "rate_burst": "0"},
        {},
        {"clear": "on", "global_concurrency": "3"},
    ):
        resp = _action(admin_client, ["katk.plain"], **fields)
        assert resp.status_code in (200, 302, 400), fields
        row = kind_row("katk.plain")
        assert row.global_concurrency == 2 and row.rate_limit is None, (fields, row)
    _action(admin_client, ["katk.plain"], global_concurrency="5")  # the form does work
    assert kind_row("katk.plain").global_concurrency == 5


@pytest.mark.parametrize(
    "kind",
    ["ghost.kind", "katk.lim1", "a\x00b", "x" * 300],
    ids=["ghost", "registered-no-row", "nul", "long"],
)
def test_admin_kind_action_on_kind_without_row_writes_nothing(admin_client: Any, kind: str) -> None:
    """The action works on the rows listed: a forged selection naming a kind with no row (or a
    bad name) must not create one (adding is the "Limit a job kind" page, which checks)."""
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=2, actor="atk")
    resp = _action(admin_client, [kind], global_concurrency="3")
    assert resp.status_code in (200, 302, 400)
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 1
    assert kind_row("katk.plain").global_concurrency == 2


def test_open_transaction_setting_kind_limit_does_not_stall_claims(manage_py: Any) -> None:
    """set_kind_limits runs in the caller's transaction (documented): while that transaction
    stays open, claims of the queues holding the kind (and their other kinds) must go on."""
    from django.db import transaction

    from awa_django.operator.actions import set_kind_limits
    from tests.jobs.kind_limits import rated

    procs = [worker(manage_py, "--concurrency", "8")]
    wait_kind_limit("katk.rated")
    warm = [rated.enqueue().id for _ in range(3)]
    wait_completed(warm, procs)
    with transaction.atomic():
        set_kind_limits("katk.rated", rate_limit=30, rate_burst=3, actor="atk")
        with pg() as c:
            ids = [
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2(%s, 'katk-rate', 0, %s, 5)",
                    [k, json.dumps({"args": [], "kwargs": {}})],
                ).fetchone()[0]
                for k in ["katk.free", "katk.rated", "katk.free", "katk.rated", "katk.free"]
            ]
        t0 = time.monotonic()
        wait_completed(ids, procs, timeout=10)
        took = time.monotonic() - t0
    assert took < 2, f"claims stalled {took:.1f}s behind an open set_kind_limits transaction"


@pytest.mark.parametrize("via", ["queue"])
def test_queue_rate_set_again_after_clear_takes_effect_at_once(manage_py: Any, via: str) -> None:
    """Comparison with the kind finding: the same sequence on a queue's rate."""
    from awa_django.operator.actions import clear_queue_limits, set_queue_limits

    set_queue_limits("katk", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 0.5})]
    first = [plain.enqueue().id for _ in range(2)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    clear_queue_limits("katk", actor="atk")
    wait_completed(first, procs, timeout=5)
    set_queue_limits("katk", rate_limit=20, rate_burst=5, actor="atk")
    t0 = time.monotonic()
    ids = [plain.enqueue().id for _ in range(10)]
    wait_completed(ids, procs, timeout=30)
    took = time.monotonic() - t0
    assert took < 2.5, f"queue: 10 jobs at 20/s burst 5 took {took:.1f}s after set again"


def test_deploy_raising_kind_rate_takes_effect_at_once(manage_py: Any) -> None:
    """A deploy raises a kind's rate in AWA["KINDS"] (0.05/s -> 20/s): the new workers must run
    it at the new rate at once."""
    old = worker(
        manage_py,
        "--concurrency",
        "8",
        overrides={"KINDS": {"katk.settings_limited": {"rate_limit": 0.05, "rate_burst": 1}}},
    )
    wait_kind_limit("katk.settings_limited")
    from tests.jobs.kind_limits import settings_limited

    ids = [settings_limited.enqueue(seconds=0).id for _ in range(11)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    old.send_signal(signal.SIGTERM)
    assert old.wait(30) == 0
    new = worker(
        manage_py,
        "--concurrency",
        "8",
        overrides={"KINDS": {"katk.settings_limited": {"rate_limit": 20, "rate_burst": 5}}},
    )
    wait_for(lambda: (kind_row("katk.settings_limited").rate_limit or 0) == 20, timeout=20)
    t0 = time.monotonic()
    wait_completed(ids, [new], timeout=30)
    took = time.monotonic() - t0
    assert took < 2.5, f"after the deploy raised the rate, 10 jobs took {took:.1f}s"


def _apply_roles(manage_py: Any) -> dict[str, str]:
    names = {
        "app": "katk_app",
        "operator": "katk_ops",
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


def test_least_privilege_workers_park_and_unpark(manage_py: Any) -> None:
    """Workers running as the worker role (and the leader as the maintenance role) sync kind
    limits, park jobs, create hand-off lanes (every priority) and un-park them."""
    from django.db import connection

    from tests.support.database import database_url

    names = _apply_roles(manage_py)
    url = database_url({**connection.settings_dict, "USER": names["worker"], "PASSWORD": ""})
    murl = database_url({**connection.settings_dict, "USER": names["maintenance"], "PASSWORD": ""})
    env = worker_env(kind_limits)
    procs = [
        manage_py(
            "awa_worker",
            "--concurrency",
            "8",
            "--no-maintenance",
            extra_env={**env, "DATABASE_URL": url},
        )
        for _ in range(2)
    ]
    procs.append(
        manage_py("awa_worker", "--concurrency", "8", extra_env={**env, "DATABASE_URL": murl})
    )
    wait_kind_limit("katk.lim2", 2)
    ids = []
    for i in range(30):
        ids.append(
            lim2.using(priority=[-100, 0, 7, 100][i % 4], queue="katk-lp" if i % 2 else "katk")
            .enqueue(seconds=0.03)
            .id
        )
    wait_completed(ids, procs, timeout=60)
    assert max_overlap("katk.lim2") <= 2
    no_leak("katk.lim2")
    for p in procs:
        assert "permission denied" not in p.output().lower(), p.output()[-3000:]


@pytest.mark.parametrize("how", ["clear_to_settings", "operator_lower"])
def test_lowered_kind_limit_holds_while_over_limit(manage_py: Any, how: str) -> None:
    """4 of the kind run under an operator limit of 4; the limit drops to 2 (cleared back to
    @job's 2, or set to 2); two of the four end: the other two still hold the kind at its new
    limit, so nothing of the kind may start until one more ends."""
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    set_kind_limits("katk.lim2", global_concurrency=4, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim2", 4)
    held = [lim2.enqueue(block=f"b{i}").id for i in range(4)]
    wait_for(lambda: one("SELECT cur FROM katk_gauge WHERE name = 'katk.lim2'") == 4, timeout=20)
    if how == "clear_to_settings":
        clear_kind_limits("katk.lim2", actor="atk")
    else:
        set_kind_limits("katk.lim2", global_concurrency=2, actor="atk")
    rest = [lim2.enqueue(seconds=0.05).id for _ in range(8)]
    wait_for(lambda: (kind_row("katk.lim2").waiting or 0) >= 1, timeout=10)
    release("b0")
    release("b1")
    wait_completed(held[:2], procs, timeout=20)
    t_end = time.monotonic() + 1.5  # many claims (POLL_INTERVAL 0.05)
    wait_for(lambda: time.monotonic() > t_end, timeout=3)
    started = one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest])
    assert started == 0, f"{started} job(s) started while 2 of the kind still ran at limit 2"
    release("b2")
    release("b3")
    wait_completed([*held, *rest], procs, timeout=30)
    rows = q(
        "SELECT started, ended FROM katk_runs WHERE job_id = ANY(%s)", [[held[2], held[3], *rest]]
    )
    ev = sorted([(s, 1) for s, _ in rows] + [(e, 0) for _, e in rows], key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, k in ev:
        cur += 1 if k else -1
        best = max(best, cur)
    assert best <= 2
    no_leak("katk.lim2")


@pytest.mark.parametrize("workers", [1, 2])
def test_colliding_kind_permit_keys_never_pass_either_limit(manage_py: Any, workers: int) -> None:
    """docs: two kinds' permit keys colliding "only make the limits stricter". Session advisory
    locks are re-entrant: a worker holding the shared key for one kind must not take it again
    for the other kind, nor for a second job of the first."""
    import awa_django

    h1, h2 = "katk.h111070", "katk.h250426"
    assert one("SELECT hashtext('kind:' || %s || '/0') = hashtext('kind:' || %s || '/0')", [h1, h2])
    assert one("SELECT awa._flow_kind_key_v1(%s, 0) = awa._flow_kind_key_v1(%s, 0)", [h1, h2])
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(workers)]
    wait_kind_limit(h1, 1)
    wait_kind_limit(h2, 1)
    x = awa_django.enqueue(h1, kwargs={"block": "x"}).id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [x]), timeout=20)
    z = awa_django.enqueue(h2, kwargs={"block": "z"}).id
    ys = [awa_django.enqueue(h1, kwargs={"seconds": 0.05}).id for _ in range(3)]
    zs = [awa_django.enqueue(h2, kwargs={"seconds": 0.05}).id for _ in range(3)]
    t_end = time.monotonic() + 1.0
    wait_for(lambda: time.monotonic() > t_end, timeout=2)
    release("z")
    t_end = time.monotonic() + 1.0
    wait_for(lambda: time.monotonic() > t_end, timeout=2)
    release("x")
    wait_completed([x, z, *ys, *zs], procs, timeout=30)
    assert max_overlap(h1) <= 1, q(
        "SELECT job_id, kind, pid, started, ended FROM katk_runs ORDER BY started"
    )
    assert max_overlap(h2) <= 1, q(
        "SELECT job_id, kind, pid, started, ended FROM katk_runs ORDER BY started"
    )
    no_leak(h1)
    no_leak(h2)


def test_queue_actor_cannot_forge_limits_output(manage_py: Any) -> None:
    """Comparison: the same actor text on a queue's limits."""
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_queue_limits

    try:
        set_queue_limits("katk", global_concurrency=1, actor="atk\nkind:forged limit 1")
    except InvalidOptionError:
        return
    check_outputs(manage_py, [["awa_queue", "limits"], ["awa_status"]])
