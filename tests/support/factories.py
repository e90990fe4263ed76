"""Functions that build test data: jobs enqueued through the SQL producer and moved to a given
state (running, completed, dead-lettered, scheduled), and staff users with logged-in clients.

Every job is written through a fresh autocommit connection (:func:`tests.support.database.pg`),
so the rows are committed and visible to other connections, workers and the live server: use
them in ``transactional_db`` tests (the ``clean_awa`` fixture).
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import psycopg
from django.contrib.auth.models import Permission, User
from django.test import Client

from tests.support.database import pg

__all__ = [
    "BAD_LIMITS",
    "HOSTILE",
    "TAGS",
    "WORKER",
    "claim_and_finish",
    "dead_letter",
    "enqueue_sql",
    "hostile_dead_letter",
    "staff",
    "tagged_jobs",
]

# The worker id that claims jobs on behalf of the tests.
WORKER = uuid.UUID("00000000-0000-0000-0000-00000000a0a0")

# HTML that must come out escaped wherever the admin shows a kind, an argument, an error or a tag.
HOSTILE = "<script>alert('x')</script>"
TAGS = ["billing", HOSTILE]


def enqueue_sql(conn: psycopg.Connection[Any], jobs: str) -> list[tuple[int, str]]:
    """Call awa.enqueue_v1 directly (raw-SQL producer path) with a JSON array of job requests;
    returns ``(job_id, state)`` per job."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT job_id, state FROM awa.enqueue_v1(%s::jsonb)", [jobs]
        ).fetchall()
    ]


def claim_and_finish(
    conn: psycopg.Connection[Any],
    queue: str,
    n: int,
    outcome: str,
    *,
    error: dict[str, Any] | None = None,
) -> list[int]:
    """Claim up to ``n`` jobs of ``queue`` as :data:`WORKER` and finalize them with
    ``outcome`` (``"completed"``, ``"fail"``, ...); returns the ids of the jobs claimed."""
    from awa_django.db import storage
    from awa_django.db.storage import Finalization

    claimed = storage.claim(conn, queue, n, WORKER)
    storage.finalize(
        conn,
        [Finalization(c.job_id, c.run_lease, c.claim_slot, outcome, error=error) for c in claimed],
    )
    return [c.job_id for c in claimed]


def dead_letter(
    n: int = 1, queue: str = "default", *, kind: str = "tests.jobs.common.noop", text: str = "boom"
) -> list[int]:
    """Enqueue n jobs through the SQL producer, claim them and fail them terminally (DLQ).

    ``text`` lands in the arguments and in the error's message and traceback.
    """
    body = {"kind": kind, "queue": queue, "args": {"args": [text], "kwargs": {}}}
    with pg() as conn:
        ids = [i for i, _ in enqueue_sql(conn, json.dumps([body] * n))]
        claim_and_finish(
            conn, queue, n, "fail", error={"type": "Boom", "message": text, "traceback": text}
        )
    return ids


def hostile_dead_letter(n: int = 1, queue: str = "default") -> list[int]:
    """n dead-lettered jobs whose kind, arguments and error hold :data:`HOSTILE` HTML."""
    return dead_letter(n, queue, kind=f"hostile.{HOSTILE}", text=HOSTILE)


def tagged_jobs() -> dict[str, int]:
    """One job carrying :data:`TAGS` in each place the admin reads: available, scheduled,
    running, completed (terminal history) and dead-lettered. Returns their ids by place."""
    from awa_django.db import storage

    body = {"kind": "tests.jobs.common.noop", "args": {"args": [], "kwargs": {}}, "tags": TAGS}
    with pg() as conn:
        [(running, _)] = enqueue_sql(conn, json.dumps([{**body, "queue": "run"}]))
        [claimed] = storage.claim(conn, "run", 1, WORKER)
        [(completed, _)] = enqueue_sql(conn, json.dumps([{**body, "queue": "done"}]))
        assert claim_and_finish(conn, "done", 1, "completed") == [completed]
        [(dead, _)] = enqueue_sql(conn, json.dumps([{**body, "queue": "dead"}]))
        error = {"type": "Boom", "message": "x", "traceback": "x"}
        assert claim_and_finish(conn, "dead", 1, "fail", error=error) == [dead]
        [(available, _)] = enqueue_sql(conn, json.dumps([body]))
        [(scheduled, _)] = enqueue_sql(conn, json.dumps([{**body, "delay": 3600}]))
    assert claimed.job_id == running
    return {
        "available": available,
        "scheduled": scheduled,
        "running": running,
        "completed": completed,
        "dead": dead,
    }


