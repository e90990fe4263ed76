"""Operator actions on jobs, shared by the public API, the admin and the management commands."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connections

from awa_django import serialization
from awa_django.conf import awa_settings, get_awa_settings
from awa_django.db.identifiers import validate_queue_name
from awa_django.exceptions import InvalidOptionError
from awa_django.sql import query

__all__ = ["cancel", "dlq_purge", "dlq_retry", "resolve_callback"]


def cancel(job_id: int, *, reason: str = "cancelled", using: str | None = None) -> str | None:
    """Cancel one job wherever it is, in the caller's transaction.

    Returns the state it was cancelled from (``scheduled``, ``retryable``, ``available``,
    ``running``, ``waiting_external``), or ``None`` when there was nothing to cancel (unknown id,
    already terminal, or dead-lettered). A running handler is told through NOTIFY at commit and
    sees ``ctx.is_cancelled()`` turn true; its late completion is rejected as stale.
    """
    with connections[using or awa_settings.DATABASE_ALIAS].cursor() as cursor:
        cursor.execute(query("cancel"), [job_id, reason])
        row = cursor.fetchone()
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
    """
    if queue is not None:
        validate_queue_name(queue)
    if priority is not None and (type(priority) is not int or not -100 <= priority <= 100):
        raise InvalidOptionError("priority", f"{priority!r} is not an integer in -100..100")
    with connections[using or awa_settings.DATABASE_ALIAS].cursor() as cursor:
        cursor.execute(query("dlq_retry"), [list(job_ids), queue, priority])
        return [row[0] for row in cursor.fetchall()]


def dlq_purge(job_ids: Sequence[int], *, using: str | None = None) -> list[int]:
    """Delete dead-lettered jobs for good; return the ids purged."""
    with connections[using or awa_settings.DATABASE_ALIAS].cursor() as cursor:
        cursor.execute(query("dlq_purge"), [list(job_ids)])
        return [row[0] for row in cursor.fetchall()]


def resolve_callback(
    callback_id: uuid.UUID | str,
    *,
    result: Any = None,
    error: str | None = None,
    terminal: bool = False,
    using: str | None = None,
) -> str:
    """Resolve an attempt parked with ``WaitForCallback``, in the caller's transaction.

    Without ``error`` the job completes with ``result`` (JSON). With ``error`` the attempt fails:
    retried with backoff like a raised exception, or failed at once when ``terminal``. Returns
    ``resolved``, ``stale`` (already resolved, timed out and rescued, or cancelled) or
    ``unknown``. Fenced by ``(job_id, run_lease)`` like every other finalization.
    """
    cfg = get_awa_settings()
    result_json = serialization.dumps(
        result, "result", max_bytes=cfg.RESULT_MAX_BYTES, max_depth=cfg.JSON_MAX_DEPTH
    )
    error_json = None
    if error is not None:
        error_json = json.dumps({"type": "awa_django.CallbackError", "message": str(error)})
    with connections[using or cfg.DATABASE_ALIAS].cursor() as cursor:
        cursor.execute(
            query("callback_resolve"), [str(callback_id), result_json, error_json, terminal]
        )
        row = cursor.fetchone()
    return "unknown" if row is None else str(row[0])
