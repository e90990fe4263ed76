"""Actions on everything a filtered list matches, past :data:`BULK_LIMIT` rows: "Select all"
on a filtered DLQ of 200,000 jobs, then Retry.

The confirmation page counts the matching rows (as the primary has them) and names the first
few. Confirmed, the action works through them in primary-key order, :data:`BATCH` rows per
transaction, each batch committed with its ``LogEntry`` rows, for at most :data:`BUDGET`
seconds per request; then a progress page (how many so far) posts the next request itself,
carrying where it got to, until no matching row is left. A row that the action leaves in place
(a unique job whose key another job holds) is passed over, never retried in a loop; rows that
start to match meanwhile with a lower key are left for another run.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from awa_django.admin.actions import SHOWN, confirm, run_atomically
from awa_django.admin.base import ReadOnlyAdmin
from awa_django.admin.selection import BULK_LIMIT, SELECTION_FIELD
from awa_django.conf import awa_settings
from awa_django.exceptions import AwaError
from awa_django.sql import query

__all__ = ["BATCH", "BUDGET", "COUNT_CAP", "confirm_matching", "confirm_rows", "matching_all"]

#: Rows per transaction.
BATCH = BULK_LIMIT
#: Seconds of work per request before the progress page takes over (a proxy's or gunicorn's
#: 30 s timeout never ends a request halfway).
BUDGET = 8.0
#: The form field carrying the last key worked through (empty: from the start).
AFTER_FIELD = "awa_after"
#: The form fields carrying the counts so far.
DONE_FIELD, LEFT_FIELD = "awa_done", "awa_left"
#: The form fields bounding a run to the rows that matched when it was confirmed: the highest
#: key then, and the database's clock then (for a list whose ``arrived_field`` names when a row
#: joined it, such as ``dlq_at``).
UPTO_FIELD, BEFORE_FIELD = "awa_upto", "awa_before"
#: The form field carrying the list's filters the confirmation counted under: a run posted to
#: another list (other filters in the URL) changes nothing.
QUERY_FIELD = "awa_filters"
#: The confirmation counts the matching rows up to this many, then says "more than" (a count of
#: millions of rows of history would take longer than the work it announces).
COUNT_CAP = 100_000


def matching_all(request: HttpRequest, queryset: QuerySet[Any]) -> bool:
    """Whether this action acts on everything the filtered list matches, in batches: "Select
    all" with more than :data:`BULK_LIMIT` matching rows, or a run under way."""
    if request.POST.get("select_across") != "1" or SELECTION_FIELD in request.POST:
        return False
    if AFTER_FIELD in request.POST:
        return True
    primary = awa_settings.DATABASE_ALIAS
    return len(queryset.using(primary).values_list("pk", flat=True)[: BULK_LIMIT + 1]) > BULK_LIMIT


def _database_now(alias: str) -> str:
    with connections[alias].cursor() as cursor:
        cursor.execute(query("database_now"))
        row = cursor.fetchone()
    assert row is not None
    return str(row[0].isoformat())


def _filters(request: HttpRequest) -> str:
    """The list's filters and search, as the URL carries them, in one order."""
    return json.dumps(sorted((key, request.GET.getlist(key)) for key in request.GET))


def _bounds_fields(request: HttpRequest, upto: str, before: str) -> dict[str, str]:
    return {
        "upto_field": UPTO_FIELD,
        "upto": upto,
        "before_field": BEFORE_FIELD,
        "before": before,
        "query_field": QUERY_FIELD,
        "query": _filters(request),
    }


def _count(request: HttpRequest, name: str) -> int | None:
    """A count carried by the progress page: digits, at most 11 of them; None otherwise."""
    text = request.POST.get(name, "0")
    return int(text) if text.isascii() and text.isdigit() and len(text) < 12 else None


