"""Metrics (docs/observability.md, "Metrics") count every outcome as documented: a retry given
up by its age, a DLQ switched off at runtime, the rescue of a last attempt; queue waits per queue
and kind; two processes scraped under load sum exactly; a hostile traceparent or kind name from a
raw SQL producer neither fails the job nor forges a line of the scrape or the logs; a port range
past 65535 is refused up front.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.jobs import observability, worker_env
from tests.support.observability_probes import (
    FORGED,
    HOSTILE_TRACEPARENTS,
    WEIRD_KINDS,
    free_port,
    job_state,
    observability_env,
    scrape,
    start_metrics_worker,
    total,
    try_scrape,
)
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.usefixtures("clean_awa")


def test_metrics_a_retry_given_up_by_max_age_is_a_dead_letter_not_a_retry(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """docs: ``awa.jobs.retried`` counts "attempts that failed and will be retried",
    ``awa.jobs.dead_lettered`` "jobs that failed for good and went to the DLQ", and "counts
    are exact ... of what the database accepted". A RetryPolicy's ``max_age`` is applied by
    the database when the retry is written: the job goes to the DLQ on its first attempt, but
    the worker counts the attempt as *retried* (it decides from attempt < max_attempts) and
    never as dead-lettered. The worker's log line says "retry" too."""
    from tests.jobs.observability import too_old_to_retry

    worker, port = start_metrics_worker(manage_py, "atk-age")
    handle = too_old_to_retry.enqueue(1)
    wait_for(lambda: job_state(handle.id) == ("failed", True), timeout=30, message=worker.output)
    labels = {"awa_job_kind": handle.kind}

    outcomes = ("awa_jobs_retried_total", "awa_jobs_dead_lettered_total", "awa_jobs_failed_total")

    def counted() -> Any:
        # The worker counts an outcome once its batch is written and its fate read back: after
        # the commit the test saw, so wait for the count itself.
        samples = scrape(port)
        return samples if sum(total(samples, name, **labels) for name in outcomes) else None

    samples = wait_for(counted, timeout=15)
    got = {name: total(samples, name, **labels) for name in outcomes}
    assert got == {
        "awa_jobs_retried_total": 0,
        "awa_jobs_dead_lettered_total": 1,
        "awa_jobs_failed_total": 0,
    }, got


