"""Helpers for the admin tests: actions driven through the confirmation page exactly as a
browser posts it, and the messages a page shows.

Staff clients and jobs in every plane are built by tests/support/factories.py.
"""

from __future__ import annotations

import html
import re
from typing import Any

from django.http import HttpResponse
from django.test import Client
from django.urls import reverse

__all__ = [
    "buttons",
    "changelist",
    "confirmed",
    "form_fields",
    "messages_of",
    "post_action",
    "press",
]

_INPUT = re.compile(r"<input\b[^>]*>")
_ATTR = re.compile(r'(\w[\w-]*)="([^"]*)"')


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


_FORM = re.compile(
    r'<form method="post" action="([^"]*)" class="awa-object-action">(.*?)</form>', re.S
)
_BUTTON = re.compile(r'<button type="submit" name="action" value="([^"]*)" class="button">([^<]*)<')


def buttons(page: HttpResponse) -> dict[str, tuple[str, dict[str, str], str]]:
    """The action buttons of a detail page: action name → (form URL, hidden fields, label)."""
    found = {}
    for url, body in _FORM.findall(page.content.decode()):
        [(name, label)] = _BUTTON.findall(body)
        hidden = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', body))
        hidden.pop("action", None)
        found[name] = (html.unescape(url), hidden, html.unescape(label))
    return found


def press(client: Client, page: Any, name: str, **form: str) -> tuple[Any, Any]:
    """Press a detail page's button, then confirm on the page it leads to."""
    url, hidden, _ = buttons(page)[name]
    confirmation = client.post(url, {**hidden, "action": name})
    assert confirmation.status_code == 200, confirmation
    done = client.post(url, {**form_fields(confirmation), **form})
    return confirmation, done
