"""Reading and emptying the awa schema of the test database.

Jobs are built by tests/support/factories.py; connections come from tests/support/database.py.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from types import ModuleType
from typing import Any

import psycopg

from tests.support.database import pg
from tests.support.processes import REPO

__all__ = ["RESET_SQL", "count_jobs", "job_state", "reset_awa", "schema_dump"]


def count_jobs() -> int:
    """How many jobs ``awa.jobs`` holds, read on Django's connection (so inside the test's
    transaction)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM awa.jobs")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def job_state(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    """The awa.jobs row of one job as a dict (None when absent)."""
    cur = conn.execute("SELECT * FROM awa.jobs WHERE id = %s", [job_id])
    row = cur.fetchone()
    if row is None:
        return None
    assert cur.description is not None
    return {d.name: v for d, v in zip(cur.description, row, strict=True)}


# Only the relations that were ever written are truncated (a file of 0 bytes holds no tuple,
# live or dead): TRUNCATE of all the ~150 partitions gives each new files, about 70 ms a call.
RESET_SQL = """
DO $$
DECLARE
    v_tables text;
    v_reset text[] := ARRAY[
        'ready_entries', 'ready_tombstones', 'done_entries', 'done_counts', 'claims',
        'claim_closures',
        'leases', 'attempt_state', 'deferred_jobs', 'dlq_entries', 'queue_meta', 'queue_lanes',
        'lane_floors', 'ring_rotations', 'ring_prunes', 'runtime_instances', 'unique_keys',
        'cron_schedules', 'flow_limits', 'flow_rate_state', 'callback_receipts',
        'serial_waiting', 'flow_kind_limits', 'flow_kind_rate_state', 'flow_waiting',
        'history_retries', 'queue_minutes', 'queue_minute_retries', 'descriptors',
        'workflows', 'workflow_steps', 'workflow_edges', 'workflow_waiting'];
BEGIN
    SELECT string_agg(format('awa.%I', c.relname), ', ') INTO v_tables
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'awa' AND c.relkind = 'r'
      AND pg_relation_size(c.oid) > 0
      AND (c.relname = ANY (v_reset)
           OR EXISTS (SELECT 1 FROM pg_partition_ancestors(c.oid) a
                      JOIN pg_class p ON p.oid = a.relid
                      WHERE p.relname = ANY (v_reset)));
    IF v_tables IS NOT NULL THEN
        EXECUTE 'TRUNCATE ' || v_tables;
    END IF;
END $$;
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


def schema_dump() -> ModuleType:
    """scripts/schema_dump, imported as a module."""
    path = REPO / "scripts" / "schema_dump"
    loader = importlib.machinery.SourceFileLoader("awa_schema_dump", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
