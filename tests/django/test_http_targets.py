"""HTTP worker targets (awa_django.http_targets): jobs POSTed, signed, to a real local HTTP
server, one route per kind of answer (hostile ones included), run in-process by drain() as a
worker runs them."""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from awa_django.callbacks.signing import message, signature
from awa_django.exceptions import InvalidOptionError
from awa_django.http_targets import http_target
from awa_django.testing import drain, enqueued_jobs
from tests.support.callbacks import KEY, post

pytestmark = pytest.mark.django_db

OWN_KEY = "own-" + "o" * 40
LIMIT = 1000  # RESULT_MAX_BYTES in these tests

#: What the server received, by path: (headers, body).
RECEIVED: dict[str, list[tuple[dict[str, str], dict[str, Any]]]] = {}


class Target(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: connections are pooled and reused

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        document = json.loads(body)
        route, _, query = self.path.partition("?")
        RECEIVED.setdefault(route, []).append((dict(self.headers), document))
        key = OWN_KEY if route == "/own" else KEY
        signed = message(
            "POST", unquote(route), str(document["id"]), self.headers["X-Awa-Timestamp"], body
        )
        if not hmac.compare_digest(signature(key, signed), self.headers["X-Awa-Signature"]):
            return self.answer(401, b"bad signature")
        ROUTES.get(unquote(route), lambda h, d, q: h.answer(404, b"no route"))(
            self, document, query
        )

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def raw(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()


def trickle(h: Target, d: Any, q: str) -> None:
    h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n")
    for byte in b'"slowly"':
        time.sleep(0.2)  # each read returns before the read timeout: only the deadline ends it
        h.raw(bytes([byte]))


def oversized(h: Target, d: Any, q: str) -> None:
    # More than RESULT_MAX_BYTES, then, late, what would answer the next request on the
    # connection if it were reused.
    forged = b'HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"forged!"'
    h.raw(f"HTTP/1.1 200 OK\r\nContent-Length: {LIMIT + 1 + len(forged)}\r\n\r\n".encode())
    h.raw(b"x" * (LIMIT + 1))
    time.sleep(0.3)
    h.raw(forged)


ROUTES: dict[str, Callable[[Target, Any, str], None]] = {
    "/ok": lambda h, d, q: h.answer(200, json.dumps({"shipped": d["args"]}).encode()),
    "/own": lambda h, d, q: h.answer(200, b'"own key"'),
    "/caf\u00e9": lambda h, d, q: h.answer(200, b'"decoded path"'),
    "/text": lambda h, d, q: h.answer(200, b"plain text"),
    "/nan": lambda h, d, q: h.answer(200, b'{"x": NaN}'),
    "/deep": lambda h, d, q: h.answer(200, b"[" * 5000 + b"]" * 5000),
    "/slow": lambda h, d, q: (time.sleep(1.5), h.answer(200, b"{}")),
    "/trickle": trickle,
    "/big": oversized,
    "/busy": lambda h, d, q: h.answer(503, b"", {"Retry-After": "7"}),
    "/odd-after": lambda h, d, q: h.answer(503, b"", {"Retry-After": "\u00b2"}),
    "/down": lambda h, d, q: h.answer(502, b"bad gateway"),
    "/gone": lambda h, d, q: h.answer(404, b"<no such order>"),
    "/hints": lambda h, d, q: (
        h.raw(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"),
        h.answer(200, b'"after hints"'),
    ),
    "/later": lambda h, d, q: h.answer(202, b"", {"X-Awa-Callback-Timeout": "120"}),
    "/soon": lambda h, d, q: h.answer(202, b"", {"X-Awa-Callback-Timeout": "1e-9"}),
    "/moved": lambda h, d, q: (
        h.answer(200, b'"after the hop"')
        if q == "hopped"
        else h.answer(307, b"", {"Location": "/moved?hopped"})
    ),
    "/elsewhere": lambda h, d, q: h.answer(307, b"", {"Location": "/ok"}),
    "/away": lambda h, d, q: h.answer(307, b"", {"Location": "http://127.0.0.2:9/steal"}),
    "/broken-location": lambda h, d, q: h.answer(307, b"", {"Location": "http://[::1"}),
    "/see-other": lambda h, d, q: h.answer(303, b"", {"Location": "/ok"}),
    "/loop": lambda h, d, q: h.answer(307, b"", {"Location": "/loop"}),
}


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def callback_keys(settings: Any) -> None:
    settings.AWA = {**settings.AWA, "CALLBACK_KEYS": [KEY], "RESULT_MAX_BYTES": LIMIT}
    RECEIVED.clear()


def run(base: str, route: str, *args: Any, **options: Any) -> Any:
    name = route.strip("/").replace("%", "").lower() or "root"
    queue = f"http-{name}"  # one queue per route: a retry due later runs alone
    target = http_target(f"tests.http.{name}", url=base + route, queue=queue, **options)
    job = target.enqueue(*args)
    [attempt] = drain(queue)
    assert attempt.id == job.id
    return attempt


def delay_of(job_id: int) -> float:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM run_at - now()) FROM awa.jobs WHERE id = %s", [job_id]
        )
        row = cursor.fetchone()
    assert row is not None
    return float(row[0])


def test_a_2xx_completes_with_the_body_and_the_request_is_signed(base: str) -> None:
    done = run(base, "/ok", 7, "x")
    assert (done.outcome, done.result) == ("completed", {"shipped": [7, "x"]})
    [(headers, body)] = RECEIVED["/ok"]
    assert body["kind"] == "tests.http.ok" and body["attempt"] == 1
    assert body["callback_path"] == f"/awa/callbacks/{body['callback_id']}/"
    assert headers["Content-Type"] == "application/json"
    assert run(base, "/text").result == "plain text"
    assert run(base, "/caf%C3%A9").result == "decoded path"  # signed as request.path reads it
    assert run(base, "/own", signing_key=OWN_KEY).result == "own key"


def test_bodies_that_cannot_be_stored_complete_with_a_summary_once(base: str) -> None:
    nan = run(base, "/nan")  # not JSON: its text
    assert (nan.outcome, nan.result) == ("completed", '{"x": NaN}')
    deep = run(base, "/deep")  # too deep to parse, too long to keep as text
    assert (deep.outcome, deep.result["stored"], deep.result["body_bytes"]) == (
        "completed",
        False,
        10_000,
    )
    assert len(RECEIVED["/deep"]) == 1  # the target acted once: never posted again
    big = run(base, "/big")
    assert (big.outcome, big.result["stored"]) == ("completed", False)
    # The oversized answer's connection was closed, not reused: the next job reads its own.
    assert run(base, "/ok", 1).result == {"shipped": [1]}


def test_server_errors_and_timeouts_retry_and_client_errors_fail(base: str) -> None:
    busy = run(base, "/busy")
    assert busy.outcome == "retry" and 6 < delay_of(busy.id) <= 7.5  # the Retry-After
    odd = run(base, "/odd-after")
    assert odd.outcome == "retry" and "HTTP 503" in odd.error["message"]
    down = run(base, "/down")
    assert down.outcome == "retry" and "HTTP 502" in down.error["message"]
    started = time.monotonic()
    slow = run(base, "/slow", deadline=0.3)
    trickled = run(base, "/trickle", deadline=0.5)
    assert time.monotonic() - started < 1.5  # each cut at its deadline, not at its answer's end
    for cut in (slow, trickled):
        assert cut.outcome == "retry" and "past the attempt's deadline" in cut.error["message"]
    hints = run(base, "/hints")
    assert hints.outcome == "retry" and "HTTP 103" in hints.error["message"]
    gone = run(base, "/gone")
    assert gone.outcome == "fail" and "HTTP 404" in gone.error["message"]
    assert "<no such order>" in gone.error["message"]


def test_redirects_stay_in_the_origin_and_are_signed_again(base: str) -> None:
    moved = run(base, "/moved")
    assert (moved.outcome, moved.result) == ("completed", "after the hop")
    elsewhere = run(base, "/elsewhere", 3)  # another path, same origin: signed for it
    assert (elsewhere.outcome, elsewhere.result) == ("completed", {"shipped": [3]})
    for route, words in (
        ("/away", "another origin"),
        ("/broken-location", "unreadable URL"),
        ("/see-other", "HTTP 303"),
        ("/loop", "more than 3 redirects"),
    ):
        refused = run(base, route)
        assert refused.outcome == "fail" and words in refused.error["message"], route


def test_a_202_waits_for_the_callback_the_target_resolves(base: str) -> None:
    parked = run(base, "/later", 3, callback_timeout=300)
    assert parked.outcome == "wait"
    [(_, body)] = RECEIVED["/later"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM timeout_at - now()) FROM awa.callback_waits"
            " WHERE job_id = %s",
            [parked.id],
        )
        row = cursor.fetchone()
    assert row is not None and 100 < float(row[0]) <= 121  # the answer's shorter timeout
    answer = post(body["callback_id"], {"result": {"rendered": True}})
    assert answer.status_code == 200, answer.content
    with connection.cursor() as cursor:
        cursor.execute("SELECT state FROM awa.jobs WHERE id = %s", [parked.id])
        assert cursor.fetchone() == ("completed",)
    soon = run(base, "/soon")  # a wait of no time at all is held to a second
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM timeout_at - now()) FROM awa.callback_waits"
            " WHERE job_id = %s",
            [soon.id],
        )
        row = cursor.fetchone()
    assert row is not None and float(row[0]) > 0.5


