"""Hostile tests of the observability features (issue 18): health probes, metrics, traces,
structured logs and operator actions, aimed from the user docs (docs/observability.md).

Each test states the documented behaviour it checks; several fail on purpose (findings)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.jobs import observability, worker_env
from tests.support.database import conninfo, database_url
from tests.support.polling import wait_for
from tests.support.processes import REPO, ManagedProcess

pytestmark = pytest.mark.usefixtures("clean_awa")


# -- helpers -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a /metrics page, parsed with prometheus_client's text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def total(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def try_scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
    try:
        return scrape(port)
    except OSError:
        return None


def job_state(job_id: int) -> tuple[str, bool] | None:
    from awa_django.operator import job_show

    detail = job_show(job_id)
    return None if detail is None else (str(detail.state), bool(detail.in_dlq))


def atk_env() -> dict[str, str]:
    return worker_env(observability)


@pytest.fixture
def hung_server() -> Iterator[str]:
    """A DATABASE_URL whose server accepts TCP connections and then never says a word (a
    frozen PostgreSQL, a half-open firewall, a SIGSTOPped pgbouncer)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/awa"
    finally:
        listener.close()


def run_python(
    code: str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str] | None:
    """Run ``code`` with tests.settings; None when it did not end within ``timeout``."""
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None


# -- health probes ---------------------------------------------------------------------------


