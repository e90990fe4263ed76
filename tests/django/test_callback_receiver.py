"""The signed callback receiver (docs/callbacks.md): signatures, key rotation, the timestamp window,
replays, status codes and hostile bodies, through Django's test client with CSRF enforced.

Attempts are parked through the engine's own functions (claim, register, finalize); the
receiver is the one under test. A worker subprocess is not needed here (see
tests/worker/test_callback_waits.py for those).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from typing import Any

import pytest
from django.db import connection, connections

from awa_django.callbacks import SIGNATURE_HEADER, TIMESTAMP_HEADER, callback_path, sign_request
from awa_django.db import storage
from tests.support.callbacks import (
    KEY,
    OLD_KEY,
    OTHER_KEY,
    claimed,
    client,
    job_row,
    parked,
    path_of,
    post,
    register,
    scalar,
    status_of,
    wait_item,
)
from tests.support.database import pg
from tests.support.factories import staff
from tests.support.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_awa")]


@pytest.fixture(autouse=True)
def callback_keys(settings: Any) -> None:
    settings.AWA = {**settings.AWA, "CALLBACK_KEYS": [KEY, OLD_KEY]}


def receipts() -> int:
    with pg() as conn:
        return int(scalar(conn, "SELECT count(*) FROM awa.callback_receipts"))


def done_rows(job_id: int) -> int:
    with pg() as conn:
        return int(scalar(conn, "SELECT count(*) FROM awa.done_entries WHERE job_id = %s", job_id))


# Resolution and replays ----------------------------------------------------------------------


def test_a_signed_result_completes_the_waiting_job_once_and_a_replay_gets_the_same_answer() -> None:
    with pg() as conn:
        c, callback = parked(conn)
    body = {"result": {"paid": True, "amount": 12.5}}
    first = post(callback, body)
    assert status_of(first) == (200, "resolved")
    assert "replayed" not in json.loads(first.content)
    with pg() as conn:
        job = job_row(conn, c.job_id)
    assert (job["state"], job["result"]) == ("completed", {"paid": True, "amount": 12.5})
    # The same request again (as a retrying sender would send it): the first answer, no act.
    again = post(callback, body)
    assert status_of(again) == (200, "resolved")
    assert json.loads(again.content)["replayed"] is True
    # The same body, signed again later: still the same resolution.
    later = post(callback, body, timestamp=int(time.time()) + 5)
    assert status_of(later) == (200, "resolved")
    assert done_rows(c.job_id) == 1 and receipts() == 1


def test_a_different_body_for_a_resolved_callback_is_refused_with_409() -> None:
    with pg() as conn:
        c, callback = parked(conn)
    assert status_of(post(callback, {"result": 1})) == (200, "resolved")
    assert status_of(post(callback, {"result": 2})) == (409, "conflict")
    assert status_of(post(callback, {"error": "declined"})) == (409, "conflict")
    assert status_of(post(callback, {"heartbeat": True})) == (409, "stale")
    with pg() as conn:
        assert job_row(conn, c.job_id)["result"] == 1
    assert done_rows(c.job_id) == 1


@pytest.mark.parametrize(
    ("body", "state", "in_dlq"),
    [
        ({"error": "declined"}, "retryable", False),
        ({"error": "declined", "terminal": False}, "retryable", False),
        ({"error": "fraud", "terminal": True}, "failed", True),
    ],
)
def test_an_error_retries_or_fails_the_job(body: dict[str, Any], state: str, in_dlq: bool) -> None:
    with pg() as conn:
        c, callback = parked(conn, max_attempts=3)
    assert status_of(post(callback, body)) == (200, "resolved")
    with pg() as conn:
        job = job_row(conn, c.job_id)
    assert (job["state"], job["in_dlq"]) == (state, in_dlq)
    assert job["errors"][-1]["type"] == "awa_django.CallbackError"
    assert job["errors"][-1]["message"] == body["error"]


def test_a_resolution_before_the_attempt_parks_is_accepted_and_applied_by_the_park() -> None:
    with pg() as conn:
        c = claimed(conn)
        callback = register(conn, c)
    early = post(callback, {"result": "early"})
    assert status_of(early) == (202, "accepted")
    with pg() as conn:
        assert job_row(conn, c.job_id)["state"] == "running"
        assert storage.finalize(conn, [wait_item(c, callback)]) == []
        job = job_row(conn, c.job_id)
    assert (job["state"], job["result"]) == ("completed", "early")
    # A replay keeps its first answer; another body is a conflict.
    assert status_of(post(callback, {"result": "early"})) == (202, "accepted")
    assert status_of(post(callback, {"result": "late"})) == (409, "conflict")


def test_two_concurrent_deliveries_of_one_request_act_once() -> None:
    rounds = 8
    with pg() as conn:
        waits = [parked(conn) for _ in range(rounds)]
    for c, callback in waits:
        body = {"result": {"job": c.job_id}}
        headers = sign_request(
            str(callback), json.dumps(body).encode(), path=path_of(callback), key=KEY
        )
        answers: list[tuple[int, str, bool]] = []

        def deliver(
            callback: uuid.UUID = callback,
            body: dict[str, Any] = body,
            h: dict[str, str] = headers,
            answers: list[tuple[int, str, bool]] = answers,
        ) -> None:
            try:
                response = post(callback, body, headers=h)
                data = json.loads(response.content)
                answers.append((response.status_code, data["status"], bool(data.get("replayed"))))
            finally:
                connections.close_all()

        threads = [threading.Thread(target=deliver) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(answers) == [(200, "resolved", False), (200, "resolved", True)]
        assert done_rows(c.job_id) == 1
    assert receipts() == rounds


def test_two_concurrent_different_resolutions_one_wins_the_other_is_refused() -> None:
    with pg() as conn:
        c, callback = parked(conn)
    answers: list[int] = []

    def deliver(value: int) -> None:
        try:
            answers.append(post(callback, {"result": value}).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver, args=(v,)) for v in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [200, 409]
    assert done_rows(c.job_id) == 1


# Stale, unknown, disabled -------------------------------------------------------------------


def test_a_callback_of_an_attempt_rescued_after_its_timeout_does_nothing() -> None:
    with pg() as conn:
        c, callback = parked(conn, timeout=0.05, max_attempts=5)
        conn.execute("SELECT pg_sleep(0.1)")  # the database clock passes the timeout
        rescued = conn.execute("SELECT job_id FROM awa.rescue_v1(60)").fetchall()
        assert rescued == [(c.job_id,)]
    response = post(callback, {"result": "too late"})
    assert status_of(response) == (409, "stale")
    with pg() as conn:
        job = job_row(conn, c.job_id)
    assert job["state"] == "retryable" and job["errors"][-1]["message"] == "callback timed out"
    assert receipts() == 0


def test_a_callback_of_a_cancelled_job_does_nothing() -> None:
    import awa_django

    with pg() as conn:
        c, callback = parked(conn)
    assert awa_django.cancel(c.job_id) == "waiting_external"
    assert status_of(post(callback, {"result": 1})) == (409, "stale")
    assert status_of(post(callback, {"heartbeat": True})) == (409, "stale")


def test_an_unknown_callback_id_is_404() -> None:
    assert status_of(post(uuid.uuid4(), {"result": 1})) == (404, "unknown")
    # Not a UUID at all, but signed: 404 too (the signature is checked first).
    assert status_of(post("not-a-uuid", {"result": 1})) == (404, "unknown")
    assert status_of(post("../../admin", {"result": 1}, path="/awa/callbacks/x/")) == (
        401,
        "unauthorized",
    )


def test_without_keys_the_receiver_is_off(settings: Any) -> None:
    with pg() as conn:
        c, callback = parked(conn)
    settings.AWA = {**settings.AWA, "CALLBACK_KEYS": []}
    assert status_of(post(callback, {"result": 1})) == (404, "unknown")
    with pg() as conn:
        assert job_row(conn, c.job_id)["state"] == "waiting_external"


# Signatures ---------------------------------------------------------------------------------


def _still_waiting(job_id: int) -> bool:
    with pg() as conn:
        return bool(job_row(conn, job_id)["state"] == "waiting_external")


def test_forged_missing_and_malformed_signatures_are_401() -> None:
    with pg() as conn:
        c, callback = parked(conn)
    body = json.dumps({"result": 1}).encode()
    now = str(int(time.time()))
    good = sign_request(str(callback), body, path=path_of(callback), key=KEY)
    for headers in [
        {},
        {TIMESTAMP_HEADER: now},
        {SIGNATURE_HEADER: good[SIGNATURE_HEADER]},
        {TIMESTAMP_HEADER: now, SIGNATURE_HEADER: "v1=" + "0" * 64},
        {TIMESTAMP_HEADER: now, SIGNATURE_HEADER: "v1=" + os.urandom(32).hex()},
        {TIMESTAMP_HEADER: now, SIGNATURE_HEADER: good[SIGNATURE_HEADER][:-2]},
        {TIMESTAMP_HEADER: now, SIGNATURE_HEADER: "v2=" + "0" * 64},
        {TIMESTAMP_HEADER: now, SIGNATURE_HEADER: "sha256=" + good[SIGNATURE_HEADER][3:]},
        {TIMESTAMP_HEADER: "-1", SIGNATURE_HEADER: good[SIGNATURE_HEADER]},
        {TIMESTAMP_HEADER: "1e9", SIGNATURE_HEADER: good[SIGNATURE_HEADER]},
        {TIMESTAMP_HEADER: "\uff11\uff12\uff13", SIGNATURE_HEADER: good[SIGNATURE_HEADER]},
        {TIMESTAMP_HEADER: now + "0" * 20, SIGNATURE_HEADER: good[SIGNATURE_HEADER]},
        {TIMESTAMP_HEADER: now, SIGNATURE_HEADER: ",".join([good[SIGNATURE_HEADER]] * 9)},
        {TIMESTAMP_HEADER: now, SIGNATURE_HEADER: "x" * 5000},
    ]:
        response = post(callback, body, headers=headers)
        assert status_of(response) == (401, "unauthorized"), headers
    # A valid signature for another timestamp than the one sent.
    forged = {**good, TIMESTAMP_HEADER: str(int(good[TIMESTAMP_HEADER]) + 1)}
    assert status_of(post(callback, body, headers=forged)) == (401, "unauthorized")
    # A tampered body under a valid signature.
    assert status_of(post(callback, b'{"result": 2}', headers=good)) == (401, "unauthorized")
    assert _still_waiting(c.job_id)
    assert status_of(post(callback, body, headers=good)) == (200, "resolved")


def test_a_key_the_receiver_does_not_hold_is_401() -> None:
    with pg() as conn:
        c, callback = parked(conn)
    assert status_of(post(callback, {"result": 1}, key=OTHER_KEY)) == (401, "unauthorized")
    assert status_of(post(callback, {"result": 1}, key=KEY + "x")) == (401, "unauthorized")
    assert _still_waiting(c.job_id)


def test_rotated_keys_every_listed_key_verifies_and_a_removed_one_stops(settings: Any) -> None:
    with pg() as conn:
        (_a, cb_a), (_b, cb_b), (_c, cb_c) = (parked(conn) for _ in range(3))
    assert status_of(post(cb_a, {"result": "old"}, key=OLD_KEY)) == (200, "resolved")
    assert status_of(post(cb_b, {"result": "new"}, key=KEY)) == (200, "resolved")
    settings.AWA = {**settings.AWA, "CALLBACK_KEYS": [KEY]}  # the old key is retired
    assert status_of(post(cb_c, {"result": "old"}, key=OLD_KEY)) == (401, "unauthorized")
    assert status_of(post(cb_c, {"result": "new"}, key=KEY)) == (200, "resolved")
    # The sender signs with the first key by default.
    callback = str(uuid.uuid4())
    assert sign_request(callback, b"{}", path="/x/", timestamp=1) == sign_request(
        callback, b"{}", path="/x/", timestamp=1, key=KEY
    )


@pytest.mark.parametrize("skew", [-301, 301, -(10**6), 10**6])
def test_timestamps_outside_the_window_are_401_and_change_nothing(skew: int) -> None:
    with pg() as conn:
        c, callback = parked(conn)
        db_now = int(scalar(conn, "SELECT extract(epoch FROM now())::bigint"))
    response = post(callback, {"result": 1}, timestamp=db_now + skew)
    assert status_of(response) == (401, "expired")
    assert _still_waiting(c.job_id) and receipts() == 0


@pytest.mark.parametrize("skew", [-290, 290])
def test_timestamps_inside_the_window_are_accepted(skew: int) -> None:
    with pg() as conn:
        _c, callback = parked(conn)
        db_now = int(scalar(conn, "SELECT extract(epoch FROM now())::bigint"))
    assert status_of(post(callback, {"result": 1}, timestamp=db_now + skew)) == (200, "resolved")


def test_the_window_is_a_setting(settings: Any) -> None:
    settings.AWA = {**settings.AWA, "CALLBACK_TIMESTAMP_TOLERANCE": 5}
    with pg() as conn:
        _c, callback = parked(conn)
    assert status_of(post(callback, {"result": 1}, timestamp=int(time.time()) - 60)) == (
        401,
        "expired",
    )


def test_a_signature_for_another_method_or_path_is_refused() -> None:
    with pg() as conn:
        c, callback = parked(conn)
        _, other = parked(conn)
    # Signed for another callback's path, sent to this one (and the reverse).
    assert status_of(post(callback, {"result": 1}, sign_path=path_of(other))) == (
        401,
        "unauthorized",
    )
    # Signed for a path under another prefix.
    assert status_of(post(callback, {"result": 1}, sign_path=f"/x{path_of(callback)}")) == (
        401,
        "unauthorized",
    )
    # Signed for PUT, sent as POST.
    assert status_of(post(callback, {"result": 1}, sign_method="PUT")) == (401, "unauthorized")
    # Other methods are not allowed at all, signed or not.
    for method in ("GET", "PUT", "PATCH", "DELETE"):
        response = post(callback, {"result": 1}, method=method, sign_method=method)
        assert response.status_code == 405 and response["Allow"] == "POST"
    assert _still_waiting(c.job_id)


# Bodies -------------------------------------------------------------------------------------


def test_an_oversized_body_is_413_before_it_is_read(settings: Any) -> None:
    settings.AWA = {**settings.AWA, "CALLBACK_MAX_BYTES": 1000}
    with pg() as conn:
        _c, callback = parked(conn)
    big = json.dumps({"result": "x" * 2000}).encode()
    assert status_of(post(callback, big)) == (413, "too_large")
    # Unsigned too: the size is checked first.
    assert status_of(post(callback, big, headers={})) == (413, "too_large")
    assert status_of(post(callback, json.dumps({"result": "x" * 900}).encode())) == (
        200,
        "resolved",
    )


def test_a_body_over_djangos_upload_limit_is_413(settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    with pg() as conn:
        _, callback = parked(conn)
    assert status_of(post(callback, {"result": "y" * 200})) == (413, "too_large")


def test_an_absurd_content_length_is_413() -> None:
    with pg() as conn:
        _, callback = parked(conn)
    response = client().generic(
        "POST",
        path_of(callback),
        data=b"{}",
        content_type="application/json",
        CONTENT_LENGTH="9" * 5000,
    )
    assert status_of(response) == (413, "too_large")


def test_an_id_in_fullwidth_digits_is_not_a_callback_id() -> None:
    callback = "\uff10" * 32  # int() would read it as 0
    assert status_of(post(callback, {"result": 1}, path=f"/awa/callbacks/{callback}/")) == (
        404,
        "unknown",
    )


def test_a_chunked_body_is_411() -> None:
    with pg() as conn:
        _, callback = parked(conn)
    c = client()
    for extra in [{"HTTP_TRANSFER_ENCODING": "chunked"}, {"CONTENT_LENGTH": "-1"}]:
        response = c.generic(
            "POST", path_of(callback), data=b"{}", content_type="application/json", **extra
        )
        assert status_of(response) == (411, "length_required")


HOSTILE: list[bytes] = [
    b"",
    b"not json",
    b"\xff\xfe\xfa",
    b'{"result": 1',
    b"[1, 2, 3]",
    b'"result"',
    b"null",
    b"{}",
    b'{"result": NaN}',
    b'{"result": Infinity}',
    b'{"result": -Infinity}',
    b'{"result": 1e400}',
    b'{"result": "\\u0000"}',
    b'{"result": {"\\u0000": 1}}',
    b'{"result": "\\ud800"}',
    b'{"result": {"\\udfff": 1}}',
    b'{"result": ' + b"9" * 5000 + b"}",
    b'{"result": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
    b'{"result": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}",
    b'{"result": 1, "error": "x"}',
    b'{"result": 1, "extra": true}',
    b'{"error": 5}',
    b'{"error": null}',
    b'{"error": ["x"]}',
    b'{"error": "bad \\u0000"}',
    b'{"error": "' + b"e" * 10_001 + b'"}',
    b'{"error": "x", "terminal": "yes"}',
    b'{"error": "x", "terminal": 1}',
    b'{"terminal": true}',
    b'{"heartbeat": false}',
    b'{"heartbeat": 1}',
    b'{"heartbeat": true, "timeout": -1}',
    b'{"heartbeat": true, "timeout": 0}',
    b'{"heartbeat": true, "timeout": true}',
    b'{"heartbeat": true, "timeout": "60"}',
    b'{"heartbeat": true, "timeout": 1e300}',
    b'{"heartbeat": true, "timeout": NaN}',
    b'{"heartbeat": true, "result": 1}',
    b'\xef\xbb\xbf{"result": 1}',
]


@pytest.mark.parametrize("body", HOSTILE, ids=lambda b: repr(b[:30]))
def test_hostile_bodies_are_400_and_change_nothing(body: bytes) -> None:
    with pg() as conn:
        c, callback = parked(conn)
    response = post(callback, body)
    assert status_of(response) == (400, "malformed")
    assert json.loads(response.content)["detail"]
    assert _still_waiting(c.job_id) and receipts() == 0


def test_random_bytes_and_headers_never_make_a_500() -> None:
    import random

    rng = random.Random(17)
    with pg() as conn:
        _c, callback = parked(conn)
    pieces = [
        b"{",
        b"}",
        b"[",
        b"]",
        b'"result"',
        b'"error"',
        b'"heartbeat"',
        b":",
        b",",
        b"1",
        b"true",
        b'"\\ud800"',
        b'"\\u0000"',
        b"\xff",
        b"\x00",
        b"null",
        b"-",
        b"e9",
    ]
    for _ in range(300):
        body = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.2:
            body = os.urandom(rng.randint(0, 64))
        response = post(callback, body, timestamp=int(time.time()) + rng.randint(-400, 400))
        assert response.status_code in (200, 400, 401, 409), (body, response.content)
    for header in ["", "v1=", "v1=zz", "\x00", "v1=" + "a" * 64 + ",", "é", " v1=" + "0" * 64]:
        response = post(callback, b"{}", headers={SIGNATURE_HEADER: header, TIMESTAMP_HEADER: "1"})
        assert response.status_code == 401
    for raw_id in [
        "%00",
        "%ff",
        "0" * 300,
        "😀",
        "00000000-0000-0000-0000-00000000000g",
        "\uff11" * 32,
        "{00000000-0000-0000-0000-000000000000}",
    ]:
        response = post(raw_id, {"result": 1}, path=f"/awa/callbacks/{raw_id}/")
        assert response.status_code in (401, 404), raw_id


# Heartbeats ---------------------------------------------------------------------------------


def _timeout_at(job_id: int) -> Any:
    with pg() as conn:
        return scalar(conn, "SELECT timeout_at FROM awa.callback_waits WHERE job_id = %s", job_id)


def test_a_heartbeat_extends_the_wait_and_its_replay_does_not_extend_it_again() -> None:
    with pg() as conn:
        c, callback = parked(conn, timeout=30)
    before = _timeout_at(c.job_id)
    stamp = int(time.time())
    first = post(callback, {"heartbeat": True, "timeout": 3600}, timestamp=stamp)
    assert status_of(first) == (200, "extended")
    after = _timeout_at(c.job_id)
    assert (after - before).total_seconds() > 3000
    assert json.loads(first.content)["timeout_at"]
    # The same heartbeat again: its first answer.
    replay = post(callback, {"heartbeat": True, "timeout": 3600}, timestamp=stamp)
    assert status_of(replay) == (200, "extended") and json.loads(replay.content)["replayed"]
    assert _timeout_at(c.job_id) == after
    # A shorter extension never shortens the wait.
    assert status_of(post(callback, {"heartbeat": True, "timeout": 5}, timestamp=stamp + 1)) == (
        200,
        "extended",
    )
    assert _timeout_at(c.job_id) == after
    # Without a timeout: the wait's own (30 s) from now, which is earlier: nothing moves.
    assert status_of(post(callback, {"heartbeat": True}, timestamp=stamp + 2)) == (200, "extended")
    assert _timeout_at(c.job_id) == after
    assert status_of(post(callback, {"result": "done"})) == (200, "resolved")


def test_a_heartbeat_without_a_timeout_extends_by_the_wait_s_own_timeout() -> None:
    with pg() as conn:
        c, callback = parked(conn, timeout=0.5)
    before = _timeout_at(c.job_id)
    assert status_of(post(callback, {"heartbeat": True})) == (200, "extended")
    after = _timeout_at(c.job_id)
    assert after >= before


def test_a_heartbeat_before_the_park_is_pending() -> None:
    with pg() as conn:
        c = claimed(conn)
        callback = register(conn, c)
    assert status_of(post(callback, {"heartbeat": True})) == (202, "pending")


def test_a_heartbeat_before_the_park_is_kept_for_the_wait() -> None:
    """An early heartbeat's timeout is kept, as an early resolution is: when the attempt parks
    with a shorter timeout of its own, its wait lasts until the heartbeat asked."""
    with pg() as conn:
        c = claimed(conn)
        callback = register(conn, c)
    early = post(callback, {"heartbeat": True, "timeout": 3600})
    assert status_of(early) == (202, "pending")
    kept = json.loads(early.content)["timeout_at"]
    with pg() as conn:
        assert storage.finalize(conn, [wait_item(c, callback, timeout=2)]) == []
    until = _timeout_at(c.job_id)
    assert until.isoformat() == kept
    with pg() as conn:
        row = conn.execute("SELECT %s - now() > interval '3500 s'", [until]).fetchone()
        assert row == (True,)


def test_a_heartbeat_without_a_timeout_before_the_park_leaves_the_wait_its_own_timeout() -> None:
    """An early heartbeat that names no timeout asks for the wait's own: nothing is kept, the
    answer carries no timeout_at, and the wait parks with its own 2 s (not a century)."""
    with pg() as conn:
        c = claimed(conn)
        callback = register(conn, c)
    early = post(callback, {"heartbeat": True})
    assert status_of(early) == (202, "pending")
    assert json.loads(early.content).get("timeout_at") is None
    with pg() as conn:
        assert storage.finalize(conn, [wait_item(c, callback, timeout=2)]) == []
        row = conn.execute(
            "SELECT %s - now() <= interval '2 s'", [_timeout_at(c.job_id)]
        ).fetchone()
        assert row == (True,)


# Surroundings -------------------------------------------------------------------------------


def test_only_the_receiver_is_csrf_exempt() -> None:
    from awa_django.callbacks.views import receive

    assert getattr(receive, "csrf_exempt", False) is True
    from tests.support.processes import REPO

    users = sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "awa_django").rglob("*.py")
        if "csrf_exempt" in path.read_text()
    )
    # And the health view, which never acts (GET and HEAD only: other methods get 405).
    assert users == ["awa_django/callbacks/views.py", "awa_django/views.py"]
    assert client().post("/awa/health/").status_code == 405
    # The admin's actions still need the CSRF token (a browser-less POST is refused).
    user = staff("cancel_job", "resolve_callback").session
    strict = client()
    strict.cookies = staff_cookies(user)
    for model, action in [("livejob", "cancel_jobs"), ("callbackwait", "resolve_jobs")]:
        response = strict.post(
            f"/admin/awa_django/{model}/", {"action": action, "_selected_action": ["1"]}
        )
        assert response.status_code == 403, model


def staff_cookies(session: Any) -> Any:
    from http.cookies import SimpleCookie

    from django.conf import settings

    cookies: SimpleCookie[str] = SimpleCookie()
    cookies[settings.SESSION_COOKIE_NAME] = session.session_key
    return cookies


def test_callback_path_reverses_the_receiver_url() -> None:
    callback = uuid.uuid4()
    assert callback_path(callback) == f"/awa/callbacks/{callback}/"


def test_old_receipts_are_pruned_and_recent_ones_kept() -> None:
    with pg() as conn:
        _, a = parked(conn)
        _, b = parked(conn)
    assert post(a, {"result": 1}).status_code == 200
    assert post(b, {"result": 2}).status_code == 200
    with pg() as conn:
        conn.execute(
            "UPDATE awa.callback_receipts SET received_at = now() - interval '1 hour' "
            "WHERE callback_id = %s",
            [a],
        )
        assert scalar(conn, "SELECT awa.callback_receipts_prune_v1(660)") == 1
        assert scalar(conn, "SELECT count(*) FROM awa.callback_receipts") == 1
    # The pruned receipt's replay is outside any window now; re-signed, the attempt says stale.
    assert status_of(post(a, {"result": 1})) == (409, "stale")


def test_receipts_store_digests_not_bodies() -> None:
    with pg() as conn:
        _, callback = parked(conn)
    body = json.dumps({"result": {"secret": "s3cr3t"}}).encode()
    assert post(callback, body).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT request_digest, outcome FROM awa.callback_receipts")
        [(digest, outcome)] = cursor.fetchall()
    assert bytes(digest) == hashlib.sha256(body).digest() and outcome == "resolved"


def test_the_maintenance_leader_prunes_old_receipts(manage_py: Any) -> None:
    with pg() as conn:
        _, old = parked(conn)
        _, recent = parked(conn)
    assert post(old, {"result": 1}).status_code == 200
    assert post(recent, {"result": 2}).status_code == 200
    with pg() as conn:
        # Older than twice the default window plus a minute (660 s).
        conn.execute(
            "UPDATE awa.callback_receipts SET received_at = now() - interval '661 seconds' "
            "WHERE callback_id = %s",
            [old],
        )
    proc = manage_py("awa_maintenance", "--once")
    wait_for(lambda: proc.proc.poll() is not None, timeout=30, message="awa_maintenance --once")
    assert proc.proc.returncode == 0, proc.output()
    with pg() as conn:
        kept = conn.execute("SELECT callback_id FROM awa.callback_receipts").fetchall()
    assert kept == [(recent,)]


def test_the_receiver_commits_on_its_own_under_atomic_requests(settings: Any) -> None:
    from awa_django.callbacks.views import receive

    assert "default" in receive._non_atomic_requests  # type: ignore[attr-defined]
    settings.DATABASES["default"]["ATOMIC_REQUESTS"] = True
    try:
        with pg() as conn:
            c, callback = parked(conn)
        assert status_of(post(callback, {"result": "atomic"})) == (200, "resolved")
        with pg() as conn:
            assert job_row(conn, c.job_id)["result"] == "atomic"
    finally:
        settings.DATABASES["default"]["ATOMIC_REQUESTS"] = False


# Settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("a-single-string-key-of-more-than-32-chars", "must be a list of secret keys"),
        (["short-secret"], r"CALLBACK_KEYS'\]\[0\] is 12 characters long"),
        ([KEY, b"x" * 40], r"\[1\] must be a str, got bytes"),
        ([KEY, KEY], "the same key twice"),
        (["\x00" * 40], "printable"),
    ],
)
def test_bad_keys_are_refused_without_showing_them(keys: Any, message: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from awa_django.conf import load_settings

    with pytest.raises(ImproperlyConfigured, match=message) as refused:
        load_settings({"CALLBACK_KEYS": keys})
    assert "short-secret" not in str(refused.value) and KEY not in str(refused.value)


def test_the_settings_repr_never_shows_the_keys() -> None:
    from awa_django.conf import load_settings

    loaded = load_settings({"CALLBACK_KEYS": [KEY, OLD_KEY]})
    assert loaded.CALLBACK_KEYS == (KEY, OLD_KEY)
    assert KEY not in repr(loaded) and "CALLBACK_KEYS=<2 secret(s)>" in repr(loaded)
