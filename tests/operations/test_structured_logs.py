"""Structured logs (docs/observability.md, "Structured logs"): every record about a job carries
job_id, kind, queue, attempt and run_lease; a handler's own records get them through
JobFieldsFilter; JsonFormatter writes one JSON object per line."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.links import Link
from awa_django.db.storage import ClaimedJob, Finalization
from awa_django.maintenance.leader import Maintenance, MaintenanceSettings
from awa_django.telemetry.logs import (
    JOB_FIELDS,
    JobFieldsFilter,
    JsonFormatter,
    current_job_fields,
    set_current_job,
)
from awa_django.worker.batcher import CompletionBatcher
from tests.jobs import observability as obsjobs
from tests.jobs import worker_env
from tests.support.database import conninfo, pg
from tests.support.factories import WORKER, enqueue_sql
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

Start = Callable[..., ManagedProcess]


def claimed(job_id: int = 7, **values: Any) -> ClaimedJob:
    fields: dict[str, Any] = {
        "job_id": job_id,
        "run_lease": 3,
        "attempt": 2,
        "max_attempts": 5,
        "claim_slot": 0,
        "kind": "k.ind",
        "args_json": "[]",
        "queue": "q",
        "priority": 0,
        "deadline_at": None,
        "timeout_secs": None,
        "progress": None,
        **values,
    }
    return ClaimedJob(**fields)


def record(message: str = "hello %s", *args: Any, **extra: Any) -> logging.LogRecord:
    logger = logging.getLogger("tests.obs.unit")
    return logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, message, args or ("there",), None, extra=extra
    )


def test_json_formatter_writes_the_job_fields_and_any_extra() -> None:
    formatter = JsonFormatter(fields=["process"])
    line = formatter.format(
        record(job_id=1, kind="k", queue="q", attempt=2, run_lease=3, other={"x": 1}, odd=object())
    )
    assert "\n" not in line
    data = json.loads(line)
    assert list(data)[:9] == [
        "time",
        "level",
        "logger",
        "message",
        *JOB_FIELDS,
    ]
    assert data["message"] == "hello there"
    assert (data["level"], data["logger"]) == ("WARNING", "tests.obs.unit")
    assert data["time"].endswith("+00:00")
    assert [data[f] for f in JOB_FIELDS] == [1, "k", "q", 2, 3]
    assert data["other"] == {"x": 1}
    assert data["odd"].startswith("<object object")  # what JSON cannot hold: its repr
    assert isinstance(data["process"], int)


def test_json_formatter_keeps_exceptions_on_one_line() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        import sys

        rec = record()
        rec.exc_info = sys.exc_info()
    data = json.loads(JsonFormatter().format(rec))
    assert "ValueError: boom" in data["exception"]
    assert "job_id" not in data  # a record about no job has no job fields


def test_the_filter_adds_the_running_jobs_fields_in_its_own_context_only() -> None:
    filt = JobFieldsFilter()
    outside = record()
    assert filt.filter(outside)
    assert "job_id" not in outside.__dict__

    async def handler(job: ClaimedJob) -> dict[str, Any]:
        set_current_job(job)
        await asyncio.sleep(0)
        inside = record(kind="kept")
        assert filt.filter(inside)
        return {f: getattr(inside, f) for f in JOB_FIELDS}

    async def two() -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(
                asyncio.create_task(handler(claimed(1))), asyncio.create_task(handler(claimed(2)))
            )
        )

    first, second = asyncio.run(two())
    assert first == {"job_id": 1, "kind": "kept", "queue": "q", "attempt": 2, "run_lease": 3}
    assert second["job_id"] == 2
    assert current_job_fields() is None  # the tasks' contexts were their own


def finished(*ids: int) -> bool:
    with pg() as conn:
        rows = conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND finalized_at IS NOT NULL",
            [list(ids)],
        ).fetchone()
    return rows is not None and rows[0] == len(ids)


def json_records(output: str) -> list[dict[str, Any]]:
    records = []
    for line in output.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


@pytest.mark.worker
@pytest.mark.usefixtures("clean_awa")
def test_every_worker_record_about_a_job_carries_its_fields(manage_py: Start) -> None:
    ok = obsjobs.says.enqueue(1)
    ok_async = obsjobs.says_async.enqueue(2)
    bad = obsjobs.fails.enqueue(3)
    proc = manage_py(
        "awa_worker",
        "--queue",
        "obs",
        "--verbosity",
        "2",
        extra_env={
            "DJANGO_SETTINGS_MODULE": "tests.settings_jsonlog",
            **worker_env(obsjobs),
        },
    )
    wait_for(
        lambda: finished(ok.id, ok_async.id, bad.id),
        timeout=30,
        message=lambda: f"the jobs to end; output:\n{proc.output()}",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    records = json_records(proc.output())
    about: dict[int, list[dict[str, Any]]] = {}
    for rec in records:
        if rec.get("job_id") is not None:
            about.setdefault(rec["job_id"], []).append(rec)
    kinds = {
        ok.id: obsjobs.says.kind,
        ok_async.id: obsjobs.says_async.kind,
        bad.id: obsjobs.fails.kind,
    }
    for job_id, kind in kinds.items():
        assert about.get(job_id), f"no record about job {job_id}:\n{proc.output()}"
        for rec in about[job_id]:
            assert (rec["kind"], rec["queue"]) == (kind, "obs"), rec
            assert rec["attempt"] >= 1 and rec["run_lease"] >= 1, rec
    messages = {(r["attempt"], r["level"], r["message"]) for r in about[bad.id]}
    assert any(
        (a, lvl) == (1, "INFO")
        and re.search(
            r" failed \(attempt 1 of 2, ran [0-9.]+ ms\), "
            r"retrying (in [0-9.]+ (ms|s)|now): ",
            m,
        )
        for a, lvl, m in messages
    ), messages
    assert any(
        (a, lvl) == (2, "WARNING")
        and re.search(r" moved to the DLQ after 2 attempts \(the last ran [0-9.]+ ms\): ", m)
        for a, lvl, m in messages
    ), messages
    # The handlers' own records, through JobFieldsFilter.
    said = [r for r in records if r["logger"] == "tests.obs"]
    assert {(r["message"], r["job_id"], r["kind"]) for r in said} == {
        ("sync handler says 1", ok.id, obsjobs.says.kind),
        ("async handler says 2", ok_async.id, obsjobs.says_async.kind),
    }
    # Every record is JSON, and none about a job lacks its fields.
    for rec in records:
        if "job" in rec["message"] and rec["message"].startswith("job "):
            assert rec.get("job_id") is not None, rec


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_a_rescue_record_carries_the_rescued_jobs_fields(caplog: pytest.LogCaptureFixture) -> None:
    with pg() as conn:
        [(job_id, _)] = enqueue_sql(conn, json.dumps([{"kind": "k.resc", "queue": "resc"}]))
        [c] = storage.claim(conn, "resc", 1, WORKER)
        conn.execute("UPDATE awa.claims SET claimed_at = now() - interval '2 hours'")

    async def rescue() -> None:
        maintenance = Maintenance(MaintenanceSettings.from_settings(), uuid.uuid4())
        async with await psycopg.AsyncConnection.connect(conninfo(), autocommit=True) as conn:
            await maintenance._rescue(conn)

    with caplog.at_level(logging.WARNING, "awa_django.maintenance"):
        asyncio.run(rescue())
    [rec] = [r for r in caplog.records if "rescued job" in r.getMessage()]
    assert {f: getattr(rec, f) for f in JOB_FIELDS} == {
        "job_id": job_id,
        "kind": "k.resc",
        "queue": "resc",
        "attempt": 1,
        "run_lease": c.run_lease,
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_a_stale_finalization_record_carries_the_jobs_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pg() as conn:
        enqueue_sql(conn, json.dumps([{"kind": "k.stale", "queue": "stale"}]))
        [c] = storage.claim(conn, "stale", 1, WORKER)
        conn.execute("SELECT awa.cancel_v1(%s, 'gone')", [c.job_id])

    async def write() -> None:
        link = Link("default", "finalize", "test")
        batcher = CompletionBatcher(link, batch_size=8, flush_interval=0.001)
        task = asyncio.create_task(batcher.run())
        batcher.add(Finalization(c.job_id, c.run_lease, c.claim_slot, "completed"), c)
        await batcher.drain()
        batcher.close()
        await task
        await link.close()

    with caplog.at_level(logging.WARNING, "awa_django.worker"):
        asyncio.run(write())
    [rec] = [r for r in caplog.records if "stale finalization" in r.getMessage()]
    assert {f: getattr(rec, f) for f in JOB_FIELDS} == {
        "job_id": c.job_id,
        "kind": "k.stale",
        "queue": "stale",
        "attempt": 1,
        "run_lease": c.run_lease,
    }
