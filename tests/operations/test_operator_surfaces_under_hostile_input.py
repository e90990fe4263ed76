"""Operator surfaces of docs/observability.md under hostile input: the JSON log formatter writes
one valid line whatever a record holds; retries from history racing each other make one live
copy; an invalid queue name in AWA["QUEUES"] is refused before anything is written and by the
system check; the admin's tag filter and DLQ action never answer 500 to hostile values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from tests.jobs import observability, worker_env
from tests.support.observability_probes import (
    BAD_QUEUES,
    HOSTILE_TEXT,
    BadRepr,
    circular,
    deep,
    job_state,
    record,
    strict_json,
)
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.usefixtures("clean_awa")


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(
            record("a lone surrogate \udcff (os.listdir of a latin-1 name)"),
            id="surrogate-message",
        ),
        pytest.param(record("m", path="/tmp/\udce9t\udce9"), id="surrogate-extra"),
        pytest.param(record("m", ratio=float("nan"), top=float("inf")), id="nan-inf"),
        pytest.param(record("m", payload=circular()), id="circular"),
        pytest.param(record("m", payload={(1, 2): "tuple key"}), id="non-str-key"),
        pytest.param(record("m", payload=deep()), id="deep-nesting"),
        pytest.param(record("m", thing=BadRepr()), id="repr-raises"),
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
    parsed = strict_json(line)
    assert parsed["logger"] == "tests.atk"


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