def test_health_command_huge_stale_after_is_a_usage_error_not_a_database_failure(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """``--stale-after 1e300`` passes the command's own check (finite, above 0) and then makes
    PostgreSQL's make_interval overflow: the probe says "database error: interval out of range"
    (exit 1), blaming a healthy database. A bad argument must exit 2 (docs: "bad arguments exit
    with status 2"), or the value be capped."""
    for value in ("1e300", "1e308"):
        probe = manage_py("awa_health", "--no-leader", "--stale-after", value)
        code = probe.wait(60)
        assert "database error" not in probe.output(), probe.output()
        assert code == 2, (value, code, probe.output())


def test_health_view_answers_when_the_database_server_hangs(hung_server: str) -> None:
    """docs: the view answers 503 "when one fails (the database unreachable included)", and
    the database check fails when "a check's statement fails or runs past 5 s". Against a
    server that accepts the connection but never answers (frozen PostgreSQL), the view never
    answers at all: no connect timeout, and statement_timeout is enforced by the frozen server
    itself. Every probe then pins a web worker thread forever."""
    code = (
        "import django; django.setup()\n"
        "from django.test import Client\n"
        "r = Client(raise_request_exception=False).get('/awa/health/')\n"
        "print(r.status_code)\n"
    )
    started = time.monotonic()
    done = run_python(code, {"DATABASE_URL": hung_server}, timeout=40)
    assert done is not None, (
        f"the health view did not answer within {time.monotonic() - started:.0f} s "
        "against a server that does not answer"
    )
    assert done.stdout.strip() == "503", done.stdout + done.stderr


def test_health_command_ends_when_the_database_server_hangs(hung_server: str) -> None:
    """The same for ``manage.py awa_health``: it hangs forever instead of exiting 1 with
    "database error: ..." (a systemd or cron probe without its own timeout never ends)."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "django", "awa_health", "--no-worker"],
            cwd=REPO,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": hung_server,
            },
            capture_output=True,
            text=True,
            timeout=40,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"awa_health still running after {time.monotonic() - started:.0f} s")
    assert done.returncode == 1, done
    assert "database" in done.stderr, done.stderr


# -- metrics: exact counts -----------------------------------------------------------------------


def start_metrics_worker(
    manage_py: Callable[..., ManagedProcess], queue: str, *extra: str
) -> tuple[ManagedProcess, int]:
    port = free_port()
    worker = manage_py(
        "awa_worker",
        "--queue",
        queue,
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        *extra,
        extra_env=atk_env(),
    )
    wait_for(lambda: try_scrape(port), timeout=30, message=worker.output)
    return worker, port


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

    def counted() -> Any:
        samples = scrape(port)
        return (
            samples
            if total(samples, "messaging_client_consumed_messages_total", **labels)
            else None
        )

    samples = wait_for(counted, timeout=15)
    got = {
        name: total(samples, name, **labels)
        for name in (
            "awa_jobs_retried_total",
            "awa_jobs_dead_lettered_total",
            "awa_jobs_failed_total",
        )
    }
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
        "awa_worker", "--queue", "atk-rescue", "--no-maintenance", extra_env=atk_env()
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
    wait_for(
        lambda: all(
            (job_state(i) and job_state(i)[0] == "failed") or job_state(i) == ("completed", False)
            for i in ids
        ),
        timeout=60,
        message=worker.output,
    )
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


# -- traces: hostile traceparent values in metadata ----------------------------------------------

HOSTILE_TRACEPARENTS: list[Any] = [
    "00-" + "a" * 40000,
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\u200b",
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
    "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",
    "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future-fields",
    "",
    5,
    None,
    ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
    {"nested": {"deep": [1, 2, 3]}},
]


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


# -- structured logs: JsonFormatter --------------------------------------------------------------


def _record(msg: str = "m", **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("tests.atk", logging.INFO, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


def _strict_json(line: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    line.encode("utf-8")  # what a StreamHandler on a UTF-8 file or stdout must write
    return json.loads(line, parse_constant=refuse)


def _circular() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def _deep() -> list[Any]:
    value: list[Any] = []
    for _ in range(50000):
        value = [value]
    return value


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr refuses")


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(
            _record("a lone surrogate \udcff (os.listdir of a latin-1 name)"),
            id="surrogate-message",
        ),
        pytest.param(_record("m", path="/tmp/\udce9t\udce9"), id="surrogate-extra"),
        pytest.param(_record("m", ratio=float("nan"), top=float("inf")), id="nan-inf"),
        pytest.param(_record("m", payload=_circular()), id="circular"),
        pytest.param(_record("m", payload={(1, 2): "tuple key"}), id="non-str-key"),
        pytest.param(_record("m", payload=_deep()), id="deep-nesting"),
        pytest.param(_record("m", thing=_BadRepr()), id="repr-raises"),
    ],
)
@pytest.mark.django_db
def test_json_formatter_writes_one_valid_json_line_whatever_the_record_holds(
    record: logging.LogRecord,
) -> None:
    """docs: JsonFormatter "writes one JSON object per record, on one line ... A value JSON
    cannot hold is written as its repr" (module doc: "whatever the record holds"). Each of
    these makes it raise (so logging prints "--- Logging error ---" and the record is lost) or
    write a line a JSON parser or a UTF-8 stream refuses (NaN, Infinity, lone surrogates with
    ensure_ascii=False)."""
    from awa_django.telemetry.logs import JsonFormatter

    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = _strict_json(line)
    assert parsed["logger"] == "tests.atk"


# -- the health view -----------------------------------------------------------------------------


def test_health_view_other_methods_get_405_not_a_csrf_page() -> None:
    """docs: "other methods get 405". With Django's CsrfViewMiddleware (in every default
    project, and in tests.settings) a POST, PUT, PATCH or DELETE never reaches the view's
    require_GET: the answer is the CSRF failure page, 403 text/html."""
    from django.test import Client

    client = Client(raise_request_exception=False, enforce_csrf_checks=True)
    for method in ("post", "put", "patch", "delete"):
        response = getattr(client, method)("/awa/health/?leader=0")
        assert response.status_code == 405, (method, response.status_code, response["Content-Type"])


def test_health_view_too_many_parameters_is_a_json_400() -> None:
    """docs: "a bad parameter is a 400 with {"error": ...}". 1,001 ``max_lag`` values (past
    DATA_UPLOAD_MAX_NUMBER_FIELDS) get Django's HTML "Bad Request (400)" page instead: a
    probe client that parses the JSON body chokes."""
    from django.test import Client

    client = Client(raise_request_exception=False)
    response = client.get("/awa/health/?" + "&".join(["max_lag=5"] * 1001))
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json", response.content[:200]
    assert "error" in response.json()


def test_health_view_a_lock_on_the_control_tables_is_a_prompt_503() -> None:
    """A DB error mid-query: another session holds an ACCESS EXCLUSIVE lock on
    awa.runtime_instances (a migration, a VACUUM FULL). The view must answer 503 with a
    database check, within its documented bounds (1 s lock timeout, 5 s statement timeout),
    and never a 500."""
    from django.test import Client

    from tests.support.database import pg

    with pg(autocommit=False) as locker:
        locker.execute("LOCK TABLE awa.runtime_instances IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        response = Client(raise_request_exception=False).get("/awa/health/?host=web-1")
        elapsed = time.monotonic() - started
        locker.rollback()
    assert response.status_code == 503, response.content[:300]
    body = response.json()
    assert body["status"] == "unhealthy" and not body["checks"]["database"]["ok"], body
    assert elapsed < 6, elapsed
    assert "no-store" in response["Cache-Control"]


# -- operator actions ----------------------------------------------------------------------------


def test_history_retry_racing_callers_make_one_live_copy() -> None:
    """docs: "A job is retried from history at most once: a second request, however many
    race, answers already_retried with the first retry's id". Eight sessions retry the same
    cancelled job at the same instant (a barrier), through the public API."""
    import threading

    from django.db import connections

    import awa_django
    from awa_django.operator import history_retry, job_list
    from tests.jobs.observability import fine

    original = fine.using(queue="atk-hist").enqueue(1)
    awa_django.cancel(original.id)
    assert job_state(original.id) == ("cancelled", False)
    barrier = threading.Barrier(8)
    results: list[Any] = []
    errors: list[BaseException] = []

    def retry(n: int) -> None:
        try:
            barrier.wait(10)
            results.extend(history_retry([original.id], by=f"racer {n}"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=retry, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    outcomes = sorted(r.outcome for r in results)
    assert outcomes == ["already_retried"] * 7 + ["retried"], outcomes
    assert len({r.retry_job_id for r in results}) == 1, results
    live = [j for j in job_list(queue="atk-hist", limit=100) if j.id != original.id]
    assert len(live) == 1, live


def test_history_retry_from_the_command_line_twice_concurrently(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """The same race through ``manage.py awa_job retry``: one retries, the other says the job
    was already retried (exit statuses may differ, but one live copy only)."""
    import awa_django
    from awa_django.operator import job_list
    from tests.jobs.observability import fine

    original = fine.using(queue="atk-hist2").enqueue(1)
    awa_django.cancel(original.id)
    procs = [manage_py("awa_job", "retry", str(original.id), "--by", f"op{n}") for n in range(4)]
    for p in procs:
        p.wait(60)
    live = [j for j in job_list(queue="atk-hist2", limit=100) if j.id != original.id]
    assert len(live) == 1, [p.output() for p in procs]
    outputs = "\n".join(p.output() for p in procs)
    assert "Traceback" not in outputs, outputs


BAD_QUEUES = {"QUEUES": {"BAD QUEUE": {"dlq": False}, "atk-good": {"dlq": False}}}


def test_one_invalid_queue_name_in_awa_queues_is_refused_before_anything_is_written(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """``AWA["QUEUES"]`` with one key that is not a valid queue name (only ``dlq`` set) once
    made the start-up sync fail half-way: the valid queue's ``dlq: False`` was never written,
    and the only trace was a warning blaming "periodic schedules". Now the setting itself is
    refused: the worker exits at once naming the key, and nothing is written."""
    env = worker_env(observability, **BAD_QUEUES)
    worker = manage_py(
        "awa_worker",
        "--burst",
        "--queue",
        "atk-none",
        extra_env=env,
    )
    assert worker.wait(60) != 0, worker.output()
    assert "'BAD QUEUE' is not a valid queue name" in worker.output(), worker.output()
    from tests.support.database import pg

    with pg() as conn:
        row = conn.execute(
            "SELECT dlq_enabled FROM awa.queue_meta WHERE queue = 'atk-good'"
        ).fetchone()
    assert row is None


def test_system_check_refuses_an_invalid_queue_name_in_awa_queues(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """``manage.py check`` says nothing about ``AWA["QUEUES"]["BAD QUEUE"]`` (it checks the
    names of queues with flow limits only): the mistake surfaces only as a warning in the
    workers' logs."""
    check = manage_py("check", extra_env=worker_env(**BAD_QUEUES))
    code = check.wait(60)
    assert code != 0 and "BAD QUEUE" in check.output(), check.output()


