"""HTTP worker targets (awa_django.http_targets): jobs POSTed, signed, to a real local HTTP
server, one route per kind of answer, run in-process by drain() as a worker runs them."""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection

from awa_django.callbacks.signing import message, signature
from awa_django.exceptions import InvalidOptionError
from awa_django.http_targets import http_target
from awa_django.testing import drain, enqueued_jobs
from tests.support.callbacks import KEY, post

pytestmark = pytest.mark.django_db

#: What the server received, by path: (headers, body).
RECEIVED: dict[str, list[tuple[dict[str, str], dict[str, Any]]]] = {}


class Target(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        document = json.loads(body)
        RECEIVED.setdefault(self.path, []).append((dict(self.headers), document))
        route, _, query = self.path.partition("?")
        signed = message("POST", route, str(document["id"]), self.headers["X-Awa-Timestamp"], body)
        if not hmac.compare_digest(signature(KEY, signed), self.headers["X-Awa-Signature"]):
            return self.answer(401, b"bad signature")
        if route == "/ok" or query == "hopped":
            self.answer(200, json.dumps({"shipped": document["args"]}).encode())
        elif route == "/text":
            self.answer(200, b"plain text")
        elif route == "/slow":
            time.sleep(1.5)
            self.answer(200, b"{}")
        elif route == "/busy":
            self.answer(503, b"", {"Retry-After": "7"})
        elif route == "/down":
            self.answer(502, b"bad gateway")
        elif route == "/gone":
            self.answer(404, b"<no such order>")
        elif route == "/later":
            self.answer(202, b"", {"X-Awa-Callback-Timeout": "120"})
        elif route == "/moved":  # to the same path (signed as it is), as http to https would
            self.answer(307, b"", {"Location": "/moved?hopped"})
        elif route == "/elsewhere":  # another path: the signature no longer matches
            self.answer(307, b"", {"Location": "/ok"})
        elif route == "/loop":
            self.answer(302, b"", {"Location": "/loop"})

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def callback_keys(settings: Any) -> None:
    settings.AWA = {**settings.AWA, "CALLBACK_KEYS": [KEY]}
    RECEIVED.clear()


def run(base: str, route: str, *args: Any, **options: Any) -> Any:
    queue = f"http-{route.strip('/')}"  # one queue per route: a retry due later runs alone
    target = http_target(
        f"tests.http{route.replace('/', '.')}", url=base + route, queue=queue, **options
    )
    job = target.enqueue(*args)
    [attempt] = drain(queue)
    assert attempt.id == job.id
    return attempt


def state(job_id: int) -> tuple[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT state, run_at FROM awa.jobs WHERE id = %s", [job_id])
        row = cursor.fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_2xx_completes_with_the_body_and_the_request_is_signed(base: str) -> None:
    done = run(base, "/ok", 7, "x")
    assert (done.outcome, done.result) == ("completed", {"shipped": [7, "x"]})
    [(headers, body)] = RECEIVED["/ok"]
    assert body["kind"] == "tests.http.ok" and body["attempt"] == 1
    assert body["callback_path"] == f"/awa/callbacks/{body['callback_id']}/"
    assert headers["Content-Type"] == "application/json"
    assert run(base, "/text").result == "plain text"
    moved = run(base, "/moved", 1)  # followed, the body sent again, still signed
    assert (moved.outcome, moved.result) == ("completed", {"shipped": [1]})
    elsewhere = run(base, "/elsewhere")
    assert elsewhere.outcome == "fail" and "HTTP 401" in elsewhere.error["message"]


def test_server_errors_and_timeouts_retry_and_client_errors_fail(base: str) -> None:
    busy = run(base, "/busy")
    assert busy.outcome == "retry"
    _, run_at = state(busy.id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM %s - now())", [run_at])
        row = cursor.fetchone()
    assert row is not None and 6 < float(row[0]) <= 7.5  # the Retry-After
    down = run(base, "/down")
    assert down.outcome == "retry" and "HTTP 502" in down.error["message"]
    slow = run(base, "/slow", deadline=0.3)
    assert slow.outcome == "retry" and "failed after" in slow.error["message"]
    gone = run(base, "/gone")
    assert gone.outcome == "fail" and "HTTP 404" in gone.error["message"]
    assert "<no such order>" in gone.error["message"]
    looped = run(base, "/loop")
    assert looped.outcome == "fail" and "HTTP 302" in looped.error["message"]


def test_a_202_waits_for_the_callback_the_target_resolves(base: str) -> None:
    parked = run(base, "/later", 3)
    assert parked.outcome == "wait"
    [(_, body)] = RECEIVED["/later"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM timeout_at - now()) FROM awa.callback_waits"
            " WHERE job_id = %s",
            [parked.id],
        )
        row = cursor.fetchone()
    assert row is not None and 100 < float(row[0]) <= 121  # the answer's timeout
    answer = post(body["callback_id"], {"result": {"rendered": True}})
    assert answer.status_code == 200, answer.content
    assert state(parked.id)[0] == "completed"


def test_without_keys_the_job_fails_and_a_bad_url_is_refused(base: str, settings: Any) -> None:
    settings.AWA = {**settings.AWA, "CALLBACK_KEYS": []}
    unsigned = run(base, "/ok")
    assert unsigned.outcome == "fail" and "CALLBACK_KEYS" in unsigned.error["message"]
    assert "/ok" not in RECEIVED
    for url in ("ftp://x", "javascript:alert(1)", "http://", "x" * 2001, 5):
        with pytest.raises(InvalidOptionError):
            http_target("tests.http.bad", url=url)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError):
        http_target("tests.http.bad", url=base, callback_timeout=timedelta(0))
    assert enqueued_jobs() == []
