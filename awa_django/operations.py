"""Operator actions on jobs, shared by the public API, the admin and the management commands."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from awa_django.conf import awa_settings
from awa_django.db.identifiers import validate_queue_name
from awa_django.exceptions import InvalidOptionError
from awa_django.sql import query

__all__ = ["cancel", "dlq_purge", "dlq_retry"]


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