def confirm_matching(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    title: str,
    note: str,
    form_class: type[forms.Form] | None,
    batch: Callable[[list[Any], dict[str, Any]], tuple[int, int]],
    verb: str,
    left_why: str = "",
) -> HttpResponse | None:
    """Confirm, then run ``batch(objects, cleaned_data)`` on every matching row, batch by
    batch; it returns ``(changed, left in place)`` and logs what it changed. ``verb`` names
    what was done ("retried"); ``left_why`` why a row was left in place."""
    primary = awa_settings.DATABASE_ALIAS
    matching = queryset.using(primary).order_by("pk")
    noun = modeladmin.selection_noun
    form = form_class(request.POST if "confirm" in request.POST else None) if form_class else None
    if "confirm" not in request.POST or (form is not None and not form.is_valid()):
        last = matching.order_by("-pk").values_list("pk", flat=True).first()
        return _page(
            modeladmin,
            request,
            "admin/awa_django/confirm_matching.html",
            title=title,
            note=note,
            form=form,
            count=(n := matching[: COUNT_CAP + 1].count()),
            lines=[str(o) for o in matching[:SHOWN]],
            extra={
                "first": request.POST.get("_selected_action", ""),
                # A count of millions of rows of history would take longer than the work.
                "count_text": f"more than {COUNT_CAP:,}" if n > COUNT_CAP else f"{n:,}",
                "capped": n > COUNT_CAP,
                **_bounds_fields(
                    request, "" if last is None else str(last), _database_now(primary)
                ),
            },
        )
    data = form.cleaned_data if form is not None else {}
    after_text = request.POST.get(AFTER_FIELD, "")
    after: Any = None
    done, left = _count(request, DONE_FIELD), _count(request, LEFT_FIELD)
    upto_text, before_text = request.POST.get(UPTO_FIELD), request.POST.get(BEFORE_FIELD, "")
    try:
        if after_text:
            after = modeladmin.selection_key(after_text)
        if done is None or left is None:
            raise ValueError("a count")
        # The rows that matched at the confirmation, and only those: none when none did.
        if upto_text is None:
            raise ValueError("no bound")
        matching = (
            matching.filter(pk__lte=modeladmin.selection_key(upto_text))
            if upto_text
            else matching.none()
        )
        if not (before_text.isascii() and before_text.isprintable()):
            raise ValueError("a time that is not one")
        before = datetime.fromisoformat(before_text)
        if before.tzinfo is None:
            raise ValueError("a time without its zone")
        matching = modeladmin.arrived_by(matching, before)
        if request.POST.get(QUERY_FIELD) != _filters(request):
            raise ValueError("another list's confirmation")
    except (ValueError, AwaError):
        modeladmin.message_user(
            request, "The run was not understood; nothing more was changed.", messages.ERROR
        )
        return None
    deadline = time.monotonic() + BUDGET
    while True:
        objects = list((matching if after is None else matching.filter(pk__gt=after))[:BATCH])
        if not objects:
            text = f"{title}: {verb} {done:,} {noun}"
            if left:
                text += f"; {left:,} left in place ({left_why or 'changed meanwhile'})"
            modeladmin.message_user(request, text + ".", messages.SUCCESS)
            return None
        try:
            changed, kept = run_atomically(functools.partial(batch, objects, data))
        except AwaError as exc:
            modeladmin.message_user(
                request,
                f"{title}: {exc} Stopped after {done:,} {noun}; the batch that failed changed "
                "nothing.",
                messages.ERROR,
            )
            return None
        done, left, after = done + changed, left + kept, objects[-1].pk
        if time.monotonic() >= deadline:
            return _page(
                modeladmin,
                request,
                "admin/awa_django/bulk_progress.html",
                title=title,
                note=note,
                form=form,
                count=done,
                lines=[],
                extra={
                    "first": str(after),  # Django posts an action only with a row named
                    **_bounds_fields(request, upto_text, before_text),
                    "after": str(after),
                    "done": done,
                    "left": left,
                    "verb": verb,
                    "after_field": AFTER_FIELD,
                    "done_field": DONE_FIELD,
                    "left_field": LEFT_FIELD,
                },
            )


def confirm_rows(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    title: str,
    note: str,
    form_class: type[forms.Form] | None,
    act: Callable[[list[Any], dict[str, Any], str | None], tuple[int, int]],
    said: Callable[[int, int], str],
    verb: str,
    left_why: str = "",
    whole_run: str = "",
) -> HttpResponse | None:
    """An action that works on the selected rows (:func:`confirm`, at most
    :data:`BULK_LIMIT`) or on everything the filtered list matches (:func:`confirm_matching`).
    ``act(objects, data, note)`` changes and logs them (``note``: the log entries' remark for
    a run over everything matching, None otherwise) and returns ``(changed, left in place)``;
    ``said(changed, left)`` is the message of a selection's run."""
    if matching_all(request, queryset):
        return confirm_matching(
            modeladmin,
            request,
            queryset,
            title=title,
            note=note,
            form_class=form_class,
            batch=lambda objects, data: act(objects, data, whole_run),
            verb=verb,
            left_why=left_why,
        )
    return confirm(
        modeladmin,
        request,
        queryset,
        title=title,
        note=note,
        form_class=form_class,
        perform=lambda objects, data: said(*act(objects, data, None)),
    )


def _page(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    template: str,
    *,
    title: str,
    note: str,
    form: forms.Form | None,
    count: int,
    lines: list[str],
    extra: dict[str, Any] | None = None,
) -> TemplateResponse:
    return TemplateResponse(
        request,
        template,
        {
            **modeladmin.admin_site.each_context(request),
            "title": title,
            "note": note,
            "noun": modeladmin.selection_noun,
            "count": count,
            "lines": lines,
            "more": max(count - len(lines), 0),
            "form": form,
            "action": request.POST.get("action", ""),
            "opts": modeladmin.model._meta,
            "batch": BATCH,
            **(extra or {}),
        },
    )
