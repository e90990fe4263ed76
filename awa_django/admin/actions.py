"""Operator actions in the admin: confirmation page, atomic execution, audit log.

Every action goes through :func:`confirm`: the first POST (from the list) shows a confirmation
page naming what was selected; the second POST (from that page) runs the action on the
confirmed rows, in one transaction with one admin ``LogEntry`` per row it changed.

The confirmation page carries the selection in **one** form field (the primary keys,
comma-separated, at most ``BULK_LIMIT``: awa_django/admin/selection.py), plus ``select_across``
so that Django hands the action the list's filtered queryset (its filters travel in the page's
URL), which is then narrowed to those keys. It posts about eight fields whatever the selection,
so confirming 1,000 jobs works under Django's default ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` (1,000),
which a hidden field per job would exceed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.db import connections, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from awa_django.admin.base import ReadOnlyAdmin
from awa_django.admin.read_alias import admin_read_alias
from awa_django.admin.selection import BULK_LIMIT, SELECTION_FIELD, parse_selection
from awa_django.conf import awa_settings
from awa_django.exceptions import AwaError
from awa_django.sql import query
from awa_django.telemetry.logs import one_line

__all__ = ["admin_actor", "confirm", "log_change", "run_atomically"]

T = TypeVar("T")

#: How many selected rows the confirmation page names (the rest are counted).
SHOWN = 50


def admin_actor(request: HttpRequest) -> str:
    """Who an admin change is recorded as: ``admin (<username>)``, on one line (control
    characters escaped, as operator actors must have none) and at most 255 characters."""
    return f"admin ({one_line(request.user.get_username())})"[:255]


def log_change(request: HttpRequest, objects: Sequence[Any], message: str) -> None:
    """One admin ``LogEntry`` (a change) per object, by the requesting user."""
    user_id = request.user.pk
    if user_id is None:  # actions need a logged-in staff user
        raise PermissionDenied
    if objects:
        LogEntry.objects.log_actions(
            user_id=user_id, queryset=objects, action_flag=CHANGE, change_message=message
        )


def run_atomically(perform: Callable[[], T]) -> T:
    """Run ``perform`` in one transaction on awa_django's database alias and on ``default``
    (where ``LogEntry`` lives): the action and its log entries commit together, or not at all.

    When this opens the transaction, it runs at READ COMMITTED (cancel and drain need it),
    whatever the alias's default. Inside a transaction the request already holds
    (``ATOMIC_REQUESTS``), the operations check its level themselves.
    """
    alias = awa_settings.DATABASE_ALIAS
    connection = connections[alias]
    outermost = not connection.in_atomic_block and connection.get_autocommit()
    with transaction.atomic(using=alias):
        if outermost:
            with connection.cursor() as cursor:
                cursor.execute(query("read_committed"))
        with transaction.atomic():
            return perform()


def _ticked(request: HttpRequest, modeladmin: ReadOnlyAdmin) -> list[Any]:
    """The keys of the rows ticked on the list (none for "select all"); already checked by
    ``ReadOnlyAdmin.changelist_view``."""
    if request.POST.get("select_across") == "1":
        return []
    ticked = []
    for text in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
        with contextlib.suppress(ValueError, AwaError):
            ticked.append(modeladmin.selection_key(text))
    return ticked


def confirm(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    title: str,
    form_class: type[forms.Form] | None,
    perform: Callable[[list[Any], dict[str, Any]], str],
    note: str = "",
    describe: Callable[[Any], str] = str,
    batched: bool = False,
    initial: Callable[[list[Any]], dict[str, Any]] | None = None,
) -> HttpResponse | None:
    """Show a confirmation page (with ``form_class``), then run ``perform`` on confirmation.

    The rows are read on ``AWA["DATABASE_ALIAS"]`` (the primary), also when the list reads
    from a replica: a selected row the primary no longer has is left out, and the user is told
    so (nothing is changed when none is left).

    ``perform(objects, cleaned_data)`` runs in :func:`run_atomically` and returns the message
    shown to the user; it logs what it changed with :func:`log_change`. ``note`` says on the
    page what the action will do; ``describe`` names each selected row. ``batched``: the action
    commits in short batches of its own, each with its log entries (a drain of a large queue
    must not hold its lanes for the whole run), so ``perform`` is not wrapped in one transaction.
    ``initial(objects)`` fills the form on the confirmation page (the settings in force now).
    """
    confirming = "confirm" in request.POST
    if confirming:
        keys = parse_selection(request.POST.get(SELECTION_FIELD, ""), modeladmin.selection_key)
        if keys is None:
            modeladmin.message_user(
                request, "The selection was not understood; nothing was changed.", messages.ERROR
            )
            return None
        queryset = queryset.filter(pk__in=keys)
    else:
        keys = _ticked(request, modeladmin)
    objects = _rows_on_the_primary(modeladmin, request, queryset, keys, confirming=confirming)
    if objects is None:
        return None
    if form_class is None:
        form = None
    elif confirming:
        form = form_class(request.POST)
    else:
        form = form_class(initial=initial(objects) if initial else None)
    if confirming and (form is None or form.is_valid()):
        data = form.cleaned_data if form else {}
        _perform(modeladmin, request, lambda: perform(objects, data), batched=batched)
        return None
    return _confirmation_page(
        modeladmin, request, objects, title=title, note=note, form=form, describe=describe
    )


def _rows_on_the_primary(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    keys: list[Any],
    *,
    confirming: bool,
) -> list[Any] | None:
    """The selected rows as the primary has them now, or None (the user is told why) when
    there are more than :data:`BULK_LIMIT` or none is left. When the list reads from a replica,
    the user is warned of selected rows the primary no longer has (``keys``: the rows ticked
    or confirmed), or, for "select all", of a primary that matches other rows than the list
    showed."""
    # The list may read from a replica (AWA["READ_DATABASE_ALIAS"]): the rows are read again
    # where the action runs, so it names and acts on them as the primary has them now.
    primary = awa_settings.DATABASE_ALIAS
    objects = list(queryset.using(primary)[: BULK_LIMIT + 1])
    noun = modeladmin.selection_noun
    read = admin_read_alias()
    replica = read != primary
    lagging = (
        f" (this list reads from the replica {read!r}, which may lag behind the primary)"
        if replica
        else ""
    )
    if len(objects) > BULK_LIMIT:
        modeladmin.message_user(
            request,
            f"Select at most {BULK_LIMIT} {noun} at a time (narrow the list with its filters); "
            "nothing was changed.",
            messages.ERROR,
        )
        return None
    if not objects:
        modeladmin.message_user(
            request,
            f"None of the selected {noun} is left{lagging}; nothing was changed.",
            messages.WARNING,
        )
        return None
    if replica and keys:
        gone = len(set(keys) - {o.pk for o in objects})
        if gone:
            modeladmin.message_user(
                request,
                f"{gone} of the selected {noun} no longer exist on the primary{lagging}; "
                "they are left out.",
                messages.WARNING,
            )
    elif replica and not confirming:
        # "Select all" of a (filtered) list: what matches on the primary now may differ from
        # what the list showed. The confirmation page names the primary's rows; say so.
        shown = len(queryset.using(read).values_list("pk", flat=True)[: BULK_LIMIT + 1])
        if shown != len(objects):
            modeladmin.message_user(
                request,
                f"The list showed {shown} {noun}{lagging}; {len(objects)} match on the primary "
                "now, and those are the ones named below.",
                messages.WARNING,
            )
    return objects


def _perform(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, run: Callable[[], str], *, batched: bool
) -> None:
    """Run a confirmed action (in :func:`run_atomically` unless ``batched``) and tell the user
    what it did, or that an ``AwaError`` it raised changed nothing."""
    try:
        text = run() if batched else run_atomically(run)
    except AwaError as exc:
        modeladmin.message_user(request, f"{exc} Nothing was changed.", messages.ERROR)
        return
    modeladmin.message_user(request, text, messages.SUCCESS)


def _confirmation_page(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    objects: list[Any],
    *,
    title: str,
    note: str,
    form: forms.Form | None,
    describe: Callable[[Any], str],
) -> TemplateResponse:
    """The page that names the selected rows (the first :data:`SHOWN`) and asks to confirm;
    it carries their keys in one field (:data:`SELECTION_FIELD`)."""
    keys = [str(o.pk) for o in objects]
    return TemplateResponse(
        request,
        "admin/awa_django/confirm_action.html",
        {
            **modeladmin.admin_site.each_context(request),
            "title": title,
            "note": note,
            "noun": modeladmin.selection_noun,
            "count": len(objects),
            "lines": [describe(o) for o in objects[:SHOWN]],
            "more": max(len(objects) - SHOWN, 0),
            "form": form,
            "action": request.POST.get("action", ""),
            "opts": modeladmin.model._meta,
            "first": keys[0],
            "selection": ",".join(keys),
            "selection_field": SELECTION_FIELD,
        },
    )
