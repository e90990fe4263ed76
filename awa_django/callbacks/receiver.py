"""What the callback receiver does with a request whose signature it has checked: read the
body, then resolve or extend the callback in one transaction (``awa.callback_receive_v1``).

The body is a JSON object with exactly one of:

* ``{"result": <any JSON>}``: the job completes with that result (or, when its handler waited
  with ``WaitForCallback(..., resume=True)``, runs again with it as ``ctx.callback_result``);
* ``{"error": "<text>", "terminal": false}``: the attempt fails, retried like a raised exception,
  or failed at once when ``terminal`` is true;
* ``{"heartbeat": true, "timeout": <seconds>}``: the wait is extended to ``timeout`` seconds from
  now (default: the wait's own timeout), so long external work is not rescued.

Anything else is refused (:class:`Malformed`) before the database is asked.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime
from typing import Any, Literal

from awa_django import serialization
from awa_django.conf import get_awa_settings
from awa_django.db.transactions import write_transaction
from awa_django.exceptions import AwaError
from awa_django.limits import MAX_TEXT, check_seconds, check_text
from awa_django.operator.rows import alias
from awa_django.sql import query

__all__ = ["Delivery", "Malformed", "Receipt", "parse_body", "receive"]

_KEYS = {
    "resolve": ({"result"}, {"error"}, {"error", "terminal"}),
    "heartbeat": ({"heartbeat"}, {"heartbeat", "timeout"}),
}


class Malformed(ValueError):
    """The body is not a request the receiver understands (HTTP 400); the message says why."""


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    """A checked request body: ``resolve`` (``result_json``, or ``error_json`` and
    ``terminal``) or ``heartbeat`` (``timeout`` seconds, None for the wait's own)."""

    action: Literal["resolve", "heartbeat"]
    result_json: str | None = None
    error_json: str | None = None
    terminal: bool = False
    timeout: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Receipt:
    """What the database did: ``outcome`` (see ``awa.callback_receive_v1``), whether this
    request was received before (``replayed``: nothing was done again), and the new timeout of
    an extended wait."""

    outcome: str
    replayed: bool = False
    timeout_at: datetime | None = None


def _reject_constant(name: str) -> Any:
    raise Malformed(f"{name} is not JSON")


def parse_body(body: bytes) -> Delivery:
    """The request body as a :class:`Delivery`, or :class:`Malformed` (never another error,
    whatever the bytes)."""
    cfg = get_awa_settings()
    try:
        text = body.decode("utf-8")
        data = json.loads(text, parse_constant=_reject_constant)
    except Malformed:
        raise
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        raise Malformed("the body is not a JSON document (UTF-8)") from None
    if type(data) is not dict:
        raise Malformed(
            'the body must be a JSON object: {"result": ...}, {"error": "..."} or '
            '{"heartbeat": true}'
        )
    keys = set(data)
    action = next((name for name, shapes in _KEYS.items() if keys in shapes), None)
    if action is None:
        raise Malformed(
            'expected exactly one of {"result": ...}, {"error": "...", "terminal": false} or '
            '{"heartbeat": true, "timeout": seconds}; got the keys '
            + ", ".join(sorted(repr(k)[:40] for k in keys)[:10])
        )
    try:
        if action == "heartbeat":
            if data["heartbeat"] is not True:
                raise Malformed("heartbeat: must be true")
            timeout = data.get("timeout")
            return Delivery(
                "heartbeat", timeout=None if timeout is None else check_seconds("timeout", timeout)
            )
        if "result" in data:
            result = serialization.dumps(
                data["result"],
                "result",
                max_bytes=cfg.RESULT_MAX_BYTES,
                max_depth=cfg.JSON_MAX_DEPTH,
            )
            return Delivery("resolve", result_json=result)
        message = check_text("error", data["error"], max_length=MAX_TEXT)
        terminal = data.get("terminal", False)
        if type(terminal) is not bool:
            raise Malformed("terminal: must be true or false")
        error = json.dumps({"type": "awa_django.CallbackError", "message": message})
        return Delivery("resolve", error_json=error, terminal=terminal)
    except AwaError as exc:  # InvalidArgumentsError, LimitExceededError, InvalidOptionError
        raise Malformed(str(exc)) from None


def receive(
    callback_id: uuid.UUID,
    sent_at: int,
    digest: bytes,
    delivery: Delivery,
    *,
    using: str | None = None,
) -> Receipt:
    """Act on one signed request, at most once: one transaction at READ COMMITTED on
    ``using`` (default ``AWA["DATABASE_ALIAS"]``), or the caller's transaction.

    ``sent_at`` is its timestamp (checked against the database clock, within
    ``AWA["CALLBACK_TIMESTAMP_TOLERANCE"]``), ``digest`` identifies the request: SHA-256 of
    the body for a resolution, of the timestamp and body for a heartbeat.
    """
    cfg = get_awa_settings()
    with (
        write_transaction(alias(using), read_committed=True) as connection,
        connection.cursor() as c,
    ):
        c.execute(
            query("callback_receive"),
            [
                str(callback_id),
                sent_at,
                cfg.CALLBACK_TIMESTAMP_TOLERANCE,
                delivery.action,
                digest,
                delivery.result_json,
                delivery.error_json,
                delivery.terminal,
                delivery.timeout,
                cfg.RETRY_BACKOFF_BASE,
            ],
        )
        row = c.fetchone()
    if row is None:  # pragma: no cover - the function always returns a row
        return Receipt("unknown")
    outcome, replayed, timeout_at = row
    return Receipt(str(outcome), bool(replayed), timeout_at)