HOSTILE_TEXT = ["a\x00b", "x" * 100_000, "{a,b}", "'); DROP TABLE x; --", "%", "\\", "\u202e", ""]


@pytest.mark.parametrize("page", ["deadletter", "terminaljob", "livejob"])
def test_admin_tag_filter_with_hostile_values_never_500s(page: str) -> None:
    """The admin's tag filter (docs/admin.md: "any other tag still filters with ?tag=...")
    with NUL, huge, array-literal, SQL and LIKE metacharacter values, and repeated."""
    from urllib.parse import urlencode

    from tests.support.factories import staff

    client = staff()
    client.raise_request_exception = False
    for value in HOSTILE_TEXT:
        for query in (
            urlencode({"tag": value}),
            urlencode([("tag", value), ("tag", "b")]),
            urlencode({"tag": value, "queue": value, "kind": value}),
        ):
            response = client.get(f"/admin/awa_django/{page}/?{query}")
            assert response.status_code in (200, 302, 400), (page, value[:20], response.status_code)


def test_admin_dlq_action_with_hostile_selected_queues_never_500s() -> None:
    """The queue list's "Turn the DLQ off" action posted with forged selections: a NUL, a
    name that is not a queue, a huge one. Nothing is written, no 500."""
    from tests.support.factories import staff

    client = staff("manage_queue")
    client.raise_request_exception = False
    for value in [*HOSTILE_TEXT, "BAD QUEUE", "no-such-queue"]:
        response = client.post(
            "/admin/awa_django/queuestat/",
            {
                "action": "dlq_off_queues",
                "_selected_action": [value],
                "confirm": "yes",
                "post": "yes",
            },
        )
        assert response.status_code in (200, 302), (value[:20], response.status_code)
    from tests.support.database import pg

    with pg() as conn:
        assert conn.execute(
            "SELECT count(*) FROM awa.queue_meta WHERE NOT dlq_enabled"
        ).fetchone() == (0,)