def test_metrics_dlq_switched_off_at_runtime_counts_failed_not_dead_lettered(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """docs: turning a queue's DLQ off "applies from the next failure on, on every worker",
    and ``awa.jobs.failed`` counts "jobs that failed for good and stayed in history (their
    queue's DLQ is off)". The database does apply it at once, but each worker's metrics read
    the DLQ policy at most every 10 s: a job that fails right after the switch is in history
    as failed while the worker's counter calls it dead-lettered."""
    from awa_django.operator import queue_dlq
    from tests.jobs.observability import fails_for_good, fine

    worker, port = start_metrics_worker(manage_py, "atk-dlq")
    warm = fine.enqueue(1)  # a first finalize makes the worker read the DLQ policy (DLQ on)
    wait_for(lambda: job_state(warm.id) == ("completed", False), timeout=30, message=worker.output)
    queue_dlq("atk-dlq", False)
    handle = fails_for_good.enqueue(2)
    wait_for(
        lambda: job_state(handle.id) is not None and job_state(handle.id)[0] == "failed",
        timeout=30,
        message=worker.output,
    )
    assert job_state(handle.id) == ("failed", False)  # the database: history, not the DLQ
    labels = {"awa_job_kind": handle.kind}

    def counted() -> Any:
        samples = scrape(port)
        done = total(samples, "awa_jobs_failed_total", **labels) + total(
            samples, "awa_jobs_dead_lettered_total", **labels
        )
        return samples if done else None

    samples = wait_for(counted, timeout=15)
    assert total(samples, "awa_jobs_dead_lettered_total", **labels) == 0
    assert total(samples, "awa_jobs_failed_total", **labels) == 1


def test_metrics_rescue_of_a_last_attempt_counts_a_dead_letter(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """docs: a job goes to the DLQ when it fails for good, "a rescue of its last attempt"
    included, and ``awa.jobs.dead_lettered`` counts "jobs that failed for good and went to the
    DLQ" (the dashboard's "dead letters" panel and failure ratio read it). A SIGKILLed worker's
    last attempt, rescued by the leader into the DLQ, is counted as rescued only: the dead
    letter is in no counter of any process."""
    from tests.jobs.observability import sleeps

    victim = manage_py(
        "awa_worker", "--queue", "atk-rescue", "--no-maintenance", extra_env=observability_env()
    )
    handle = sleeps.enqueue(60.0)
    wait_for(lambda: job_state(handle.id) == ("running", False), timeout=30, message=victim.output)
    victim.kill()
    leader, port = start_metrics_worker(manage_py, "atk-other")
    wait_for(lambda: job_state(handle.id) == ("failed", True), timeout=60, message=leader.output)
    labels = {"awa_job_kind": handle.kind}
    samples = wait_for(
        lambda: (s := scrape(port)) and total(s, "awa_jobs_rescued_total", **labels) and s,
        timeout=15,
    )
    assert total(samples, "awa_jobs_rescued_total", **labels) == 1
    assert total(samples, "awa_jobs_dead_lettered_total", **labels) == 1, (
        "the rescued last attempt went to the DLQ but no counter says so"
    )


def test_metrics_port_range_past_65535_with_processes_is_refused_up_front(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """docs: "With --processes N the children serve ports 9464 to 9464+N-1". The option
    accepts 1..65535 for PORT alone, so ``--processes 2 --metrics-port 65535`` starts; child 1
    then binds 65536, dies with an OverflowError traceback (not the OSError the command turns
    into a clear CommandError), and the supervisor restarts it forever with backoff: even a
    ``--burst`` run never ends. Expected: a usage error (status 2) before any child starts."""
    worker = manage_py(
        "awa_worker",
        "--processes",
        "2",
        "--burst",
        "--metrics-port",
        "65535",
        "--metrics-host",
        "127.0.0.1",
    )
    try:
        code = worker.wait(40)
    except AssertionError:
        pytest.fail("still running after 40 s; output:\n" + worker.output()[-3000:])
    assert code == 2, worker.output()[-3000:]
    assert "Traceback" not in worker.output(), worker.output()[-3000:]


def test_queue_wait_of_a_fresh_job_with_a_past_run_after_is_not_its_age_since_run_after(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """``run_after`` accepts any aware datetime, a past one meaning "now" (docs/jobs.md): the
    queue wait of a job enqueued with ``run_after=<yesterday>`` and claimed at once must not be
    a day (held: the past run_after is stored as now)."""
    import datetime as dt

    from tests.jobs.observability import fine

    worker, port = start_metrics_worker(manage_py, "atk-dlq")
    yesterday = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    handle = fine.using(run_after=yesterday).enqueue(1)
    wait_for(
        lambda: job_state(handle.id) == ("completed", False), timeout=30, message=worker.output
    )
    labels = {"awa_job_kind": handle.kind, "messaging_destination_name": "atk-dlq"}
    samples = wait_for(
        lambda: (s := scrape(port)) and total(s, "awa_queue_wait_seconds_count", **labels) and s,
        timeout=15,
    )
    assert total(samples, "awa_queue_wait_seconds_count", **labels) == 1
    waited = total(samples, "awa_queue_wait_seconds_sum", **labels)
    assert 0 <= waited < 60, f"a job enqueued and claimed within seconds waited {waited:.0f} s"


def test_queue_wait_is_recorded_per_queue_and_kind_and_sane(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """The queue-wait histogram for ordinary jobs: one series per queue and kind, every value
    between 0 and the test's own duration."""
    from tests.jobs.observability import fails_for_good, fine

    started = time.monotonic()
    worker, port = start_metrics_worker(manage_py, "atk-dlq")
    ids = [fine.enqueue(i).id for i in range(30)] + [fails_for_good.enqueue(99).id]

    def finished(job_id: int) -> bool:
        state = job_state(job_id)  # None: finished and pruned already (the ring turns fast here)
        return state is None or state[0] == "failed" or state == ("completed", False)

    wait_for(lambda: all(finished(i) for i in ids), timeout=60, message=worker.output)
    samples = wait_for(
        lambda: (s := scrape(port)) and total(s, "awa_queue_wait_seconds_count") >= 31 and s,
        timeout=15,
    )
    elapsed = time.monotonic() - started
    for kind, n in (
        ("tests.jobs.observability.fine", 30),
        ("tests.jobs.observability.fails_for_good", 1),
    ):
        labels = {"awa_job_kind": kind, "messaging_destination_name": "atk-dlq"}
        assert total(samples, "awa_queue_wait_seconds_count", **labels) == n
        assert 0 <= total(samples, "awa_queue_wait_seconds_sum", **labels) <= n * elapsed


def test_hostile_traceparent_from_a_raw_sql_producer_does_not_fail_the_job(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Raw SQL producers may put anything under the reserved ``awa:traceparent`` and
    ``awa:tracestate`` keys (awa.enqueue_v1 accepts them). A worker with traces on must run
    every such job to completion."""
    from tests.support.database import pg

    jobs = []
    for i, value in enumerate(HOSTILE_TRACEPARENTS):
        for state in (None, "k=v", "x" * 20000, ",".join(f"k{n}=v" for n in range(2000)), 7):
            metadata: dict[str, Any] = {"awa:traceparent": value}
            if state is not None:
                metadata["awa:tracestate"] = state
            jobs.append(
                {
                    "kind": "tests.jobs.observability.fine",
                    "queue": "atk-trace",
                    "args": {"args": [i], "kwargs": {}},
                    "metadata": metadata,
                }
            )
    with pg() as conn:
        ids = [
            int(r[0])
            for r in conn.execute(
                "SELECT job_id FROM awa.enqueue_v1(%s)", [json.dumps(jobs)]
            ).fetchall()
        ]
    env = worker_env(observability, OTEL_TRACES=True)
    worker = manage_py(
        "awa_worker",
        "--queue",
        "atk-trace",
        "--burst",
        extra_env=env,
    )
    assert worker.wait(120) == 0, worker.output()[-3000:]
    states = {i: job_state(i) for i in ids}
    assert all(s == ("completed", False) for s in states.values()), states
    assert "Traceback" not in worker.output(), worker.output()[-3000:]


def test_hostile_kinds_from_raw_sql_scrape_cleanly_and_do_not_forge_log_lines(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """awa.enqueue_v1 accepts any kind of 1-255 characters, quotes, backslashes and newlines
    included. The worker fails them (unknown kind); the scrape must still parse, with one
    dead letter per kind, and the worker's text log must not let a kind forge a log line."""
    from tests.support.database import pg

    with pg() as conn:
        ids = [
            int(r[0])
            for r in conn.execute(
                "SELECT job_id FROM awa.enqueue_v1(%s)",
                [
                    json.dumps(
                        [{"kind": k, "queue": "atk-weird", "max_attempts": 1} for k in WEIRD_KINDS]
                    )
                ],
            ).fetchall()
        ]
    worker, port = start_metrics_worker(manage_py, "atk-weird")
    wait_for(
        lambda: all(job_state(i) == ("failed", True) for i in ids),
        timeout=30,
        message=worker.output,
    )
    samples = wait_for(
        lambda: (s := scrape(port)) and total(s, "awa_jobs_dead_lettered_total") >= len(ids) and s,
        timeout=15,
    )
    for kind in WEIRD_KINDS:
        assert total(samples, "awa_jobs_dead_lettered_total", awa_job_kind=kind) == 1, kind
    forged = [line for line in worker.output().splitlines() if line.startswith(FORGED)]
    assert not forged, worker.output()[-2000:]


def test_metrics_under_load_with_two_processes_parse_and_sum_exactly(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """2,000 jobs drained by ``--processes 2 --metrics-port P``: both ports parse with
    prometheus_client's parser on every scrape during the drain, the queue-wait histogram's sum
    is never negative, and at the end consumed and completed summed over the two children are
    exactly 2,000, with no more queue waits than jobs consumed.

    During the drain a scrape may read the histogram a claim batch ahead of the counter: one
    scrape collects its instruments one after the other while the worker goes on claiming, so
    the two are compared once the worker is idle."""
    import awa_django
    from tests.jobs.observability import fine

    awa_django.enqueue_many([fine.prepare(i) for i in range(2000)])
    port = free_port()
    while True:  # P and P+1 both free
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            port = free_port()
    worker = manage_py(
        "awa_worker",
        "--processes",
        "2",
        "--queue",
        "atk-dlq",
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        extra_env=observability_env(),
    )
    labels = {"awa_job_kind": "tests.jobs.observability.fine"}

    def drained() -> tuple[int, int] | None:
        """Both ports parse on every scrape; (completed, consumed) once 2,000 completed."""
        pages = [try_scrape(port), try_scrape(port + 1)]
        if not all(pages):
            return None
        for page in pages:
            assert page is not None
            assert total(page, "awa_queue_wait_seconds_sum", **labels) >= 0
        done = sum(total(p, "awa_jobs_completed_total", **labels) for p in pages if p)
        consumed = sum(
            total(p, "messaging_client_consumed_messages_total", **labels) for p in pages if p
        )
        return (done, consumed) if done >= 2000 else None

    counts = wait_for(drained, timeout=120, interval=0.2, message=lambda: worker.output()[-3000:])
    assert counts == (2000, 2000)
    for page in (scrape(port), scrape(port + 1)):  # idle now: nothing is claimed mid-scrape
        assert total(page, "awa_queue_wait_seconds_count", **labels) <= total(
            page, "messaging_client_consumed_messages_total", **labels
        )
