"""awa_django/sql/schema.sql is the schema the migrations produce (PostgreSQL 15 and 18 alike)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from django.db import connection

pytestmark = pytest.mark.storage

ROOT = Path(__file__).resolve().parent.parent


def schema_dump() -> ModuleType:
    """scripts/schema_dump, imported as a module."""
    path = ROOT / "scripts" / "schema_dump"
    loader = importlib.machinery.SourceFileLoader("awa_schema_dump", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


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
        "the migrations produce a schema other than awa_django/sql/schema.sql; if the change "
        f"is intended, regenerate it with `DATABASE_URL=... {dump.REGENERATE}` and commit "
        f"it:\n{stale}"
    )


#: Functions a later migration redefines in place, and why (the file says more). A function
#: redefined by more than one later file is in REDEFINED_AGAIN too.
REDEFINED = {
    # 0004_claim.sql: read the claim slot under the lane lock; carried claims keep their
    # generation (what claim_v2's one-probe lane cursor relies on).
    "awa.claim_v1": "0004_claim.sql",
    "awa._carry_claims_v1": "0004_claim.sql",
    # 0007_retry.sql: every retry's wait comes from awa._backoff_v2 and the job's own retry
    # policy (rescue no longer precomputes one; _backoff_v1 is _backoff_v2 without a policy).
    "awa._finalize_pass_v1": "0007_retry.sql",
    "awa.rescue_v1": "0007_retry.sql",
    "awa._backoff_v1": "0007_retry.sql",
    # 0008_flow.sql: jobs parked behind a serial key (awa.serial_waiting) are seen by cancel,
    # queue drain, unique keys and burst workers.
    "awa._job_brief_v1": "0008_flow.sql",
    "awa.cancel_v1": "0008_flow.sql",
    "awa.queue_drain_v2": "0008_flow.sql",
    "awa.queues_idle_v1": "0008_flow.sql",
    # 0011_roles.sql: a lane named in awa.xact_lanes is used only when its lock is held (a
    # SECURITY DEFINER enqueue must not trust a setting any caller can forge).
    "awa._lane_for_v1": "0011_roles.sql",
    # 0012_kind_limits.sql: kind limits in the claim (jobs of a limited kind take the slow
    # path), and producers never pick a hand-off lane (shard 64).
    "awa.claim_v3": "0012_kind_limits.sql",
    "awa.enqueue_one_v2": "0012_kind_limits.sql",
    "awa.enqueue_one_v3": "0012_kind_limits.sql",
    # 0013_kind_fast_claim.sql: the reset of a lowered kind limit's max_seen never waits.
    "awa._flow_kind_take_v1": "0013_kind_fast_claim.sql",
    # 0016_claim_cost.sql: a batch of completions of one claim slot names that slot's tables.
    "awa.finalize_v2": "0016_claim_cost.sql",
    # 0018_queues_ready.sql: an idle claim ring stops rotating; markers for busy lanes only.
    "awa.rotate_v3": "0018_queues_ready.sql",
}
#: Functions redefined a second time: 0012_kind_limits.sql shows jobs parked by their kind
#: (awa.flow_waiting) where 0008 shows serial-parked ones, and keeps producers off shard 64.
REDEFINED_AGAIN = {
    # 0013_kind_fast_claim.sql: jobs of kinds that do not bind go through the claim's statement.
    "awa.claim_v3": "0013_kind_fast_claim.sql",
    "awa._job_brief_v1": "0012_kind_limits.sql",
    "awa.cancel_v1": "0012_kind_limits.sql",
    "awa.queue_drain_v2": "0012_kind_limits.sql",
    "awa.queues_idle_v1": "0012_kind_limits.sql",
    "awa._lane_for_v1": "0012_kind_limits.sql",
}
#: Functions redefined a third time.
REDEFINED_THIRD = {
    # 0016_claim_cost.sql: the statements of the common path name the ring slot they read
    # (generated per-slot branches, scripts/gen_claim_cost), the same decisions at fewer locks.
    "awa.claim_v3": "0016_claim_cost.sql",
}
#: Functions redefined a fourth time.
REDEFINED_FOURTH = {
    # 0017_claim_lean.sql: the same decisions in fewer plan nodes and statements (the run
    # statement of a queue without kind limits, the flow limits read by the first statement;
    # scripts/gen_claim_lean).
    "awa.claim_v3": "0017_claim_lean.sql",
}
# Views redefined in place (same columns): 0008_flow.sql shows parked jobs as available, and
# 0012_kind_limits.sql jobs parked by their kind too.
REDEFINED_VIEWS = {"awa.live_jobs": "0008_flow.sql"}
REDEFINED_VIEWS_AGAIN = {"awa.live_jobs": "0012_kind_limits.sql"}


def test_schema_sql_names_every_migrated_function_once() -> None:
    text = (ROOT / "awa_django" / "sql" / "schema.sql").read_text(encoding="utf-8")
    names = [
        line.split("(")[0].removeprefix("CREATE OR REPLACE FUNCTION ")
        for line in text.splitlines()
        if line.startswith("CREATE OR REPLACE FUNCTION ")
    ]
    assert names and len(names) == len(set(names))
    migrations = ROOT / "awa_django" / "sql" / "migrations"
    sources = "".join(p.read_text(encoding="utf-8") for p in sorted(migrations.glob("*.sql")))
    # Settled SQL: each function and view is created exactly once across the migration files,
    # apart from the few a later file redefines in place (same signature and results).
    for name in names:
        created = len(re.findall(rf"CREATE (?:OR REPLACE )?FUNCTION {re.escape(name)}\(", sources))
        again = (name in REDEFINED_AGAIN) + (name in REDEFINED_THIRD) + (name in REDEFINED_FOURTH)
        assert created == 1 + (name in REDEFINED) + again, name
    redefined = re.findall(r"CREATE OR REPLACE FUNCTION (awa\.\w+)\(", sources)
    assert sorted(redefined) == sorted(
        [*REDEFINED, *REDEFINED_AGAIN, *REDEFINED_THIRD, *REDEFINED_FOURTH]
    )
    views = re.findall(r"CREATE OR REPLACE VIEW (awa\.\w+) AS", sources)
    assert sorted(views) == sorted([*REDEFINED_VIEWS, *REDEFINED_VIEWS_AGAIN])
    assert sources.count("CREATE OR REPLACE") == (
        len(REDEFINED)
        + len(REDEFINED_AGAIN)
        + len(REDEFINED_THIRD)
        + len(REDEFINED_FOURTH)
        + len(REDEFINED_VIEWS)
        + len(REDEFINED_VIEWS_AGAIN)
    )


# One backoff for every SQL retry path ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_backoff_is_one_function_and_callbacks_honour_the_base() -> None:
    import json
    import uuid

    from awa_django.db import storage
    from awa_django.db.storage import Finalization
    from tests.storage_support import WORKER, enqueue_sql, pg

    with pg() as conn:

        def scalar(sql: str, *params: object) -> float:
            row = conn.execute(sql, params).fetchone()
            assert row is not None
            return float(row[0])

        assert 80 <= scalar("SELECT awa._backoff_v1(3, 10)") <= 100
        assert 2 <= scalar("SELECT awa._backoff_v1(1, NULL)") <= 2.5
        assert scalar("SELECT awa._backoff_v1(1000, 5)") == 86400
        sources = (ROOT / "awa_django" / "sql" / "migrations").glob("*.sql")
        texts = [p.read_text(encoding="utf-8") for p in sorted(sources)]
        # One backoff function: the only jitter is awa._backoff_v2's, and the current bodies of
        # the retry paths (the last definition of each) call it and nothing else.
        # _backoff_v1 in 0002, v2 in 0007; and the first permit to probe of 0008 (queues) and
        # 0012 (kinds, redefined in 0013), not backoffs.
        assert sum(t.count("random() *") for t in texts) == 5
        retry = (ROOT / "awa_django" / "sql" / "migrations" / "0007_retry.sql").read_text("utf-8")
        assert (
            "random() * COALESCE" in retry and "_backoff_v1(" not in retry.split("-- Finalize")[1]
        )

        # A failed callback resolution is retried after base x 2^attempt, parked or early.
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "cb"}, {"kind": "k", "queue": "cb"}]))
        first, second = storage.claim(conn, "cb", 2, WORKER)
        parked, early = uuid.uuid4(), uuid.uuid4()
        conn.execute(
            "SELECT awa.callback_register_v1(%s, %s, %s)", [second.job_id, second.run_lease, early]
        )
        error = '{"message": "no"}'
        assert conn.execute(
            "SELECT awa.callback_resolve_v1(%s, NULL, %s::jsonb, false, 1000)", [early, error]
        ).fetchone() == ("resolved",)
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
            "SELECT awa.callback_resolve_v1(%s, NULL, %s::jsonb, false, 1000)", [parked, error]
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
