"""Queue settings declared in ``AWA["QUEUES"]`` that live in the database: written by every
worker and maintenance process when it starts (with the periodic schedules,
awa_django.maintenance.cron.sync_schedules).

Today that is ``dlq``: whether a queue's jobs that fail for good go to the dead letter queue.
A queue without a ``dlq`` setting keeps what the database holds (what the admin or
``awa_django.operator.queue_dlq`` set last).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from awa_django.conf import get_awa_settings
from awa_django.sql import query

__all__ = ["declared_dlq", "sync_queue_settings"]

log = logging.getLogger("awa_django.maintenance")


def declared_dlq() -> dict[str, bool]:
    """``{queue: dlq}`` for every queue whose ``AWA["QUEUES"]`` entry sets ``dlq``."""
    return {
        name: queue.dlq
        for name, queue in get_awa_settings().QUEUES.items()
        if queue.dlq is not None
    }


async def sync_queue_settings(conn: psycopg.AsyncConnection[Any]) -> None:
    """Write each declared ``dlq`` to its queue (one short statement per such queue; an
    unchanged one is not written). Raises what the database raises."""
    for name, enabled in sorted(declared_dlq().items()):
        cursor = await conn.execute(query("queue_dlq"), [name, enabled])
        row = await cursor.fetchone()
        if row and row[0]:
            log.info(
                "awa: queue %s: dead letter queue turned %s (AWA['QUEUES'])",
                name,
                "on" if enabled else "off",
            )
