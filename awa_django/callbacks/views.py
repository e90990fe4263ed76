"""The callback receiver: ``POST <prefix>/callbacks/<callback_id>/`` (``awa_django.urls``).

The one view of awa_django that is exempt from CSRF, by design: its callers are other systems,
which authenticate each request with a signature instead (awa_django.callbacks.signing).
Nothing else is exempt.

Checks, in this order, before anything is read from the database:

============================================================  ======
no ``AWA["CALLBACK_KEYS"]``: the receiver is off              404
a method other than POST                                      405
a chunked body (no ``Content-Length``), or a malformed one     411
a body over ``AWA["CALLBACK_MAX_BYTES"]`` (not read)          413
a missing or malformed timestamp or signature header          401
a signature that matches no key (for this method, path, id,   401
timestamp and body)
a callback id that is not a UUID                              404
a body that is not one of the three JSON shapes               400
============================================================  ======

then the database (``awa.callback_receive_v1``, one transaction):

============================================================  ======
resolved now / kept for an attempt that has not parked yet    200 / 202
wait extended / attempt not parked yet                        200 / 202
the same request again: its first answer, nothing done again  same
a timestamp outside ``CALLBACK_TIMESTAMP_TOLERANCE`` of the   401
database clock
resolved before by another request, or the attempt closed     409
(rescued, cancelled, resolved otherwise)
no attempt holds the callback id                              404
the database is unreachable                                   503
============================================================  ======

Every answer is a small JSON object with a ``status``; none holds a job's data. Keys and
signatures are never logged.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, DataError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from awa_django.callbacks import receiver
from awa_django.callbacks.signing import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    message,
    parse_signatures,
    parse_timestamp,
    signature_matches,
)
from awa_django.conf import get_awa_settings

__all__ = ["receive"]

log = logging.getLogger("awa_django.callbacks")

#: Outcomes of awa.callback_receive_v1 and the HTTP status each one gets.
STATUS = {
    "resolved": 200,
    "accepted": 202,
    "extended": 200,
    "pending": 202,
    "conflict": 409,
    "stale": 409,
    "unknown": 404,
    "expired": 401,
}

_UUID = re.compile(r"[0-9a-fA-F]{8}-?(?:[0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}")

_DETAIL = {
    "accepted": "the attempt has not parked yet; the resolution is kept and applied when it does",
    "pending": "the attempt has not parked yet; the extension is kept: its wait will last at "
    "least until timeout_at",
    "conflict": "this callback was resolved by another request",
    "stale": "the attempt is no longer waiting (resolved, timed out and rescued, or cancelled)",
    "unknown": "no job is waiting for this callback",
    "expired": "the timestamp is outside the accepted window",
}


def _reply(code: int, status: str, detail: str | None = None, **extra: Any) -> JsonResponse:
    body: dict[str, Any] = {"status": status, **extra}
    if detail is not None:
        body["detail"] = detail
    return JsonResponse(body, status=code)


@csrf_exempt
def receive(request: HttpRequest, callback_id: str) -> JsonResponse:
    """Resolve or extend the wait of ``callback_id`` from a signed request (module docstring)."""
    cfg = get_awa_settings()
    keys = cfg.CALLBACK_KEYS
    if not keys:
        return _reply(404, "unknown", "the callback receiver is not enabled")
    if request.method != "POST":
        response = _reply(405, "method_not_allowed", "use POST")
        response["Allow"] = "POST"
        return response
    length_header = request.META.get("CONTENT_LENGTH") or "0"
    if request.META.get("HTTP_TRANSFER_ENCODING") or not (
        length_header.isascii() and length_header.isdigit()
    ):
        # Django reads no chunked body: refuse it rather than see an empty one.
        return _reply(411, "length_required", "send the body with a Content-Length")
    if len(length_header) > 18 or int(length_header) > cfg.CALLBACK_MAX_BYTES:
        return _reply(413, "too_large", f"the body is over {cfg.CALLBACK_MAX_BYTES} bytes")
    sent_at = parse_timestamp(request.headers.get(TIMESTAMP_HEADER))
    candidates = parse_signatures(request.headers.get(SIGNATURE_HEADER))
    if sent_at is None or candidates is None:
        return _reply(
            401,
            "unauthorized",
            f"sign the request: {TIMESTAMP_HEADER} (Unix seconds) and "
            f"{SIGNATURE_HEADER} (v1=<hex>)",
        )
    try:
        body = request.body
    except RequestDataTooBig:
        return _reply(413, "too_large", "the body is over DATA_UPLOAD_MAX_MEMORY_SIZE")
    except OSError:  # the client went away mid-body (UnreadablePostError)
        return _reply(400, "malformed", "the body could not be read")
    if len(body) > cfg.CALLBACK_MAX_BYTES:
        return _reply(413, "too_large", f"the body is over {cfg.CALLBACK_MAX_BYTES} bytes")
    signed = message(request.method, request.path, callback_id, str(sent_at), body)
    if not signature_matches(candidates, keys, signed):
        return _reply(401, "unauthorized", "the signature matches no key")
    if _UUID.fullmatch(callback_id) is None:  # ASCII hex only: int() takes other digits too
        return _reply(404, "unknown", _DETAIL["unknown"])
    callback = uuid.UUID(callback_id)
    try:
        delivery = receiver.parse_body(body)
    except receiver.Malformed as exc:
        return _reply(400, "malformed", str(exc)[:500])
    if delivery.action == "resolve":
        digest = hashlib.sha256(body).digest()
    else:  # each heartbeat is a request of its own; the same one again is a replay
        digest = hashlib.sha256(str(sent_at).encode() + b"\n" + body).digest()
    try:
        receipt = receiver.receive(callback, sent_at, digest, delivery)
    except DataError as exc:  # a value the database refused: the request's fault
        log.info("awa callbacks: request for %s refused by the database: %s", callback, exc)
        return _reply(400, "malformed", "the database refused a value of this request")
    except DatabaseError as exc:
        log.warning("awa callbacks: callback %s not handled: %s", callback, exc)
        response = _reply(503, "unavailable", "try again later")
        response["Retry-After"] = "5"
        return response
    outcome = receipt.outcome
    code = STATUS.get(outcome, 409)
    extra: dict[str, Any] = {}
    if receipt.replayed:
        extra["replayed"] = True
    if receipt.timeout_at is not None:
        extra["timeout_at"] = receipt.timeout_at.isoformat()
    log.debug("awa callbacks: %s %s -> %s", delivery.action, callback, outcome)
    return _reply(code, outcome, _DETAIL.get(outcome), **extra)


# Never inside ATOMIC_REQUESTS' transaction: the receiver commits its one transaction itself, so
# an answer always reports a committed fact, and a database error never leaves a request's
# transaction broken behind a 4xx/503 answer.
for _alias in settings.DATABASES:
    receive = transaction.non_atomic_requests(using=_alias)(receive)
