"""docs/reference/schema.sql is the schema the migrations produce (PostgreSQL 15 and 18 alike)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from tests.support.awa_schema import schema_dump

pytestmark = pytest.mark.storage

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db(transaction=True)
def test_schema_sql_matches_a_freshly_migrated_database() -> None:
    dump = schema_dump()
    s = connection.settings_dict
    params = {
        "user": s.get("USER"),
        "password": s.get("PASSWORD"),
        "host": s.get("HOST"),
        "port": s.get("PORT"),
    }
    actual = dump.migrated_schema(dump._url(params, s["NAME"]))
    expected = dump.SCHEMA_SQL.read_text(encoding="utf-8")
    stale = dump.diff(expected, actual)
    assert not stale, (
        "the migrations produce a schema other than docs/reference/schema.sql; if the change "
        f"is intended, regenerate it with `DATABASE_URL=... {dump.REGENERATE}` and commit "
        f"it:\n{stale}"
    )


# One backoff for every SQL retry path ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_backoff_is_one_function_and_callbacks_honour_the_base() -> None:
    import json
    import uuid

    from awa_django.db import storage
    from awa_django.db.storage import Finalization
    from tests.support.database import pg
    from tests.support.factories import WORKER, enqueue_sql

    with pg() as conn:

        def scalar(sql: str, *params: object) -> float:
            row = conn.execute(sql, params).fetchone()
            assert row is not None
            return float(row[0])

        assert 80 <= scalar("SELECT awa._backoff_v2(3, 10, NULL)") <= 100
        assert 2 <= scalar("SELECT awa._backoff_v2(1, NULL, NULL)") <= 2.5
        assert scalar("SELECT awa._backoff_v2(1000, 5, NULL)") == 86400
        functions = ROOT / "awa_django" / "sql" / "functions"
        texts = {p.name: p.read_text(encoding="utf-8") for p in functions.glob("*.sql")}
        # One backoff function: the only jitter is awa._backoff_v2's (retry.sql); the others
        # are the first permit to probe, of queues and of kinds (flow.sql), not backoffs.
        assert {n: t.count("random() *") for n, t in texts.items() if "random() *" in t} == {
            "retry.sql": 1,
            "flow.sql": 2,
        }
        assert "random() * COALESCE" in texts["retry.sql"]

        # A failed callback resolution is retried after base x 2^attempt, parked or early.
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "cb"}, {"kind": "k", "queue": "cb"}]))
        first, second = storage.claim(conn, "cb", 2, WORKER)
        parked, early = uuid.uuid4(), uuid.uuid4()
        conn.execute(
            "SELECT awa.callback_register_v1(%s, %s, %s)", [second.job_id, second.run_lease, early]
        )
        error = '{"message": "no"}'
        assert conn.execute(
            "SELECT outcome FROM awa.callback_resolve_v2(%s, NULL, %s::jsonb, false, 1000)",
            [early, error],
        ).fetchone() == ("accepted",)
        storage.finalize(
            conn,
            [
                Finalization(
                    c.job_id, c.run_lease, c.claim_slot, "wait", callback_id=cb, timeout=60.0
                )
                for c, cb in ((first, parked), (second, early))
            ],
        )
        assert conn.execute(
            "SELECT outcome FROM awa.callback_resolve_v2(%s, NULL, %s::jsonb, false, 1000)",
            [parked, error],
        ).fetchone() == ("resolved",)
        delays = [
            scalar(
                "SELECT extract(epoch FROM run_at - now()) FROM awa.deferred_jobs "
                "WHERE job_id = %s",
                c.job_id,
            )
            for c in (first, second)
        ]
        assert all(1900 <= d <= 2500 for d in delays), delays


# The bounds on job options: one definition per language, and the two agree -------------------


@pytest.mark.django_db
def test_python_and_sql_bounds_on_job_options_agree() -> None:
    from awa_django.exceptions import InvalidOptionError
    from awa_django.limits import (
        ATTEMPTS_RANGE,
        PRIORITY_RANGE,
        check_max_attempts,
        check_priority,
        check_queue_name,
    )

    def python_accepts(check: object, value: object) -> bool:
        try:
            check(value)  # type: ignore[operator]
        except InvalidOptionError:
            return False
        return True

    cases = [
        ("valid_priority", "integer", check_priority, v)
        for v in (PRIORITY_RANGE[0] - 1, *PRIORITY_RANGE, PRIORITY_RANGE[1] + 1, 0)
    ]
    cases += [
        ("valid_max_attempts", "integer", check_max_attempts, v)
        for v in (ATTEMPTS_RANGE[0] - 1, *ATTEMPTS_RANGE, ATTEMPTS_RANGE[1] + 1)
    ]
    cases += [
        ("valid_queue_name", "text", check_queue_name, v)
        for v in ("default", "a" * 63, "a" * 64, "", "Upper", "x y", "q.1-_")
    ]
    with connection.cursor() as cursor:
        for function, sql_type, check, value in cases:
            cursor.execute(f"SELECT awa.{function}(%s::{sql_type})", [value])
            (sql_accepts,) = cursor.fetchone()
            assert sql_accepts == python_accepts(check, value), (function, value)
