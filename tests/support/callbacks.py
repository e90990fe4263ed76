"""Helpers for the callback tests: keys, signed requests to the receiver, and attempts that
registered a callback (parked or not) built through the engine's own functions."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg
from django.http import HttpResponse
from django.test import Client

from awa_django.callbacks import sign_request
from awa_django.db import storage
from awa_django.db.storage import ClaimedJob, Finalization
from tests.support.factories import WORKER, enqueue_sql

__all__ = [
    "KEY",
    "OLD_KEY",
    "OTHER_KEY",
    "claimed",
    "client",
    "job_row",
    "parked",
    "path_of",
    "post",
    "register",
    "scalar",
    "status_of",
    "wait_item",
]

KEY = "k1-" + "a" * 40
OLD_KEY = "k0-" + "b" * 40
OTHER_KEY = "kx-" + "c" * 40


def path_of(callback_id: uuid.UUID | str) -> str:
    return f"/awa/callbacks/{callback_id}/"


def client() -> Client:
    """A test client that enforces CSRF, as a browser-less caller would meet it."""
    return Client(enforce_csrf_checks=True)


def post(
    callback_id: uuid.UUID | str,
    body: bytes | str | dict[str, Any],
    *,
    key: str = KEY,
    timestamp: int | None = None,
    path: str | None = None,
    sign_path: str | None = None,
    method: str = "POST",
    sign_method: str = "POST",
    headers: dict[str, str] | None = None,
    via: Client | None = None,
) -> HttpResponse:
    """Send a signed request to the receiver (``headers`` replaces the signature headers)."""
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    raw = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    target = path or path_of(callback_id)
    if headers is None:
        headers = sign_request(
            str(callback_id),
            raw,
            path=sign_path or target,
            method=sign_method,
            key=key,
            timestamp=int(time.time()) if timestamp is None else timestamp,
        )
    c = via or client()
    response: HttpResponse = c.generic(
        method, target, data=raw, content_type="application/json", headers=headers
    )
    return response


def status_of(response: HttpResponse) -> tuple[int, str]:
    return response.status_code, json.loads(response.content)["status"]


def claimed(conn: psycopg.Connection[Any], queue: str = "cb-test", **extra: Any) -> ClaimedJob:
    enqueue_sql(conn, json.dumps([{"kind": "k", "queue": queue, **extra}]))
    [c] = storage.claim(conn, queue, 1, WORKER)
    return c


def register(conn: psycopg.Connection[Any], c: ClaimedJob) -> uuid.UUID:
    callback = uuid.uuid4()
    row = conn.execute(
        "SELECT awa.callback_register_v1(%s, %s, %s)", [c.job_id, c.run_lease, callback]
    ).fetchone()
    assert row == (True,)
    return callback


def wait_item(
    c: ClaimedJob,
    callback: uuid.UUID,
    *,
    timeout: float = 60,
    resume: bool = False,
    progress: dict[str, Any] | None = None,
) -> Finalization:
    return Finalization(
        c.job_id,
        c.run_lease,
        c.claim_slot,
        "wait",
        callback_id=callback,
        timeout=timeout,
        has_state=True,
        resume=resume,
        progress_json=None if progress is None else json.dumps(progress),
    )


def parked(
    conn: psycopg.Connection[Any],
    *,
    timeout: float = 60,
    resume: bool = False,
    progress: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[ClaimedJob, uuid.UUID]:
    """A job whose attempt registered a callback and parked (waiting_external)."""
    c = claimed(conn, **extra)
    callback = register(conn, c)
    item = wait_item(c, callback, timeout=timeout, resume=resume, progress=progress)
    assert storage.finalize(conn, [item]) == []
    return c, callback


def job_row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM awa.jobs WHERE id = %s", [job_id])
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return {d.name: v for d, v in zip(cur.description, row, strict=True)}


def scalar(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql, list(params)).fetchone()
    return None if row is None else row[0]
