"""OpenTelemetry metrics (docs/observability.md, "Metrics"): exact counts after a known workload
(OpenTelemetry's in-memory reader, a worker runtime in this process), the Prometheus endpoint
of ``awa_worker --metrics-port`` scraped over HTTP and parsed with prometheus_client's text
parser, and nothing of OpenTelemetry imported while it is off."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

from awa_django.db import storage
from awa_django.operator import queue_dlq
from awa_django.telemetry.metrics import use_meter_provider
from awa_django.worker.config import build_config
from awa_django.worker.runtime import WorkerRuntime
from tests.jobs import common as testjobs
from tests.jobs import observability as obsjobs
from tests.jobs import worker_env
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]
SAYS, SAYS_ASYNC, FAILS = obsjobs.says.kind, obsjobs.says_async.kind, obsjobs.fails.kind
SNOOZER, GIVE_UP = testjobs.snoozer.kind, testjobs.give_up.kind


def finalized(ids: list[int]) -> bool:
    with pg() as conn:
        row = conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND finalized_at IS NOT NULL",
            [ids],
        ).fetchone()
    return row is not None and row[0] == len(ids)


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    memory = InMemoryMetricReader()
    use_meter_provider(MeterProvider(metric_readers=[memory]))
    yield memory
    use_meter_provider(None, force=False)


def points(reader: InMemoryMetricReader) -> dict[str, dict[tuple[Any, ...], Any]]:
    """Every data point: {instrument name: {sorted attribute items: point}}."""
    found: dict[str, dict[tuple[Any, ...], Any]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = tuple(sorted((point.attributes or {}).items()))
                    found.setdefault(metric.name, {})[key] = point
    return found


def job_key(queue: str, kind: str) -> tuple[Any, ...]:
    return tuple(
        sorted(
            {
                "messaging.system": "awa",
                "messaging.destination.name": queue,
                "awa.job.kind": kind,
            }.items()
        )
    )


def values(found: dict[str, dict[tuple[Any, ...], Any]], name: str) -> dict[tuple[str, str], int]:
    out = {}
    for key, point in found.get(name, {}).items():
        attrs = dict(key)
        out[(attrs["messaging.destination.name"], attrs["awa.job.kind"])] = point.value
    return out


@pytest.mark.worker
def test_metrics_after_a_known_workload_match_it_exactly(reader: InMemoryMetricReader) -> None:
    queue_dlq("obs-nodlq", False)
    ids = [obsjobs.says.enqueue(i).id for i in range(5)]
    ids += [obsjobs.says_async.enqueue(i).id for i in range(3)]
    ids.append(obsjobs.fails.enqueue(1).id)  # retried once, then dead-lettered
    ids.append(obsjobs.fails.using(queue="obs-nodlq").enqueue(2).id)  # retried, then failed
    ids.append(testjobs.give_up.enqueue().id)  # cancelled
    ids.append(testjobs.snoozer.enqueue(1).id)  # snoozed once, then completed
    runtime = WorkerRuntime(
        build_config(queues=[("obs", 8), ("obs-nodlq", 8), ("work", 8)], concurrency=16),
        handle_signals=False,
    )
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(asyncio.run(runtime.run())))
    thread.start()
    try:
        wait_for(lambda: finalized(ids), timeout=30, message="every job to end")
        # The leader's gauge snapshot, taken after the work is done.
        wait_for(
            lambda: (
                (p := points(reader).get("awa.queue.depth"))
                and all(point.value == 0 for point in p.values())
            ),
            timeout=10,
            message="the leader's queue gauges",
        )
    finally:
        runtime.request_stop()
        thread.join(30)
    assert done == [0]
    found = points(reader)
    assert values(found, "messaging.client.sent.messages") == {
        ("obs", SAYS): 5,
        ("obs", SAYS_ASYNC): 3,
        ("obs", FAILS): 1,
        ("obs-nodlq", FAILS): 1,
        ("work", GIVE_UP): 1,
        ("work", SNOOZER): 1,
    }
    claimed = {
        ("obs", SAYS): 5,
        ("obs", SAYS_ASYNC): 3,
        ("obs", FAILS): 2,
        ("obs-nodlq", FAILS): 2,
        ("work", GIVE_UP): 1,
        ("work", SNOOZER): 2,
    }
    assert values(found, "messaging.client.consumed.messages") == claimed
    assert values(found, "awa.jobs.completed") == {
        ("obs", SAYS): 5,
        ("obs", SAYS_ASYNC): 3,
        ("work", SNOOZER): 1,
    }
    assert values(found, "awa.jobs.retried") == {("obs", FAILS): 1, ("obs-nodlq", FAILS): 1}
    assert values(found, "awa.jobs.dead_lettered") == {("obs", FAILS): 1}
    assert values(found, "awa.jobs.failed") == {("obs-nodlq", FAILS): 1}
    assert values(found, "awa.jobs.cancelled") == {("work", GIVE_UP): 1}
    assert values(found, "awa.jobs.snoozed") == {("work", SNOOZER): 1}
    assert "awa.jobs.rescued" not in found
    # One handler duration per attempt (all within the sampling budget).
    durations = found["messaging.process.duration"]
    assert {k: p.count for k, p in durations.items()} == {
        job_key(*pair): n for pair, n in claimed.items()
    }
    assert all(p.min >= 0 and p.sum < 30 for p in durations.values())
    # One queue wait per claimed attempt, measured on the database clock.
    waits = found["awa.queue.wait"]
    assert {k: p.count for k, p in waits.items()} == {
        job_key(*pair): n for pair, n in claimed.items()
    }
    assert all(p.min >= 0 and p.sum < 60 for p in waits.values())
    claims = found["awa.claim.batch_size"]
    assert sum(p.sum for p in claims.values()) == sum(claimed.values())
    assert sum(p.sum for p in found["awa.finalize.batch_size"].values()) == sum(claimed.values())
    # The leader's gauges and maintenance events.
    assert {dict(k)["messaging.destination.name"] for k in found["awa.queue.depth"]} >= {
        "obs",
        "obs-nodlq",
        "work",
    }
    assert all(p.value == 0 for p in found["awa.queue.lag"].values())
    [alive] = found["awa.workers.alive"].values()
    assert alive.value >= 1
    events = {
        dict(k)["awa.maintenance.event"]: p.value
        for k, p in found["awa.maintenance.events"].items()
    }
    assert events["promoted"] >= 3  # the two retries and the snooze came back through promotion


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, Any]:
    """Every sample of the endpoint: {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[Any, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(samples: dict[Any, Any], name: str, **labels: str) -> Any:
    wanted = {"messaging_system": "awa", **labels}
    matches = [
        v
        for (n, key), v in samples.items()
        if n == name and all(dict(key).get(k) == w for k, w in wanted.items())
    ]
    return matches[0] if len(matches) == 1 else matches


@pytest.mark.worker
def test_the_prometheus_endpoint_is_scraped_and_parsed(manage_py: Start) -> None:
    ids = [obsjobs.says.enqueue(i).id for i in range(4)] + [obsjobs.fails.enqueue(9).id]
    port = free_port()
    proc = manage_py(
        "awa_worker",
        "--queue",
        "obs",
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        extra_env=worker_env(obsjobs),
    )
    wait_for(lambda: finalized(ids), timeout=30, message=lambda: f"the jobs\n{proc.output()}")
    completed = "awa_jobs_completed_total"
    samples = wait_for(
        lambda: (
            (s := scrape(port))
            and sample(s, completed, awa_job_kind=SAYS) == 4
            and sample(s, "awa_jobs_dead_lettered_total", awa_job_kind=FAILS) == 1
            and sample(s, "awa_workers_alive") != []
            # The depth and lag gauges read the leader's last maintenance snapshot, which
            # may predate the last completions: wait for one taken after them.
            and sample(s, "awa_queue_depth", messaging_destination_name="obs") == 0
            and sample(s, "awa_queue_lag_seconds", messaging_destination_name="obs") == 0
            and s
        ),
        timeout=20,
        message=lambda: f"the counts on the endpoint\n{proc.output()}",
    )
    labels = {"messaging_destination_name": "obs"}
    assert sample(samples, "messaging_client_consumed_messages_total", awa_job_kind=SAYS) == 4
    assert sample(samples, "messaging_client_consumed_messages_total", awa_job_kind=FAILS) == 2
    assert sample(samples, "awa_jobs_retried_total", awa_job_kind=FAILS, **labels) == 1
    assert sample(samples, "messaging_process_duration_seconds_count", awa_job_kind=SAYS) == 4
    assert sample(samples, "awa_queue_depth", **labels) == 0
    assert sample(samples, "awa_queue_lag_seconds", **labels) == 0
    assert sample(samples, "awa_workers_alive") >= 1
    assert any(name == "awa_maintenance_events_total" for name, _ in samples)
    # The leader runs maintenance on its own thread and reports how late each task started.
    lags = [
        v
        for (n, key), v in samples.items()
        if n == "awa_maintenance_lag_seconds" and ("awa_maintenance_task", "promote") in key
    ]
    assert len(lags) == 1 and 0.0 <= lags[0] < 10.0, lags
    # The enqueues happened in this test's process: not this worker's to count.
    assert sample(samples, "messaging_client_sent_messages_total", awa_job_kind=SAYS) == []
    assert f"metrics for Prometheus on http://127.0.0.1:{port}/metrics" in proc.output()


@pytest.mark.worker
def test_nothing_of_opentelemetry_is_imported_while_it_is_off(manage_py: Start) -> None:
    code = (
        "import sys\n"
        "from django.core.management import call_command\n"
        "from tests.jobs import observability\n"
        "observability.says.enqueue(1)\n"
        "call_command('awa_worker', '--burst', '--queue', 'obs', verbosity=0)\n"
        "print('loaded:', sorted(m for m in sys.modules if m.startswith(('opentelemetry', "
        "'prometheus_client'))))\n"
    )
    proc = manage_py(
        "shell",
        "-c",
        code,
        extra_env=worker_env(obsjobs),
    )
    assert proc.wait(60) == 0, proc.output()
    assert "loaded: []" in proc.output(), proc.output()


@pytest.mark.storage
def test_a_claim_reports_each_jobs_queue_wait_on_the_database_clock() -> None:
    """``wait_secs`` (the queue-wait histogram's value) runs from when the job was due (its
    ``run_at``, never before its enqueue) to the claim, on the database clock."""
    with pg() as conn:
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "obs-wait"}]))
        [(enqueued_at,)] = conn.execute("SELECT clock_timestamp()").fetchall()
        wait_for(
            lambda: conn.execute(
                "SELECT clock_timestamp() > %s + interval '0.5 seconds'", [enqueued_at]
            ).fetchone()[0],
            message="half a second on the database clock",
        )
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "obs-wait"}]))
        older, fresh = storage.claim(conn, "obs-wait", 2, WORKER)
    assert older.wait_secs is not None and 0.5 <= older.wait_secs < 30
    assert fresh.wait_secs is not None and 0 <= fresh.wait_secs < older.wait_secs
