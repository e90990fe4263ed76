"""The admin's "Queues and job kinds" page (docs/descriptors.md): declared queues and kinds
with their status (live, stale, drift), links that are only ever http(s), and a warning for
each kind of available jobs that no live worker declares."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.db import connection

from awa_django import enqueue
from tests.support.factories import HOSTILE, staff

pytestmark = pytest.mark.django_db

URL = "/admin/awa_django/descriptor/"


def declare(instance: uuid.UUID, items: list[dict[str, Any]]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT awa.runtime_upsert_v1(%s, 'h', 1, '{}', 1, 't')", [instance])
        cursor.execute(
            "SELECT awa.descriptors_report_v1(%s, 30, %s::jsonb)", [instance, json.dumps(items)]
        )


def test_the_page_shows_what_each_is_for_and_whether_workers_agree() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    ship = {"what": "kind", "name": "tests.jobs.common.noop", "owner": HOSTILE}
    quiet = {"what": "queue", "name": "quiet", "hash": "3" * 64, "label": "Quiet"}
    declare(b, [{**ship, "hash": "2" * 64}, quiet])
    links = {"runbook": "https://wiki.example/?a=1&b"}
    declare(a, [{**ship, "hash": "1" * 64, "links": links, "description": HOSTILE}])
    with connection.cursor() as cursor:  # a row no function would write: a script's link
        cursor.execute(
            "UPDATE awa.descriptors SET links = %s WHERE name = 'quiet'",
            [json.dumps({"evil": "javascript:alert(1)", "ok": "http://x.example"})],
        )
        cursor.execute(
            "UPDATE awa.runtime_instances SET descriptors = NULL WHERE instance_id = %s", [b]
        )
    enqueue("tests.renamed", args=[1])  # a kind no live worker declares
    page = staff().get(URL).content.decode()
    assert "drift:" not in page  # b is gone: a alone declares the kind
    assert HOSTILE not in page and "&lt;script&gt;" in page
    assert 'href="https://wiki.example/?a=1&amp;b"' in page
    assert "javascript:" not in page and 'href="http://x.example"' in page
    assert "stale: no live worker declares it" in page  # the queue: b's report is gone
    assert "No worker serves tests.renamed; 1 available." in page
    detail = staff().get(f"{URL}kind:tests.jobs.common.noop/change/")
    assert detail.status_code == 200 and b"runbook" in detail.content
    declare(b, [{**ship, "hash": "2" * 64}, quiet])  # b is back, with other code
    page = staff().get(URL).content.decode()
    assert "drift: live workers hold 2 different declarations" in page


def test_without_the_view_permission_the_page_is_refused() -> None:
    assert staff(view=False).get(URL).status_code == 403


def test_odd_rows_and_urls_never_break_the_page() -> None:
    declare(uuid.uuid4(), [{"what": "queue", "name": "odd", "hash": "4" * 64}])
    with connection.cursor() as cursor:  # rows no function would write
        cursor.execute("UPDATE awa.descriptors SET links = '\"https://x\"'")
    client = staff()
    assert client.get(URL).status_code == 200
    for key in ("%00", "kind%3Aa%00b", "x" * 400):
        assert client.get(f"{URL}{key}/change/").status_code == 302
    with connection.cursor() as cursor:  # kinds no live worker declares: ten, then a count
        cursor.execute(
            "SELECT awa.enqueue_v1(%s::jsonb)",
            [json.dumps([{"kind": f"old.kind{n}", "queue": "odd"} for n in range(12)])],
        )
    page = client.get(URL).content.decode()
    assert page.count("No worker serves old.kind") == 10
    assert "... and 2 more kinds no worker serves" in page
