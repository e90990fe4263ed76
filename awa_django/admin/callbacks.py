"""The admin's page of callback waits: jobs parked until their callback is resolved.

Lists ``awa.callback_waits`` (soonest timeout first, with the time left on the database clock)
and lets a user with ``awa_django.resolve_callback`` resolve, fail or extend selected waits. The
actions go through :func:`awa_django.admin.actions.confirm` like every other action (a
confirmation page, at most ``BULK_LIMIT`` rows, one transaction with one ``LogEntry`` per job
changed) and call the operator API (``resolve_callback``, ``extend_callback``), so they are
fenced by the attempt exactly like a resolution from the external system: a wait resolved,
rescued or cancelled meanwhile is left alone and counted in the message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse

from awa_django.admin.actions import confirm, log_change
from awa_django.admin.base import JobListAdmin
from awa_django.admin.display import pretty
from awa_django.admin.filters import KindFilter, QueueFilter
from awa_django.admin.forms import ExtendForm, FailForm, ResolveForm
from awa_django.models import CallbackWait
from awa_django.operator.actions import extend_callback, resolve_callback

__all__ = ["CallbackWaitAdmin"]


def _left(seconds: float) -> str:
    if seconds <= 0:
        return "timed out (rescue pending)"
    whole = int(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


class CallbackWaitAdmin(JobListAdmin):
    list_display = (
        "job_id",
        "kind",
        "queue",
        "attempt",
        "parked_at",
        "timeout_at",
        "time_left",
        "mode",
        "callback_id",
    )
    list_filter = (QueueFilter, KindFilter)
    sortable_by = ("job_id", "timeout_at", "parked_at")
    readonly_fields = (
        "job_id",
        "kind",
        "queue",
        "priority",
        "attempt",
        "max_attempts",
        "run_lease",
        "callback_id",
        "mode",
        "created_at",
        "parked_at",
        "timeout_at",
        "time_left",
        "pretty_metadata",
        "pretty_progress",
    )
    fields = readonly_fields
    actions = ("resolve_jobs", "fail_jobs", "extend_jobs")
    selection_noun = "waiting jobs"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The database clock, for the time left (never the web server's).
        queryset: QuerySet[Any] = super().get_queryset(request).annotate(db_now=Now())
        return queryset

    @admin.display(description="time left")
    def time_left(self, obj: CallbackWait) -> str:
        now = getattr(obj, "db_now", None)
        if now is None:
            return "?"
        return _left((obj.timeout_at - now).total_seconds())

    @admin.display(description="a result")
    def mode(self, obj: CallbackWait) -> str:
        return "resumes the job" if obj.resume else "completes the job"

    @admin.display(description="metadata")
    def pretty_metadata(self, obj: CallbackWait) -> str:
        return pretty(obj.metadata)

    @admin.display(description="progress")
    def pretty_progress(self, obj: CallbackWait) -> str:
        return pretty(obj.progress)

    def _describe(self, obj: CallbackWait) -> str:
        return f"job {obj.job_id} ({obj.kind}), callback {obj.callback_id}"

    def _waits(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        *,
        title: str,
        note: str,
        form_class: type[forms.Form],
        act: Callable[[CallbackWait, dict[str, Any]], str],
        done: str,
    ) -> HttpResponse | None:
        self._checked(request, "resolve_callback")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            changed = []
            for wait in sorted(objects, key=lambda o: int(o.job_id)):  # one lock order for all
                if act(wait, data) in ("resolved", "extended"):
                    changed.append(wait)
                    log_change(request, [wait], f"{done} (callback {wait.callback_id})")
            left = len(objects) - len(changed)
            text = f"{title}: {len(changed)} job(s) {done}."
            if left:
                text += (
                    f" {left} no longer waited (resolved, timed out or cancelled meanwhile) "
                    "and were left alone."
                )
            return text

        return confirm(
            self,
            request,
            queryset,
            title=title,
            note=note,
            form_class=form_class,
            perform=perform,
            describe=self._describe,
        )

    @admin.action(description="Resolve selected waits with a result", permissions=["resolve"])
    def resolve_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        def act(wait: CallbackWait, data: dict[str, Any]) -> str:
            return resolve_callback(wait.callback_id, result=json.loads(data["result"]))

        return self._waits(
            request,
            queryset,
            title="Resolve callback waits",
            note=(
                "Each job completes with this result, or, when its handler asked to be resumed, "
                "runs again with it (as if the external system had sent it)."
            ),
            form_class=ResolveForm,
            act=act,
            done="resolved with a result",
        )

    @admin.action(description="Fail selected waits with an error", permissions=["resolve"])
    def fail_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        def act(wait: CallbackWait, data: dict[str, Any]) -> str:
            return resolve_callback(
                wait.callback_id, error=data["error"], terminal=bool(data["terminal"])
            )

        return self._waits(
            request,
            queryset,
            title="Fail callback waits",
            note=(
                "Each attempt fails with this error: retried with backoff like a raised "
                "exception, or failed at once (to the DLQ when the queue has it on) when ticked."
            ),
            form_class=FailForm,
            act=act,
            done="failed with an error",
        )

    @admin.action(description="Extend selected waits", permissions=["resolve"])
    def extend_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        def act(wait: CallbackWait, data: dict[str, Any]) -> str:
            return extend_callback(wait.callback_id, timedelta(seconds=data["seconds"]))

        return self._waits(
            request,
            queryset,
            title="Extend callback waits",
            note="Each wait times out this long from now, unless it already times out later.",
            form_class=ExtendForm,
            act=act,
            done="extended",
        )

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.resolve_callback"))
