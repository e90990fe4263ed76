"""Descriptors in SQL: ``awa.descriptors_report_v1`` (what a worker declares),
``awa.descriptor_status`` (stale and drift from the live processes), ``awa.descriptors_prune_v1``
(retention) and ``awa.undeclared_kinds_v1`` (kinds of available jobs no live worker declares)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from awa_django.operator import descriptors, undeclared_kinds
from tests.support.database import pg
from tests.support.factories import enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

Conn = psycopg.Connection[Any]
A = uuid.UUID("00000000-0000-0000-0000-0000000000d1")
B = uuid.UUID("00000000-0000-0000-0000-0000000000d2")
HASH_1, HASH_2 = "1" * 64, "2" * 64


@pytest.fixture
def conn() -> Iterator[Conn]:
    with pg() as c:
        for instance in (A, B):
            c.execute("SELECT awa.runtime_upsert_v1(%s, 'host', 1, '{}', 1, 'test')", [instance])
        yield c


def item(what: str = "kind", name: str = "shop.ship", hash_: str = HASH_1, **more: Any) -> Any:
    return {"what": what, "name": name, "hash": hash_, **more}


def report(conn: Conn, instance: uuid.UUID, items: list[Any], live: float = 30) -> int:
    [[n]] = conn.execute(
        "SELECT awa.descriptors_report_v1(%s, %s, %s::jsonb)", [instance, live, json.dumps(items)]
    ).fetchall()
    return int(n)


def status(name: str) -> Any:
    [found] = [d for d in descriptors() if d.name == name]
    return found


def test_a_report_writes_what_changed_and_live_workers_agree_or_drift(conn: Conn) -> None:
    links = {"runbook": "https://wiki.example/ship"}
    declared = [
        item("queue", "orders", label="Orders", owner="team-shop"),
        item(description="Ship an order", links=links),
    ]
    assert report(conn, A, declared) == 2
    assert report(conn, A, declared) == 0  # the same again: nothing written
    assert report(conn, B, declared) == 0
    shipped = status("shop.ship")
    assert (shipped.description, shipped.links, shipped.live_workers) == (
        "Ship an order",
        links,
        2,
    )
    assert not shipped.stale and not shipped.drift and status("orders").owner == "team-shop"
    # B runs other code: its declaration is written (last writer wins), and the two drift.
    assert report(conn, B, [item(hash_=HASH_2, description="Ship it now")]) == 1
    shipped = status("shop.ship")
    assert (shipped.description, shipped.versions, shipped.drift) == ("Ship it now", 2, True)
    # A goes quiet past its live seconds: B alone declares the kind; nobody the queue.
    conn.execute(
        "UPDATE awa.runtime_instances SET last_seen_at = now() - interval '31 s'"
        " WHERE instance_id = %s",
        [A],
    )
    shipped, orders = status("shop.ship"), status("orders")
    assert (shipped.live_workers, shipped.drift, shipped.stale) == (1, False, False)
    assert (orders.live_workers, orders.stale) == (0, True)


@pytest.mark.parametrize(
    ("items", "live", "message"),
    [
        ([item(what="table")], 30, 'descriptor 1: what: must be "queue" or "kind"'),
        ([item("queue", "Not A Queue")], 30, "descriptor 1: name: not a queue name"),
        ([item(name="a\nb")], 30, "name: not a job kind"),
        ([item(name="")], 30, "name: not a job kind"),
        ([item(name="   ")], 30, "name: not a job kind"),
        ([item(links={"x": "https://x.io/\u3000"})], 30, "links: up to 20 names"),
        ([item(), item(hash_="x")], 30, "descriptor 2: hash: must be 64 hex digits"),
        ([item(label="x" * 201)], 30, "label: text of up to 200 characters"),
        ([item(description=5)], 30, "description: text"),
        ([item(links={"x": "javascript:alert(1)"})], 30, "links: up to 20 names"),
        ([item(links={f"l{i}": "https://x" for i in range(21)})], 30, "links: up to 20"),
        ([item(links=["https://x"])], 30, "links: an object"),
        ([item(), item()], 30, "declared twice"),
        ([1], 30, "descriptor 1: not an object"),
        ([item()], 0, "live seconds"),
        ([item()], float("nan"), "live seconds"),
        ([item()], 1e300, "live seconds"),
    ],
)
def test_a_bad_report_is_refused_with_nothing_written(
    conn: Conn, items: list[Any], live: float, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        report(conn, A, items, live)
    [[rows, declared]] = conn.execute(
        "SELECT (SELECT count(*) FROM awa.descriptors),"
        " (SELECT count(descriptors) FROM awa.runtime_instances)"
    ).fetchall()
    assert (rows, declared) == (0, 0)


def test_retention_deletes_only_what_no_live_worker_declares(conn: Conn) -> None:
    report(conn, A, [item(name="kept"), item(name="old")])
    report(conn, A, [item(name="kept")])  # a new deploy: "old" is no longer declared
    conn.execute("UPDATE awa.descriptors SET last_seen_at = now() - interval '2 days'")
    [[pruned]] = conn.execute("SELECT awa.descriptors_prune_v1(86400)").fetchall()
    assert pruned == 1 and [d.name for d in descriptors()] == ["kept"]
    for bad in ("0", "'NaN'", "-1", "NULL"):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(f"SELECT awa.descriptors_prune_v1({bad})")
    [[pruned]] = conn.execute("SELECT awa.descriptors_prune_v1('Infinity')").fetchall()
    assert pruned == 0


@pytest.mark.parametrize("live", ['"abc"', '"NaN"', "1e400", "true", "{}", "-5"])
def test_a_runtime_row_with_garbage_declarations_never_breaks_a_reader(
    conn: Conn, live: str
) -> None:
    report(conn, A, [item()])
    report(conn, B, [item()])
    conn.execute(
        "UPDATE awa.runtime_instances SET descriptors = jsonb_set(descriptors,"
        " '{live_seconds}', %s::jsonb) WHERE instance_id = %s",
        [live, A],
    )
    assert status("shop.ship").live_workers == 1  # A reads as gone; B still declares it
    assert undeclared_kinds() == []
    conn.execute("SELECT awa.descriptors_prune_v1(3600)")


def test_kinds_of_available_jobs_no_live_worker_declares_are_named(conn: Conn) -> None:
    enqueue_sql(
        conn,
        json.dumps(
            [{"kind": "shop.ship", "queue": "orders"}]
            + [{"kind": "shop.old_kind", "queue": "orders"}] * 3
            + [{"kind": "mail.send", "queue": "mail", "run_at": "2999-01-01T00:00:00Z"}]
        ),
    )
    # Raw SQL arguments with a "task" key are no django.tasks task: still flagged.
    enqueue_sql(
        conn,
        json.dumps(
            [
                {
                    "kind": "raw.kind",
                    "queue": "orders",
                    "args": {"args": [], "kwargs": {}, "task": "x"},
                }
            ]
        ),
    )
    assert undeclared_kinds() == []  # no live worker reports what it declares: no verdict
    report(conn, A, [item(name="shop.ship")])
    assert [(k.kind, k.available) for k in undeclared_kinds()] == [
        ("shop.old_kind", 3),
        ("raw.kind", 1),
    ]
