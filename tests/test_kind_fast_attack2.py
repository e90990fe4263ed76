"""Second attack on the kind-limit fast claim path (migration 0013, docs/flow.md "Per kind").

Aimed at the logic added since the first attack (tests/test_kind_fast_attack.py): the probe of
the lane's next job and the second pass from the first job of a limited kind, the keys of a
row drawn by a running sum (one cleared kind) or by per-kind offsets (several), the rate state
locked first and inserted only when missing, rows after a gap, a tombstone or a serial key.
Raw ``awa.claim_v3`` claimers (tests/kfast_model.py) check every invariant after every claim.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.helpers import conninfo, pg, wait_for
from tests.kfast_model import World
from tests.test_kind_fast_attack import assert_clean, drain

pytestmark = pytest.mark.usefixtures("clean_awa")

QUEUE = "kfb"
A, B, C, R, F = "kfa.a", "kfa.b", "kfa.c", "kfa.rate", "kfa.free"


@pytest.fixture
def world() -> Iterator[World]:
    w = World(conninfo(), QUEUE, 3)
    try:
        yield w
    finally:
        w.close()


def one_lane(w: World, *priorities: int) -> None:
    """One lane per priority (one shard): the lane order is the enqueue order."""
    for p in priorities or (0,):
        w.admin.execute("SELECT awa.ensure_lanes_v1(%s, %s, 1)", [w.queue, p])


def ids_of(got: list[Any]) -> list[int]:
    return [a.job_id for a in got]


# ---- the rate state: locked first, inserted only when missing -----------------------------------


def _waiting(pid: int) -> bool:
    with pg() as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
    return row is not None and row[0] == "Lock"


def _raw_claim(conn: psycopg.Connection[Any], queue: str, out: dict[str, Any]) -> None:
    try:
        out["rows"] = conn.execute(
            "SELECT job_id FROM awa.claim_v3(p_queue => %s, p_max => 10, "
            "p_worker => gen_random_uuid())",
            [queue],
        ).fetchall()
    except psycopg.Error as exc:
        out["error"] = exc


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="claim_v3 pass A: two claims that each insert a missing kind rate state (their "
    "first rate-limited kind) and then wait on the other's uncommitted insert of a later "
    "kind's state (INSERT .. ON CONFLICT DO NOTHING waits for an in-progress insert; the "
    "SKIP LOCKED select before it cannot see it) deadlock: one claim fails with "
    "'deadlock detected'. Repro: kinds R1, R2 (and R0) rate-limited, no state rows yet; "
    "lane X [R1, R0, R2], lane Y [R2, R1]; X pauses after inserting R1 (here: on R0's state "
    "inserted by a transaction still open), Y inserts R2 and waits on R1, X goes on to R2.",
)
def test_two_claims_creating_rate_states_in_opposite_orders_do_not_deadlock() -> None:
    r0, r1, r2 = "kfb.r0", "kfb.r1", "kfb.r2"
    with pg() as admin:
        for kind in (r0, r1, r2):
            admin.execute(
                "SELECT * FROM awa.flow_kind_set_v1(%s, NULL, 1000, 100, 'katk3', false)", [kind]
            )
        for queue, kinds in (("kfb.x", [r1, r0, r2]), ("kfb.y", [r2, r1])):
            admin.execute("SELECT awa.ensure_lanes_v1(%s, 0, 1)", [queue])
            admin.execute(
                "SELECT awa.enqueue_v1(%s::jsonb)",
                [json.dumps([{"kind": k, "queue": queue} for k in kinds])],
            )
        assert admin.execute("SELECT count(*) FROM awa.flow_kind_rate_state").fetchone() == (0,)
    # A claim that has just inserted R0's state (its first rate-limited kind) and not committed.
    other = psycopg.connect(conninfo())
    cx = psycopg.connect(conninfo(), autocommit=True)
    cy = psycopg.connect(conninfo(), autocommit=True)
    try:
        other.execute("INSERT INTO awa.flow_kind_rate_state (kind, tat) VALUES (%s, now())", [r0])
        px = cx.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        py = cy.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        x: dict[str, Any] = {}
        y: dict[str, Any] = {}
        tx = threading.Thread(target=_raw_claim, args=(cx, "kfb.x", x))
        tx.start()
        wait_for(lambda: _waiting(px), timeout=10, message="X waiting on R0's state")
        ty = threading.Thread(target=_raw_claim, args=(cy, "kfb.y", y))
        ty.start()
        wait_for(lambda: _waiting(py), timeout=10, message="Y waiting on R1's state")
        other.rollback()
        tx.join(20)
        ty.join(20)
    finally:
        other.close()
        cx.close()
        cy.close()
    errors = [str(o["error"]) for o in (x, y) if "error" in o]
    assert not errors, errors
    assert len(x["rows"]) + len(y["rows"]) >= 3