def staff(*perms: str, view: bool = True) -> Client:
    """A logged-in staff client with the awa_django ``view_*`` permissions (unless ``view`` is
    false) and the custom permissions ``perms``."""
    user = User.objects.create_user(f"u{User.objects.count()}", password="x", is_staff=True)
    wanted = Permission.objects.filter(content_type__app_label="awa_django", codename__in=perms)
    if view:
        wanted |= Permission.objects.filter(
            content_type__app_label="awa_django", codename__startswith="view_"
        )
    user.user_permissions.add(*wanted)
    client = Client()
    client.force_login(user)
    return client


#: Flow limits that every surface refuses, with (the start of) the error it gives.
BAD_LIMITS: list[tuple[dict[str, Any], str]] = [
    ({}, "limits: give a global_concurrency, a rate_limit, or both"),
    ({"global_concurrency": 0}, "global_concurrency: 0 is not an integer in 1..10000"),
    ({"global_concurrency": -1}, "global_concurrency: -1 is not an integer in 1..10000"),
    ({"global_concurrency": 10_001}, "global_concurrency: 10001 is not an integer"),
    ({"global_concurrency": True}, "global_concurrency: True is not an integer"),
    ({"global_concurrency": 2.0}, "global_concurrency: 2.0 is not an integer"),
    ({"global_concurrency": "5"}, "global_concurrency: '5' is not an integer"),
    ({"global_concurrency": 2**200}, "global_concurrency: an integer of 201 bits is not"),
    ({"rate_limit": math.nan}, "rate_limit: nan is not a number of jobs per second"),
    ({"rate_limit": math.inf}, "rate_limit: inf is not a number of jobs per second"),
    ({"rate_limit": -math.inf}, "rate_limit: -inf is not"),
    ({"rate_limit": 0}, "rate_limit: 0 is not a number of jobs per second from 0.001"),
    ({"rate_limit": 0.0}, "rate_limit: 0.0 is not"),
    ({"rate_limit": -1}, "rate_limit: -1 is not"),
    ({"rate_limit": 1e300}, "rate_limit: 1e+300 is not"),
    ({"rate_limit": 10**400}, "rate_limit: an integer of 1329 bits is not"),
    ({"rate_limit": 1_000_001}, "to 1,000,000"),
    ({"rate_limit": 1e-300}, "rate_limit: 1e-300 is not a number of jobs per second from 0.001"),
    ({"rate_limit": 5e-324}, "rate_limit: 5e-324 is not"),
    ({"rate_limit": True}, "rate_limit: True is not"),
    ({"rate_limit": "50"}, "rate_limit: '50' is not"),
    ({"rate_limit": 5, "rate_burst": 0}, "rate_burst: 0 is not an integer in 1..1000000"),
    ({"rate_limit": 5, "rate_burst": True}, "rate_burst: True is not an integer"),
    ({"rate_limit": 5, "rate_burst": 2.5}, "rate_burst: 2.5 is not an integer"),
    ({"rate_limit": 5, "rate_burst": 10**7}, "rate_burst: 10000000 is not an integer"),
    ({"rate_burst": 5}, "rate_burst: a burst needs a rate_limit"),
    ({"global_concurrency": 3, "rate_burst": 5}, "rate_burst: a burst needs a rate_limit"),
]
