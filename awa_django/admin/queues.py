"""The admin page of queues (``QueueStat``): counts, lag, flow limits and the dead letter queue
switch of each queue, the queue dashboard, and the queue actions: pause, resume, drain, set flow
limits, turn the DLQ on or off (each needs ``awa_django.manage_queue``, is confirmed on a
separate page and logged, like every admin action: awa_django/admin/actions.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.html import format_html

from awa_django.admin.actions import admin_actor, confirm, log_change
from awa_django.admin.base import ReadOnlyAdmin
from awa_django.admin.charts import REFRESH_SECONDS, live_page, queue_charts
from awa_django.admin.display import outcome_chart
from awa_django.admin.forms import FlowLimitsForm, limits_in_force
from awa_django.admin.read_alias import admin_read_alias, choose_read_alias
from awa_django.limits import check_queue_name, rate_text
from awa_django.maintenance.queues import declared_dlq
from awa_django.models import QueueStat
from awa_django.operator import (
    QueueLimits,
    clear_queue_limits,
    outcomes_per_minute,
    queue_dlq,
    queue_dlq_enabled,
    queue_drain,
    queue_limits,
    queue_pause,
    queue_stats,
    set_queue_limits,
    workers,
)

__all__ = ["QueueStatAdmin"]


def _waiting(stat: QueueStat) -> int:
    return int(stat.available + stat.scheduled + stat.retryable)


#: A queue's columns on the list and its page, in one vocabulary (a status, "waiting", "in DLQ").
_COLUMNS = (
    "queue",
    "status",
    "available",
    "running",
    "waiting",
    "scheduled",
    "retryable",
    "completed_count",
    "failed_count",
    "cancelled_count",
    "in_dlq",
    "failures_go_to",
    "lag",
    "completed_last_hour",
)


class QueueStatAdmin(ReadOnlyAdmin):
    list_display = (*_COLUMNS, "global_limit", "limit_in_use", "rate", "limits_by")
    actions = (
        "pause_queues",
        "resume_queues",
        "drain_queues",
        "limit_queues",
        "dlq_on_queues",
        "dlq_off_queues",
    )
    fields = (*_COLUMNS, "flow_limits_now", "charts_link")
    readonly_fields = fields
    change_list_template = "admin/awa_django/queuestat/change_list.html"
    selection_noun = "queues"

    @staticmethod
    def selection_key(text: str) -> Any:
        return check_queue_name(text)

    @admin.display(description="completed")
    def completed_count(self, obj: QueueStat) -> int:
        return obj.completed

    @admin.display(description="failed")
    def failed_count(self, obj: QueueStat) -> int:
        return obj.failed

    @admin.display(description="cancelled")
    def cancelled_count(self, obj: QueueStat) -> int:
        return obj.cancelled

    @admin.display(description="status", ordering="paused")
    def status(self, obj: QueueStat) -> str:
        # A status, not a boolean: a red cross on every healthy queue read as an alarm.
        return "paused" if obj.paused else "active"

    @admin.display(description="waiting", ordering="waiting_external")
    def waiting(self, obj: QueueStat) -> int:
        """Jobs parked waiting for a callback (``waiting_external``)."""
        return int(obj.waiting_external)

    @admin.display(description="in DLQ", ordering="dlq")
    def in_dlq(self, obj: QueueStat) -> int:
        return int(obj.dlq)

    @admin.display(description="lag")
    def lag(self, obj: QueueStat) -> str:
        return "-" if obj.lag_seconds is None else f"{obj.lag_seconds:.1f} s"

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        # The flow limits of the page's queues: one read for the whole list, not one per row.
        # On the primary, even when the list reads a replica: the permits in use are in the
        # primary's lock table, which a replica does not have.
        changelist = super().get_changelist_instance(request)
        limits = {q.queue: q for q in queue_limits()}
        for stat in changelist.result_list:
            stat.flow_limits = limits.get(stat.queue)
        return changelist

    @admin.display(description="flow limits")
    def flow_limits_now(self, obj: QueueStat) -> str:
        """The queue's flow limits in force (read on the primary, where the permits are)."""
        limits = {q.queue: q for q in queue_limits()}.get(obj.queue)
        return "none" if limits is None else limits.summary()

    @admin.display(description="global limit")
    def global_limit(self, obj: QueueStat) -> str:
        limits = _flow(obj)
        if limits is None or limits.global_concurrency is None:
            return "-"
        return str(limits.global_concurrency)

    @admin.display(description="in use")
    def limit_in_use(self, obj: QueueStat) -> str:
        limits = _flow(obj)
        if limits is None or limits.global_concurrency is None:
            return "-"
        return str(limits.in_use or 0)

    @admin.display(description="rate")
    def rate(self, obj: QueueStat) -> str:
        limits = _flow(obj)
        if limits is None or limits.rate_limit is None:
            return "-"
        return f"{rate_text(limits.rate_limit)}/s (burst {limits.burst_in_force})"

    @admin.display(description="limits by")
    def limits_by(self, obj: QueueStat) -> str:
        limits = _flow(obj)
        if limits is None:
            return "-"
        return f"{limits.source}: {limits.updated_by or '?'}"

    def get_urls(self) -> list[Any]:
        return [
            path(
                "dashboard/",
                self.admin_site.admin_view(self.dashboard),
                name="awa_django_dashboard",
            ),
            path(
                "<str:queue>/charts/",
                self.admin_site.admin_view(self.charts),
                name="awa_django_queue_charts",
            ),
            *super().get_urls(),
        ]

    def charts(self, request: HttpRequest, queue: str) -> HttpResponse:
        return queue_charts(self, request, queue)

    @admin.display(description="charts")
    def charts_link(self, obj: QueueStat) -> str:
        return format_html(
            '<a href="{}">the last hour</a> | <a href="{}?span=day">the last day</a>',
            reverse("admin:awa_django_queue_charts", args=[obj.queue]),
            reverse("admin:awa_django_queue_charts", args=[obj.queue]),
        )

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        banner = choose_read_alias()
        read = admin_read_alias()  # a replica, or the primary when it cannot be read
        rows = [
            {
                "stat": stat,
                "completed": stat.completed,
                "failed": stat.failed,
                "cancelled": stat.cancelled,
                "chart": _chart(stat.queue, read),
            }
            for stat in queue_stats(using=read)
        ]
        context = {"rows": rows, "workers": workers(using=read), "refresh": REFRESH_SECONDS}
        return live_page(
            self,
            request,
            "admin/awa_django/dashboard",
            context,
            title="Queue dashboard",
            banner=banner,
        )

    def _queues(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        *,
        title: str,
        note: str,
        act: Callable[[QueueStat], str],
        describe: Callable[[Any], str] = str,
        batched: bool = False,
    ) -> HttpResponse | None:
        self._checked(request, "manage_queue")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            done = [act(q) for q in objects]
            if not batched:  # a batched act logs each of its batches itself
                for stat, message in zip(objects, done, strict=True):
                    log_change(request, [stat], message)
            return f"{title}: " + "; ".join(
                f"{q.queue} {m}" for q, m in zip(objects, done, strict=True)
            )

        return confirm(
            self,
            request,
            queryset,
            title=title,
            note=note,
            form_class=None,
            perform=perform,
            describe=describe,
            batched=batched,
        )

    @admin.action(description="Pause selected queues", permissions=["manage_queue"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        def act(stat: QueueStat) -> str:
            queue_pause(stat.queue, True)
            return "paused"

        return self._queues(
            request,
            queryset,
            title="Pause queues",
            note="Workers stop claiming jobs from these queues; producers can still enqueue.",
            act=act,
        )

    @admin.action(description="Resume selected queues", permissions=["manage_queue"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        def act(stat: QueueStat) -> str:
            queue_pause(stat.queue, False)
            return "resumed"

        return self._queues(
            request,
            queryset,
            title="Resume queues",
            note="Workers claim jobs from these queues again.",
            act=act,
        )

    @admin.action(
        description="Drain selected queues (cancel waiting jobs)", permissions=["manage_queue"]
    )
    def drain_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        def act(stat: QueueStat) -> str:
            def log_batch(cancelled: int) -> None:
                # Inside the batch's transaction: the entry commits with what it records.
                with transaction.atomic():
                    log_change(request, [stat], f"drained: cancelled {cancelled} job(s)")

            cancelled = queue_drain(stat.queue, each_batch=log_batch)
            return f"drained: cancelled {cancelled} waiting job(s)"

        return self._queues(
            request,
            queryset,
            title="Drain queues",
            note=(
                "Every job of these queues that is waiting to run (available, scheduled, "
                "retryable) is cancelled, in batches of 1,000, each its own short transaction "
                "with its log entry; running jobs finish."
            ),
            act=act,
            batched=True,
            describe=lambda q: f"{q.queue}: {_waiting(q)} waiting job(s)",
        )

    @admin.action(description="Set flow limits of selected queues", permissions=["manage_queue"])
    def limit_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "manage_queue")
        by = admin_actor(request)
        current = {q.queue: q for q in queue_limits()}

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            done = []
            for stat in objects:
                if data.get("clear"):
                    now = clear_queue_limits(stat.queue, actor=by)
                    verb = "cleared"
                else:
                    now = set_queue_limits(
                        stat.queue,
                        global_concurrency=data.get("global_concurrency"),
                        rate_limit=data.get("rate_limit"),
                        rate_burst=data.get("rate_burst"),
                        actor=by,
                    )
                    verb = "set"
                shown = "no limits" if now is None else now.summary(in_use=False)
                message = f"flow limits {verb}: {shown}"
                log_change(request, [stat], message)
                done.append(f"{stat.queue} {message}")
            return "Set flow limits: " + "; ".join(done)

        def describe(stat: QueueStat) -> str:
            limits = current.get(stat.queue)
            return f"{stat.queue}: {limits.summary() if limits else 'no flow limits'} now"

        return confirm(
            self,
            request,
            queryset,
            title="Set flow limits",
            note=(
                "The form shows the limits in force. The limits given replace each queue's "
                "flow limits across every worker: a limit left empty is lifted, also one "
                "AWA['QUEUES'] sets, until cleared. Workers apply them from their next claim. "
                "docs/flow.md."
            ),
            form_class=FlowLimitsForm,
            perform=perform,
            describe=describe,
            initial=lambda objects: self._limits_now(
                request, [current.get(o.queue) for o in objects]
            ),
        )

    def _limits_now(self, request: HttpRequest, limits: list[Any]) -> dict[str, Any]:
        initial = limits_in_force(limits)
        if initial is None:
            self.message_user(
                request,
                "The selected queues have different flow limits: the form is empty, and the "
                "limits given replace each one's whole.",
                messages.WARNING,
            )
        return initial or {}

    @admin.display(description="failures go to")
    def failures_go_to(self, obj: QueueStat) -> str:
        """Where the queue's jobs that fail for good go: the DLQ, or history as failed."""
        enabled = queue_dlq_enabled(obj.queue, using=admin_read_alias())  # as the list
        return "DLQ" if enabled else "history"

    def _dlq(
        self, request: HttpRequest, queryset: QuerySet[Any], enabled: bool
    ) -> HttpResponse | None:
        """Turn the DLQ of the selected queues on or off; a queue whose DLQ is set in
        ``AWA["QUEUES"]`` is left alone (every process writes the setting when it starts):
        change the setting instead."""
        self._checked(request, "manage_queue")
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
            self,
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
        return self._dlq(request, queryset, True)

    @admin.action(
        description="Turn the DLQ off for selected queues (failures stay in history)",
        permissions=["manage_queue"],
    )
    def dlq_off_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._dlq(request, queryset, False)

    def object_action_applies(self, name: str, obj: Any) -> bool:
        if name in ("pause_queues", "resume_queues"):
            return bool(obj.paused) == (name == "resume_queues")
        if name in ("dlq_on_queues", "dlq_off_queues"):
            if obj.queue in declared_dlq():  # AWA["QUEUES"] sets it: the action leaves it alone
                return False
            on = queue_dlq_enabled(obj.queue, using=admin_read_alias())
            return on == (name == "dlq_off_queues")
        return True

    def has_manage_queue_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.manage_queue"))


def _chart(queue: str, using: str) -> str:
    minutes = outcomes_per_minute(queue, using=using)
    failed = [m.failed + m.cancelled + m.dead_lettered for m in minutes]
    return outcome_chart([m.completed for m in minutes], failed)


def _flow(stat: QueueStat) -> QueueLimits | None:
    """The flow limits the list attached to a row (None: none, or not read for this row)."""
    limits = getattr(stat, "flow_limits", None)
    return limits if isinstance(limits, QueueLimits) else None
