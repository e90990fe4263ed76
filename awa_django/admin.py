"""The Django admin: read-only views of the queue, with permission-gated operator actions.

Lists never count whole tables (``show_full_result_count = False`` and a capped paginator);
every value from job data is escaped. Actions call the same services as the management
commands, need custom permissions, confirm bulk use on a separate page, act on at most
``BULK_LIMIT`` jobs, and record an admin ``LogEntry`` naming the job ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join

from awa_django import operations, services
from awa_django.conf import awa_settings
from awa_django.exceptions import ValidationError
from awa_django.models import DeadLetter, Job, QueueStat, TerminalJob, Worker

BULK_LIMIT = 1000


class CappedPaginator(Paginator):  # type: ignore[type-arg]
    """Counts at most ``CAP + 1`` rows: a queue's history can be millions of rows."""

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        return len(self.object_list[: self.CAP + 1].values_list("pk", flat=True))  # type: ignore[attr-defined]


def pretty(value: Any) -> str:
    """JSON as an escaped <pre> block."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html("<pre style='white-space: pre-wrap'>{}</pre>", text)


def error_timeline(errors: Any) -> str:
    if not errors:
        return "-"
    return format_html(
        "<ol>{}</ol>",
        format_html_join(
            "",
            "<li><b>attempt {}</b> at {}: {}: {}<pre style='white-space: pre-wrap'>{}</pre></li>",
            (
                (
                    e.get("attempt", "?"),
                    e.get("at", "?"),
                    e.get("type", "-"),
                    e.get("message", ""),
                    e.get("traceback", ""),
                )
                for e in errors
                if isinstance(e, dict)
            ),
        ),
    )


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """No add, change or delete (so no "delete selected" either); view only, plus explicit
    actions."""

    show_full_result_count = False
    paginator = CappedPaginator
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return queryset.filter(kind__icontains=term), False

    def _log(self, request: HttpRequest, objects: Sequence[Any], message: str) -> None:
        user_id = request.user.pk
        if user_id is None:  # actions need a logged-in staff user
            raise PermissionDenied
        LogEntry.objects.log_actions(
            user_id=user_id,
            queryset=objects,
            action_flag=CHANGE,
            change_message=message,
        )

    def _checked(self, request: HttpRequest, perm: str) -> None:
        # The action list already hides actions without permission; a forged POST is refused.
        if not request.user.has_perm(f"awa_django.{perm}"):
            raise PermissionDenied


class JobDetail:
    """Pretty-printed read-only fields shared by the job admins."""

    @admin.display(description="arguments")
    def pretty_args(self, obj: Any) -> str:
        return pretty(obj.args)

    @admin.display(description="metadata")
    def pretty_metadata(self, obj: Any) -> str:
        return pretty(obj.metadata)

    @admin.display(description="result")
    def pretty_result(self, obj: Any) -> str:
        return pretty(obj.result)

    @admin.display(description="progress")
    def pretty_progress(self, obj: Any) -> str:
        return pretty(obj.progress)

    @admin.display(description="errors, one per failed attempt")
    def error_timeline(self, obj: Any) -> str:
        return error_timeline(obj.errors)


def confirm(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    title: str,
    form_class: type[forms.Form] | None,
    perform: Callable[[list[Any], dict[str, Any]], str],
) -> HttpResponse | None:
    """Show a confirmation page (with ``form_class``), then run ``perform`` on confirmation.

    ``perform`` runs in one transaction: the action on every selected job and its ``LogEntry``
    commit together, or not at all.
    """
    objects = list(queryset[: BULK_LIMIT + 1])
    if len(objects) > BULK_LIMIT:
        modeladmin.message_user(
            request, f"Select at most {BULK_LIMIT} jobs at a time.", messages.ERROR
        )
        return None
    form = form_class(request.POST if "confirm" in request.POST else None) if form_class else None
    if "confirm" in request.POST and (form is None or form.is_valid()):
        try:
            with transaction.atomic(using=awa_settings.DATABASE_ALIAS), transaction.atomic():
                text = perform(objects, form.cleaned_data if form else {})
        except ValidationError as exc:
            modeladmin.message_user(request, str(exc), messages.ERROR)
            return None
        modeladmin.message_user(request, text, messages.SUCCESS)
        return None
    return TemplateResponse(
        request,
        "admin/awa_django/confirm_action.html",
        {
            **modeladmin.admin_site.each_context(request),
            "title": title,
            "objects": objects,
            "form": form,
            "action": request.POST.get("action", ""),
            "opts": modeladmin.model._meta,
            "selected": [str(o.pk) for o in objects],
        },
    )


class RetryForm(forms.Form):
    queue = forms.CharField(required=False, help_text="Retry into another queue (optional).")
    priority = forms.IntegerField(
        required=False,
        min_value=-100,
        max_value=100,
        help_text="Retry with another priority (optional).",
    )


@admin.register(DeadLetter)
class DeadLetterAdmin(JobDetail, ReadOnlyAdmin):
    list_display = ("job_id", "kind", "queue", "attempt", "dlq_at", "dlq_reason")
    list_filter = ("queue", "kind")
    search_fields = ("kind",)
    readonly_fields = (
        "job_id",
        "kind",
        "queue",
        "priority",
        "attempt",
        "max_attempts",
        "original_run_lease",
        "dlq_reason",
        "dlq_at",
        "created_at",
        "run_at",
        "pretty_args",
        "pretty_metadata",
        "pretty_progress",
        "error_timeline",
    )
    exclude = ("args", "metadata", "progress", "errors", "tags", "run_lease", "attempted_at")
    actions = ("retry_jobs", "purge_jobs")

    @admin.action(description="Retry selected jobs", permissions=["retry_dlq"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "retry_dlq")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            ids = operations.dlq_retry(
                [o.job_id for o in objects],
                queue=data.get("queue") or None,
                priority=data.get("priority"),
            )
            self._log(request, objects, f"retried job ids {ids}")
            return f"Retried {len(ids)} job(s)."

        return confirm(
            self,
            request,
            queryset,
            title="Retry dead-lettered jobs",
            form_class=RetryForm,
            perform=perform,
        )

    @admin.action(description="Purge selected jobs", permissions=["purge_dlq"])
    def purge_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "purge_dlq")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            self._log(request, objects, f"purged job ids {[o.job_id for o in objects]}")
            ids = operations.dlq_purge([o.job_id for o in objects])
            return f"Purged {len(ids)} job(s)."

        return confirm(
            self,
            request,
            queryset,
            title="Purge dead-lettered jobs",
            form_class=None,
            perform=perform,
        )

    def has_retry_dlq_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.retry_dlq"))

    def has_purge_dlq_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.purge_dlq"))


@admin.register(TerminalJob)
class TerminalJobAdmin(JobDetail, ReadOnlyAdmin):
    list_display = ("id", "kind", "queue", "state", "attempt", "finalized_at")
    list_filter = ("state", "queue", "kind", ("finalized_at", admin.DateFieldListFilter))
    search_fields = ("kind",)
    readonly_fields = (
        "id",
        "kind",
        "queue",
        "state",
        "priority",
        "attempt",
        "max_attempts",
        "run_lease",
        "created_at",
        "attempted_at",
        "finalized_at",
        "pretty_args",
        "pretty_metadata",
        "pretty_result",
        "pretty_progress",
        "error_timeline",
    )
    exclude = ("args", "metadata", "result", "progress", "errors", "tags", "run_at")


@admin.register(Job)
class JobAdmin(JobDetail, ReadOnlyAdmin):
    list_display = ("id", "kind", "queue", "state", "priority", "attempt", "run_at")
    list_filter = ("state", "queue")
    search_fields = ("kind",)
    readonly_fields = (
        "id",
        "kind",
        "queue",
        "state",
        "priority",
        "attempt",
        "max_attempts",
        "run_lease",
        "run_at",
        "created_at",
        "attempted_at",
        "finalized_at",
        "in_dlq",
        "dlq_reason",
        "pretty_args",
        "pretty_metadata",
        "pretty_result",
        "pretty_progress",
        "error_timeline",
    )
    exclude = ("args", "metadata", "result", "progress", "errors", "tags")
    actions = ("cancel_jobs",)

    @admin.action(description="Cancel selected jobs", permissions=["cancel_job"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "cancel_job")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            ordered = sorted(objects, key=lambda o: int(o.id))  # one lock order for all
            done = [o.id for o in ordered if operations.cancel(o.id, reason="cancelled in admin")]
            self._log(request, objects, f"cancelled job ids {done}")
            return f"Cancelled {len(done)} job(s)."

        return confirm(
            self, request, queryset, title="Cancel jobs", form_class=None, perform=perform
        )

    def has_cancel_job_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.cancel_job"))


def sparkline(points: Sequence[int], width: int = 240, height: int = 40) -> str:
    """An inline SVG polyline of ``points`` (server-rendered, no JavaScript)."""
    top = max(max(points, default=0), 1)
    step = width / max(len(points) - 1, 1)
    coords = " ".join(
        f"{i * step:.1f},{height - (p / top) * (height - 2) - 1:.1f}" for i, p in enumerate(points)
    )
    return format_html(
        '<svg width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<polyline fill="none" stroke="#417690" stroke-width="1.5" points="{}"/></svg>',
        width,
        height,
        width,
        height,
        f"completions per minute, last hour, peak {top}",
        coords,
    )


@admin.register(QueueStat)
class QueueStatAdmin(ReadOnlyAdmin):
    list_display = (
        "queue",
        "paused",
        "available",
        "running",
        "scheduled",
        "retryable",
        "completed",
        "failed",
        "dlq",
        "lag",
        "completed_last_hour",
    )
    actions = ("pause_queues", "resume_queues", "drain_queues")
    change_list_template = "admin/awa_django/queuestat/change_list.html"

    @admin.display(description="lag")
    def lag(self, obj: QueueStat) -> str:
        return "-" if obj.lag_seconds is None else f"{obj.lag_seconds:.1f} s"

    def get_urls(self) -> list[Any]:
        return [
            path(
                "dashboard/",
                self.admin_site.admin_view(self.dashboard),
                name="awa_django_dashboard",
            ),
            *super().get_urls(),
        ]

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        rows = [
            {"stat": stat, "sparkline": sparkline(services.throughput(stat.queue))}
            for stat in services.queue_stats()
        ]
        return TemplateResponse(
            request,
            "admin/awa_django/dashboard.html",
            {
                **self.admin_site.each_context(request),
                "title": "Queue dashboard",
                "rows": rows,
                "workers": services.workers(),
                "opts": self.model._meta,
            },
        )

    def _queues(
        self, request: HttpRequest, queryset: QuerySet[Any], verb: str, act: Callable[[str], Any]
    ) -> None:
        self._checked(request, "manage_queue")
        names = [q.queue for q in queryset[:BULK_LIMIT]]
        for name in names:
            act(name)
        self._log(request, list(queryset[:BULK_LIMIT]), f"{verb} queues {names}")
        self.message_user(request, f"{verb.capitalize()} {len(names)} queue(s).", messages.SUCCESS)

    @admin.action(description="Pause selected queues", permissions=["manage_queue"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._queues(request, queryset, "paused", lambda q: services.queue_pause(q, True))

    @admin.action(description="Resume selected queues", permissions=["manage_queue"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._queues(request, queryset, "resumed", lambda q: services.queue_pause(q, False))

    @admin.action(
        description="Drain selected queues (cancel waiting jobs)", permissions=["manage_queue"]
    )
    def drain_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._queues(request, queryset, "drained", services.queue_drain)

    def has_manage_queue_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.manage_queue"))


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = (
        "hostname",
        "pid",
        "is_leader",
        "concurrency",
        "queue_list",
        "started_at",
        "last_seen_at",
    )
    list_filter = ("is_leader", "hostname")

    @admin.display(description="queues")
    def queue_list(self, obj: Worker) -> str:
        return ", ".join(f"{q}={n}" for q, n in sorted((obj.queues or {}).items()))
