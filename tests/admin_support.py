"""Helpers for the admin tests: staff clients, jobs in every plane, and actions driven through
the confirmation page exactly as a browser posts it."""

from __future__ import annotations

import html
import json
import re
from typing import Any

from django.contrib.auth.models import Permission, User
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests import storage_support
from tests.storage_support import WORKER, enqueue_sql, pg

HOSTILE = "<script>alert('x')</script>"
TAGS = ["billing", HOSTILE]

_INPUT = re.compile(r"<input\b[^>]*>")
_ATTR = re.compile(r'(\w[\w-]*)="([^"]*)"')


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


def dead_letter(n: int = 1, queue: str = "default") -> list[int]:
    """n dead-lettered jobs whose kind, arguments and error hold hostile HTML."""
    return storage_support.dead_letter(n, queue, kind=f"hostile.{HOSTILE}", text=HOSTILE)


def tagged_jobs() -> dict[str, int]:
    """One job carrying ``TAGS`` in each place the admin reads: available, scheduled, running,
    completed (terminal history) and dead-lettered. Returns their ids by place."""
    body = {"kind": "tests.testjobs.noop", "args": {"args": [], "kwargs": {}}, "tags": TAGS}
    with pg() as conn:
        [(running, _)] = enqueue_sql(conn, json.dumps([{**body, "queue": "run"}]))
        [claimed] = storage.claim(conn, "run", 1, WORKER)
        [(completed, _)] = enqueue_sql(conn, json.dumps([{**body, "queue": "done"}]))
        [c] = storage.claim(conn, "done", 1, WORKER)
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
        [(dead, _)] = enqueue_sql(conn, json.dumps([{**body, "queue": "dead"}]))
        [d] = storage.claim(conn, "dead", 1, WORKER)
        storage.finalize(
            conn,
            [
                Finalization(
                    d.job_id,
                    d.run_lease,
                    d.claim_slot,
                    "fail",
                    error={"type": "Boom", "message": "x", "traceback": "x"},
                )
            ],
        )
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


def changelist(model: str) -> str:
    return reverse(f"admin:awa_django_{model}_changelist")


def post_action(
    client: Client, model: str, name: str, ids: list[Any], query: str = "", **extra: Any
) -> Any:
    """The list's action form, as posted with rows ticked (or ``select_across=1`` in extra)."""
    return client.post(
        changelist(model) + query,
        {"action": name, "index": "0", "_selected_action": [str(i) for i in ids], **extra},
    )


def form_fields(response: HttpResponse) -> dict[str, str]:
    """The named inputs of a page, as a browser would post them (text inputs left empty)."""
    fields: dict[str, str] = {}
    for tag in _INPUT.findall(response.content.decode()):
        attrs = {k: html.unescape(v) for k, v in _ATTR.findall(tag)}
        if "name" in attrs and attrs.get("type") != "submit":
            fields[attrs["name"]] = attrs.get("value", "")
    return fields


def confirmed(
    client: Client, model: str, name: str, ids: list[Any], query: str = "", **form: Any
) -> tuple[Any, Any]:
    """Run an action end to end: tick ``ids``, get the confirmation page, post it back with
    ``form`` filled in. Returns (confirmation page, final response)."""
    page = post_action(client, model, name, ids, query)
    assert page.status_code == 200, page
    done = client.post(changelist(model) + query, {**form_fields(page), **form})
    return page, done


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.wsgi_request._messages]