def test_without_a_key_the_job_fails_and_bad_declarations_are_refused(
    base: str, settings: Any
) -> None:
    settings.AWA = {**settings.AWA, "CALLBACK_KEYS": []}
    unsigned = run(base, "/ok")
    assert unsigned.outcome == "fail" and "CALLBACK_KEYS" in unsigned.error["message"]
    assert "/ok" not in RECEIVED
    for url in (
        "ftp://x",
        "javascript:alert(1)",
        "http://",
        "x" * 2001,
        5,
        "http://127.0.0.1:99999/x",
        "http://:8080/x",
        "http://admin:hunter2@127.0.0.1/x",
        "http://b\u00fccher.example/x",
    ):
        with pytest.raises(InvalidOptionError):
            http_target("tests.http.bad", url=url)  # type: ignore[arg-type]
    for options in (
        {"callback_timeout": timedelta(0)},
        {"deadline": 0},
        {"max_attempts": 0},
        {"signing_key": "short"},
    ):
        with pytest.raises(InvalidOptionError):
            http_target("tests.http.bad", url=base, **options)
    for name in ("", "a\x00b", "x" * 300):
        with pytest.raises(InvalidOptionError):
            http_target(name, url=base)
    http_target("tests.http.twice", url=base + "/a")
    http_target("tests.http.twice", url=base + "/a")  # the same again: a module re-imported
    with pytest.raises(ImproperlyConfigured, match="another URL"):
        http_target("tests.http.twice", url=base + "/b")
    assert enqueued_jobs() == []