FORGED = "1999-01-01 00:00:00,000 CRITICAL awa_django.worker: forged line"
WEIRD_KINDS = ['weird"kind{x}\\', "é\u2028kind", " lead", "atk.kind\n" + FORGED]


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
    prometheus_client's parser on every scrape during the drain, and at the end consumed and
    completed summed over the two children are exactly 2,000; the queue-wait histogram's count
    never exceeds the consumed count and its sum is never negative."""
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
        extra_env=atk_env(),
    )
    labels = {"awa_job_kind": "tests.jobs.observability.fine"}

    def drained() -> tuple[int, int] | None:
        """Both ports parse on every scrape; (completed, consumed) once 2,000 completed."""
        pages = [try_scrape(port), try_scrape(port + 1)]
        if not all(pages):
            return None
        for page in pages:
            assert page is not None
            assert total(page, "awa_queue_wait_seconds_count", **labels) <= total(
                page, "messaging_client_consumed_messages_total", **labels
            )
            assert total(page, "awa_queue_wait_seconds_sum", **labels) >= 0
        done = sum(total(p, "awa_jobs_completed_total", **labels) for p in pages if p)
        consumed = sum(
            total(p, "messaging_client_consumed_messages_total", **labels) for p in pages if p
        )
        return (done, consumed) if done >= 2000 else None

    counts = wait_for(drained, timeout=120, interval=0.2, message=lambda: worker.output()[-3000:])
    assert counts == (2000, 2000)


def test_health_without_checks_on_an_unmigrated_database_is_unhealthy(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """``awa_health --no-worker --no-leader`` said "database reachable" (exit 0) on a database
    that was never migrated; it now checks that the awa schema is installed."""
    from django.db import connection

    db = connection.settings_dict
    server = psycopg.conninfo.make_conninfo(conninfo(), dbname="postgres")
    name = "awa_health_unmigrated"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = database_url({**db, "NAME": name})
        probe = manage_py(
            "awa_health", "--no-worker", "--no-leader", extra_env={"DATABASE_URL": url}
        )
        assert probe.wait(60) == 1, probe.output()
        assert "the awa schema is not installed" in probe.output(), probe.output()
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
