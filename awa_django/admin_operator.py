"""Admin actions of issue 18, mixed into the pages of ``awa_django.admin``: retry failed and
cancelled jobs from history, and turn a queue's dead letter queue on or off.

Like every admin action (``awa_django.admin_actions``), each needs a custom permission, is
confirmed on a separate page, acts on at most ``BULK_LIMIT`` rows and commits with one admin
``LogEntry`` per row it changed.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from awa_django.admin_actions import confirm, log_change
from awa_django.admin_alias import admin_read_alias
from awa_django.maintenance.queues import declared_dlq
from awa_django.models import QueueStat
from awa_django.operator import history_retry, queue_dlq, queue_dlq_enabled

__all__ = ["QueueDlqActions", "RetryFromHistoryForm", "TerminalRetryActions"]


class RetryFromHistoryForm(forms.Form):
    queue = forms.CharField(required=False, help_text="Retry into another queue (optional).")
    priority = forms.IntegerField(
        required=False,
        min_value=-100,
        max_value=100,
        help_text="Retry with another priority (optional).",
    )


def _who(request: HttpRequest) -> str:
    """Who asked, for ``awa:retried_by``: the user name and that it came from the admin."""
    name = request.user.get_username() or f"user {request.user.pk}"
    return f"{name} (admin)"[:255]


class TerminalRetryActions:
    """For the terminal jobs page: retry failed and cancelled jobs as new jobs."""

    @admin.action(
        description="Retry selected failed or cancelled jobs (as new jobs)",
        permissions=["retry_job"],
    )
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        page: Any = self
        page._checked(request, "retry_job")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            queue, priority = data.get("queue") or None, data.get("priority")
            rows = history_retry(
                [o.id for o in objects], by=_who(request), queue=queue, priority=priority
            )
            retried = {r.job_id: r.retry_job_id for r in rows if r.outcome == "retried"}
            for obj in objects:
                if obj.id in retried:
                    log_change(request, [obj], f"retried from history as job {retried[obj.id]}")
            left = len(objects) - len(retried)
            text = f"Retried {len(retried)} job(s) as new jobs"
            if retried:
                text += " (" + ", ".join(f"{a} → {b}" for a, b in sorted(retried.items())) + ")"
            if left:
                text += (
                    f"; {left} not retried (completed, already retried, or unique jobs whose "
                    "key another job holds)"
                )
            return text + "."

        return confirm(
            page,
            request,
            queryset,
            title="Retry jobs from history",
            note=(
                "Each failed or cancelled job is enqueued again as a new job with the same "
                "arguments (attempt 0); the original stays in history. A job is retried from "
                "history at most once. Completed jobs are left alone."
            ),
            form_class=RetryFromHistoryForm,
            perform=perform,
        )

    def has_retry_job_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.retry_job"))


class QueueDlqActions:
    """For the queue list: a DLQ column and actions that turn it on or off. A queue whose DLQ
    is set in ``AWA["QUEUES"]`` is left alone (every process writes the setting when it
    starts): change the setting instead."""

    @admin.display(description="DLQ", boolean=True)
    def dlq_enabled(self, obj: QueueStat) -> bool:
        return queue_dlq_enabled(obj.queue, using=admin_read_alias())  # as the list

    def _dlq(self, request: HttpRequest, queryset: QuerySet[Any], enabled: bool) -> Any:
        page: Any = self
        page._checked(request, "manage_queue")
        pinned = declared_dlq()
        word = "on" if enabled else "off"

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            changed, kept = [], []
            for stat in objects:
                if stat.queue in pinned:
                    kept.append(stat.queue)
                    continue
                if queue_dlq(stat.queue, enabled):
                    changed.append(stat.queue)
                    log_change(request, [stat], f"dead letter queue turned {word}")
            text = f"Dead letter queue turned {word} for {len(changed)} queue(s)"
            if changed:
                text += f": {', '.join(changed)}"
            if kept:
                text += (
                    f"; left alone (set in AWA['QUEUES'], change the setting): {', '.join(kept)}"
                )
            return text + "."

        return confirm(
            page,
            request,
            queryset,
            title=f"Turn the dead letter queue {word}",
            note=(
                "Jobs of these queues that fail for good will go to the dead letter queue."
                if enabled
                else "Jobs of these queues that fail for good will stay in history as failed, "
                "instead of going to the dead letter queue."
            )
            + " Queues whose DLQ is set in AWA['QUEUES'] are left alone.",
            form_class=None,
            perform=perform,
        )

    @admin.action(description="Turn the DLQ on for selected queues", permissions=["manage_queue"])
    def dlq_on_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        result: HttpResponse | None = self._dlq(request, queryset, True)
        return result

    @admin.action(
        description="Turn the DLQ off for selected queues (failures stay in history)",
        permissions=["manage_queue"],
    )
    def dlq_off_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        result: HttpResponse | None = self._dlq(request, queryset, False)
        return result
