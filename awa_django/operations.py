"""Operator actions on jobs, shared by the public API, the admin and the management commands.

Each is atomic: in the caller's transaction when there is one (it commits or rolls back with
it), else in a transaction of its own at READ COMMITTED. Bad input raises a ``JobValidationError``
before anything is sent to the database, so the caller's transaction stays usable.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from awa_django import serialization
from awa_django.conf import awa_settings, get_awa_settings
from awa_django.db.transactions import write_transaction
from awa_django.exceptions import InvalidOptionError
from awa_django.limits import (
    MAX_BIGINT,
    MAX_TEXT,
    check_ids,
    check_priority,
    check_queue_name,
    check_text,
    check_uuid,
)
from awa_django.sql import query

__all__ = ["cancel", "dlq_purge", "dlq_retry", "resolve_callback"]


def cancel(job_id: int, *, reason: str = "cancelled", using: str | None = None) -> str | None:
    """Cancel one job wherever it is, in the caller's transaction.

    Returns the state it was cancelled from (``scheduled``, ``retryable``, ``available``,
    ``running``, ``waiting_external``), or ``None`` when there was nothing to cancel (unknown id,
    already terminal, or dead-lettered). A running handler is told through NOTIFY at commit and
    sees ``ctx.is_cancelled()`` turn true; its late completion is rejected as stale. ``reason``
    is text of at most 10,000 characters.
    """
    if type(job_id) is not int or not -MAX_BIGINT <= job_id <= MAX_BIGINT:
        raise InvalidOptionError("job_id", f"{job_id!r} is not a job id (an int)")
    check_text("reason", reason, max_length=MAX_TEXT)
    alias = using or awa_settings.DATABASE_ALIAS
    with write_transaction(alias, read_committed=True) as connection, connection.cursor() as cur:
        cur.execute(query("cancel"), [job_id, reason])
        row = cur.fetchone()
    return None if row is None else row[0]


def dlq_retry(
    job_ids: Sequence[int],
    *,
    queue: str | None = None,
    priority: int | None = None,
    using: str | None = None,
) -> list[int]:
    """Move dead-lettered jobs back to work (attempt 0, error history kept); return their ids.

    ``queue`` and ``priority`` optionally send them elsewhere. Ids not in the DLQ are ignored.
    All of them move, or none.
    """
    ids = check_ids("job_ids", job_ids)
    if queue is not None:
        check_queue_name(queue)
    if priority is not None:
        check_priority(priority)
    alias = using or awa_settings.DATABASE_ALIAS
    with write_transaction(alias) as connection, connection.cursor() as cursor:
        cursor.execute(query("dlq_retry"), [ids, queue, priority])
        return [row[0] for row in cursor.fetchall()]


def dlq_purge(job_ids: Sequence[int], *, using: str | None = None) -> list[int]:
    """Delete dead-lettered jobs for good; return the ids purged."""
    ids = check_ids("job_ids", job_ids)
    alias = using or awa_settings.DATABASE_ALIAS
    with write_transaction(alias) as connection, connection.cursor() as cursor:
        cursor.execute(query("dlq_purge"), [ids])
        return [row[0] for row in cursor.fetchall()]


def resolve_callback(
    callback_id: uuid.UUID | str,
    *,
    result: Any = None,
    error: str | None = None,
    terminal: bool = False,
    using: str | None = None,
) -> str:
    """Resolve an attempt that registered ``callback_id`` (``ctx.callback_id``), in the
    caller's transaction.

    Without ``error`` the job completes with ``result`` (JSON). With ``error`` (text) the attempt
    fails: retried with backoff like a raised exception, or failed at once when ``terminal``.
    Returns ``resolved``, ``stale`` (already resolved, timed out and rescued, or cancelled) or
    ``unknown``. Fenced by ``(job_id, run_lease)`` like every other finalization. The attempt
    may not have parked yet (the external system answered before the handler returned): the
    resolution is then kept and applied when it parks.
    """
    cfg = get_awa_settings()
    callback = check_uuid("callback_id", callback_id)
    if type(terminal) is not bool:
        raise InvalidOptionError("terminal", f"must be True or False, got {terminal!r}")
    result_json = serialization.dumps(
        result, "result", max_bytes=cfg.RESULT_MAX_BYTES, max_depth=cfg.JSON_MAX_DEPTH
    )
    error_json = None
    if error is not None:
        message = check_text("error", error, max_length=MAX_TEXT)
        error_json = json.dumps({"type": "awa_django.CallbackError", "message": message})
    with (
        write_transaction(using or cfg.DATABASE_ALIAS, read_committed=True) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute(
            query("callback_resolve"),
            [str(callback), result_json, error_json, terminal, cfg.RETRY_BACKOFF_BASE],
        )
        row = cursor.fetchone()
    return "unknown" if row is None else str(row[0])
