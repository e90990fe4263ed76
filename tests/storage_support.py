"""Helpers for storage tests: worker-style psycopg connections to the test database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections


def conninfo(alias: str = "default") -> str:
    """psycopg conninfo for the (test) database behind ``alias``."""
    s = connections[alias].settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=s["NAME"],
        user=s.get("USER") or None,
        password=s.get("PASSWORD") or None,
        host=s.get("HOST") or None,
        port=str(s["PORT"]) if s.get("PORT") else None,
    )


@contextmanager
def pg(autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """A fresh psycopg connection, closed on exit."""
    conn = psycopg.connect(conninfo(), autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


WORKER = uuid.UUID("00000000-0000-0000-0000-00000000a0a0")


def enqueue_sql(conn: psycopg.Connection[Any], jobs: str) -> list[tuple[int, str]]:
    """Call awa.enqueue_v1 directly (raw-SQL producer path)."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT job_id, state FROM awa.enqueue_v1(%s::jsonb)", [jobs]
        ).fetchall()
    ]


def job_state(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    """The awa.jobs row of one job as a dict (None when absent)."""
    cur = conn.execute("SELECT * FROM awa.jobs WHERE id = %s", [job_id])
    row = cur.fetchone()
    if row is None:
        return None
    assert cur.description is not None
    return {d.name: v for d, v in zip(cur.description, row, strict=True)}


RESET_SQL = """
TRUNCATE awa.ready_entries, awa.ready_tombstones, awa.done_entries, awa.claims,
         awa.claim_closures, awa.leases, awa.attempt_state, awa.deferred_jobs, awa.dlq_entries,
         awa.queue_meta, awa.queue_lanes, awa.lane_floors, awa.ring_rotations, awa.ring_prunes,
         awa.runtime_instances;
INSERT INTO awa.ring_rotations (ring, generation, slot)
VALUES ('queue', 0, 0), ('claim', 0, 0), ('lease', 0, 0);
DO $$
DECLARE s text;
BEGIN
    FOR s IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'awa' AND c.relkind = 'S' AND c.relname LIKE 'lane\\_seq\\_%'
    LOOP
        EXECUTE format('DROP SEQUENCE awa.%I', s);
    END LOOP;
END $$;
"""


def reset_awa() -> None:
    """Empty every awa table (TransactionTestCase flushes only Django models' tables)."""
    from awa_django.db.enqueue import forget_known_lanes

    with pg() as conn:
        conn.execute(RESET_SQL)
    forget_known_lanes()


def dead_letter(
    n: int = 1, queue: str = "default", *, kind: str = "tests.testjobs.noop", text: str = "boom"
) -> list[int]:
    """Enqueue n jobs through the SQL producer, claim them and fail them terminally (DLQ).

    ``text`` lands in the arguments and in the error's message and traceback.
    """
    import json

    from awa_django.db import storage
    from awa_django.db.storage import Finalization

    with pg() as conn:
        ids = [
            i
            for i, _ in enqueue_sql(
                conn,
                json.dumps(
                    [{"kind": kind, "queue": queue, "args": {"args": [text], "kwargs": {}}}] * n
                ),
            )
        ]
        claimed = storage.claim(conn, queue, n, WORKER)
        storage.finalize(
            conn,
            [
                Finalization(
                    c.job_id,
                    c.run_lease,
                    c.claim_slot,
                    "fail",
                    error={"type": "Boom", "message": text, "traceback": text},
                )
                for c in claimed
            ],
        )
    return ids
