"""Per-key serialisation with real worker processes (docs/flow.md, "Per-key serialisation"):
three keys of a hundred jobs each on four processes run one at a time per key, in enqueue
order, and in parallel across keys; a worker SIGKILLed while it runs a job of a key frees the
key, and every job of it still completes. Who ran when is read from the ledger's start and end
rows (database clock), never from job states, which finish in batches."""

from __future__ import annotations

import signal
from typing import Any

import pytest

import awa_django
from tests.jobs import common as testjobs
from tests.support.database import count, pg
from tests.support.ledger_runs import (
    assert_one_at_a_time,
    completed,
    overlapping_pairs,
    runs_by_key,
)
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.support.workers import Start, exited, worker
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]


def locks_held() -> int:
    return count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 4282183")


def stop(procs: list[ManagedProcess]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert exited(proc, 30) == 0, proc.output()


def test_three_keys_of_a_hundred_jobs_on_four_processes(manage_py: Start) -> None:
    keys = ["customer:1", "customer:2", "customer:3"]
    requests = [
        testjobs.serial_sleep.using(serial_key=keys[i % 3]).prepare(0.01) for i in range(300)
    ]
    # Jobs without a key in the same queue keep flowing past the parked ones.
    requests += [testjobs.serial_sleep.prepare(0.01) for _ in range(30)]
    handles = awa_django.enqueue_many(requests)
    expected = {key: [h.id for h in handles[i:300:3]] for i, key in enumerate(keys)}
    # A production-like staleness: rescue of an attempt slow to finalize on a loaded machine
    # would retry it, and a retry may run out of its key's order (docs/flow.md).
    steady = {"HEARTBEAT_STALENESS": 60.0}
    procs = [worker(manage_py, "--queue", "serial=4", overrides=steady) for _ in range(4)]
    wait_for(lambda: completed("serial") == 330, timeout=180, message="every job to complete")
    stop(procs)
    runs = runs_by_key()
    for key in keys:
        # Within a key: one at a time, each once, in enqueue order.
        assert [run[2] for run in runs[key]] == expected[key], key
        assert_one_at_a_time(runs[key])
    assert len(runs["None"]) == 30
    # Across keys: in parallel.
    assert overlapping_pairs(runs, keys) > 0
    workers = count(
        "SELECT count(DISTINCT c.worker_id) FROM awa.claims c WHERE NOT EXISTS ("
        "SELECT 1 FROM awa.claim_closures z WHERE z.job_id = c.job_id "
        "AND z.run_lease = c.run_lease AND z.outcome = 'parked')"
    )
    assert workers >= 2
    assert count("SELECT count(*) FROM awa.serial_waiting") == 0
    assert locks_held() == 0


def test_a_sigkilled_worker_frees_its_key_and_every_job_completes(manage_py: Start) -> None:
    keys = ["acct:a", "acct:b"]
    requests = [testjobs.serial_sleep.using(serial_key=keys[i % 2]).prepare(0.3) for i in range(24)]
    handles = awa_django.enqueue_many(requests)
    expected = {key: [h.id for h in handles[i::2]] for i, key in enumerate(keys)}
    procs = [worker(manage_py, "--queue", "serial=2") for _ in range(3)]
    wait_for(lambda: completed("serial") >= 4, timeout=60, message="the first jobs")

    ledger = Ledger._meta.db_table

    def victim() -> ManagedProcess | None:
        """The worker inside a handler right now, if any: its start is in the ledger (less
        than 0.15 s ago: the handler sleeps 0.3 s) and its end is not. A job the database
        still shows running may have ended its handler already (its completion not written
        yet), and a kill then cuts nothing short."""
        with pg() as conn:
            rows = conn.execute(
                "SELECT r.pid FROM awa.claims c "
                f"JOIN {ledger} s ON s.job_id = c.job_id AND s.run_lease = c.run_lease "
                "JOIN awa.runtime_instances r ON r.instance_id = c.worker_id "
                "WHERE s.note LIKE 'start:%%' AND s.created_at > now() - interval '0.15 s' "
                f"AND NOT EXISTS (SELECT 1 FROM {ledger} e WHERE e.job_id = c.job_id "
                "AND e.run_lease = c.run_lease AND e.note = 'end')"
            ).fetchall()
        pids = {row[0] for row in rows}
        return next((p for p in procs if p.pid in pids), None)

    found: list[ManagedProcess] = []

    def picked() -> bool:
        chosen = victim()
        if chosen is not None:
            found.append(chosen)
        return chosen is not None

    wait_for(picked, timeout=30, interval=0.02, message="a worker inside a handler")
    killed = found[0]
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    with pg() as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    killed_at: Any = row[0]
    survivors = [p for p in procs if p is not killed]
    # The killed attempt is rescued and retried; the key goes on meanwhile (the leader hands
    # it to its next job): no job is lost and no key stays stuck.
    wait_for(lambda: completed("serial") == 24, timeout=120, message="every job to complete")
    stop(survivors)
    runs = runs_by_key(killed_at)
    cut = {run[2] for key in keys for run in runs[key] if run[1] == killed_at}
    assert cut, "no attempt was running in the killed worker"
    # Rescued: the attempts the kill cut short, and any whose handler had ended but whose
    # completion had not been written yet (at-least-once: those run again).
    with pg() as conn:
        rescued = {
            row[0]
            for row in conn.execute(
                "SELECT job_id FROM awa.claim_closures WHERE outcome = 'rescued'"
            ).fetchall()
        }
    assert cut <= rescued
    for key in keys:
        assert_one_at_a_time(runs[key])
        # Enqueue order, apart from the rescued attempts and their retries.
        firsts = [run[2] for run in runs[key] if run[2] not in rescued]
        assert firsts == [i for i in expected[key] if i not in rescued], key
        assert {run[2] for run in runs[key]} == set(expected[key])
    # The key went on before the cut attempt was rescued (HEARTBEAT_STALENESS): the leader's
    # sweep handed it to the next job as soon as the dead worker's session freed it.
    for key in keys:
        after = [run[2] for run in runs[key] if run[0] > killed_at]
        if after and any(run[2] in cut for run in runs[key]):
            assert after[0] not in cut, (key, after)
    assert count("SELECT count(*) FROM awa.serial_waiting") == 0
    assert locks_held() == 0


def test_a_busy_worker_takes_its_key_back_at_once_when_its_session_ends(manage_py: Start) -> None:
    """A serial key's lock belongs to the worker's claim session. After a database restart (or
    a terminated backend) a worker whose slots are all busy makes no claim, so it used to take
    the key back only when its handler ended, and logged nothing; meanwhile the leader handed
    the key to the next job. It checks its session while it holds locks, takes the key back at
    once and says so."""
    awa_django.enqueue_many([testjobs.serial_sleep.using(serial_key="k").prepare(3)])
    proc = worker(manage_py, "--queue", "serial=1")

    def holder() -> int | None:
        with pg() as conn:
            row = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 4282183 "
                "AND granted"
            ).fetchone()
        return None if row is None else int(row[0])

    wait_for(lambda: holder() is not None, timeout=30, message="the worker to hold the key")
    first = holder()
    with pg() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", [first])
    wait_for(lambda: holder() not in (None, first), timeout=10, message="the key to be taken back")
    assert count(f"SELECT count(*) FROM {Ledger._meta.db_table} WHERE note = 'end'") == 0, (
        "the handler ended before the key was taken back"
    )
    wait_for(lambda: completed("serial") == 1, timeout=30, message="the job to complete")
    stop([proc])
    assert "claim connection reopened; took back 1 serial key lock(s)" in proc.output()
    assert locks_held() == 0
