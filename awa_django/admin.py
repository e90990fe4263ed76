"""The Django admin: read-only views of the queue, with permission-gated operator actions.

The pages are registered here; the parts they share live next door:

* ``admin_readonly``: the read-only base (capped counts, permission before data, search and
  URL filters that never raise);
* ``admin_filters``: list filters whose choices never scan job history;
* ``admin_actions``: confirmation page, selection in one field, atomic execution with
  ``LogEntry`` audit records;
* ``admin_display``: escaped JSON, error timelines, sparklines;
* ``admin_callbacks``: the callback waits page (jobs parked until their callback), with its
  resolve, fail and extend actions.

Actions call the same operator API (``awa_django.operator``) as the management commands, need
custom permissions, are always confirmed on a separate page, act on at most ``BULK_LIMIT`` rows,
and commit together with one admin ``LogEntry`` per row they changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path

from awa_django.admin_actions import BULK_LIMIT, admin_actor, confirm, log_change
from awa_django.admin_alias import admin_read_alias, choose_read_alias
from awa_django.admin_callbacks import CallbackWaitAdmin
from awa_django.admin_display import JobDetail, error_timeline, pretty, sparkline
from awa_django.admin_filters import (
    KindFilter,
    LiveStateFilter,
    QueueFilter,
    TagFilter,
    TerminalStateFilter,
)
from awa_django.admin_flow import FlowLimitsForm
from awa_django.admin_kinds import KindLimitAdmin
from awa_django.admin_operator import QueueDlqActions, TerminalRetryActions
from awa_django.admin_readonly import CappedPaginator, JobListAdmin, ReadOnlyAdmin
from awa_django.cron import next_fire
from awa_django.db.storage import HISTORY_EXACT_UP_TO
from awa_django.limits import (
    check_queue_name,
    check_text,
    check_uuid,
)
from awa_django.models import (
    CronSchedule,
    DeadLetter,
    KindLimit,
    LiveJob,
    QueueStat,
    TerminalJob,
    Worker,
)
from awa_django.operator import (
    QueueLimits,
    cancel,
    clear_queue_limits,
    dlq_purge,
    dlq_retry,
    queue_drain,
    queue_limits,
    queue_pause,
    queue_stats,
    schedule_pause,
    schedule_trigger,
    set_queue_limits,
    throughput,
    workers,
)

__all__ = [
    "BULK_LIMIT",
    "CallbackWaitAdmin",
    "CappedPaginator",
    "CronScheduleAdmin",
    "DeadLetterAdmin",
    "FlowLimitsForm",
    "JobAdmin",
    "KindLimitAdmin",
    "QueueStatAdmin",
    "TerminalJobAdmin",
    "WorkerAdmin",
    "confirm",
    "error_timeline",
    "pretty",
    "sparkline",
]


class RetryForm(forms.Form):
    queue = forms.CharField(required=False, help_text="Retry into another queue (optional).")
    priority = forms.IntegerField(
        required=False,
        min_value=-100,
        max_value=100,
        help_text="Retry with another priority (optional).",
    )


def _history_count(n: int) -> str:
    # Counts of terminal history above HISTORY_EXACT_UP_TO are estimates (docs/storage.md).
    return f"~{n:,}" if n > HISTORY_EXACT_UP_TO else str(n)


def _together(n: int) -> str:
    return "" if n == 1 else f" (one of {n} in one admin action)"


@admin.register(DeadLetter)
class DeadLetterAdmin(JobDetail, JobListAdmin):
    list_display = ("job_id", "kind", "queue", "attempt", "tag_list", "dlq_at", "dlq_reason")
    list_filter = (QueueFilter, KindFilter, TagFilter)
    sortable_by = ("job_id", "dlq_at")  # indexed; sorting by another column sorts the whole DLQ
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
        "tag_list",
        "unique_key",
        "retry_policy",
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
            queue, priority = data.get("queue") or None, data.get("priority")
            ids = set(dlq_retry([o.job_id for o in objects], queue=queue, priority=priority))
            where = f" into queue {queue}" if queue else ""
            if priority is not None:
                where += f" with priority {priority}"
            log_change(
                request,
                [o for o in objects if o.job_id in ids],
                f"retried{where}{_together(len(ids))}",
            )
            refused = len({o.job_id for o in objects} - ids)
            if refused:
                return (
                    f"Retried {len(ids)} job(s); {refused} stayed in the DLQ (gone meanwhile, "
                    "or unique jobs whose key another job holds)."
                )
            return f"Retried {len(ids)} job(s)."

        return confirm(
            self,
            request,
            queryset,
            title="Retry dead-lettered jobs",
            note="These jobs go back to work with attempt 0 (their error history is kept).",
            form_class=RetryForm,
            perform=perform,
        )

    @admin.action(description="Purge selected jobs", permissions=["purge_dlq"])
    def purge_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "purge_dlq")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            ids = set(dlq_purge([o.job_id for o in objects]))
            log_change(
                request, [o for o in objects if o.job_id in ids], f"purged{_together(len(ids))}"
            )
            return f"Purged {len(ids)} job(s)."

        return confirm(
            self,
            request,
            queryset,
            title="Purge dead-lettered jobs",
            note="These jobs are deleted for good.",
            form_class=None,
            perform=perform,
        )

    def has_retry_dlq_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.retry_dlq"))

    def has_purge_dlq_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.purge_dlq"))


@admin.register(TerminalJob)
class TerminalJobAdmin(TerminalRetryActions, JobDetail, JobListAdmin):
    list_display = ("id", "kind", "queue", "state", "attempt", "tag_list", "finalized_at")
    sortable_by = ("id", "finalized_at")  # sorting history by another column sorts all of it
    # Part of a kind would read every retained row; a whole kind is an index range.
    search_whole_kind = True
    search_help_text = "A job id, or a whole job kind (exactly, as in the kind column)."
    list_filter = (
        TerminalStateFilter,
        QueueFilter,
        KindFilter,
        TagFilter,
        ("finalized_at", admin.DateFieldListFilter),
    )
    actions = ("retry_jobs",)
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
        "tag_list",
        "unique_key",
        "retry_policy",
        "pretty_args",
        "pretty_metadata",
        "pretty_result",
        "pretty_progress",
        "error_timeline",
    )
    exclude = ("args", "metadata", "result", "progress", "errors", "tags", "run_at")


@admin.register(LiveJob)
class JobAdmin(JobDetail, JobListAdmin):
    list_display = ("id", "kind", "queue", "state", "priority", "attempt", "tag_list", "run_at")
    list_filter = (LiveStateFilter, QueueFilter, KindFilter, TagFilter)
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
        "tag_list",
        "unique_key",
        "retry_policy",
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
            done = [o for o in ordered if cancel(o.id, reason="cancelled in admin")]
            log_change(request, done, f"cancelled{_together(len(done))}")
            return f"Cancelled {len(done)} job(s)."

        return confirm(
            self,
            request,
            queryset,
            title="Cancel jobs",
            note="Waiting jobs are cancelled; running handlers are told to stop.",
            form_class=None,
            perform=perform,
        )

    def has_cancel_job_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.cancel_job"))


def _waiting(stat: QueueStat) -> int:
    return int(stat.available + stat.scheduled + stat.retryable)


@admin.register(QueueStat)
class QueueStatAdmin(QueueDlqActions, ReadOnlyAdmin):
    list_display = (
        "queue",
        "paused",
        "available",
        "running",
        "scheduled",
        "retryable",
        "completed_count",
        "failed_count",
        "dlq",
        "dlq_enabled",
        "lag",
        "completed_last_hour",
        "global_limit",
        "limit_in_use",
        "rate",
        "limits_by",
    )
    actions = (
        "pause_queues",
        "resume_queues",
        "drain_queues",
        "limit_queues",
        "dlq_on_queues",
        "dlq_off_queues",
    )
    change_list_template = "admin/awa_django/queuestat/change_list.html"
    selection_noun = "queues"

    @staticmethod
    def selection_key(text: str) -> Any:
        return check_queue_name(text)

    @admin.display(description="completed")
    def completed_count(self, obj: QueueStat) -> str:
        return _history_count(obj.completed)

    @admin.display(description="failed")
    def failed_count(self, obj: QueueStat) -> str:
        return _history_count(obj.failed)

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
        return f"{limits.rate_limit:g}/s (burst {limits.burst_in_force})"

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
            *super().get_urls(),
        ]

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        banner = choose_read_alias()
        read = admin_read_alias()  # a replica, or the primary when it cannot be read
        rows = [
            {
                "stat": stat,
                "completed": stat.shown("completed"),
                "failed": stat.shown("failed"),
                "sparkline": sparkline(throughput(stat.queue, using=read)),
            }
            for stat in queue_stats(using=read)
        ]
        if banner is not None:
            self.message_user(request, banner[1], banner[0])
        return TemplateResponse(
            request,
            "admin/awa_django/dashboard.html",
            {
                **self.admin_site.each_context(request),
                "title": "Queue dashboard",
                "rows": rows,
                "workers": workers(using=read),
                "opts": self.model._meta,
            },
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
                "The limits given replace each queue's flow limits across every worker: a "
                "limit left empty is lifted, also one AWA['QUEUES'] sets, until cleared. "
                "Workers apply them from their next claim. docs/flow.md."
            ),
            form_class=FlowLimitsForm,
            perform=perform,
            describe=describe,
        )

    def has_manage_queue_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.manage_queue"))


def _flow(stat: QueueStat) -> QueueLimits | None:
    """The flow limits the list attached to a row (None: none, or not read for this row)."""
    limits = getattr(stat, "flow_limits", None)
    return limits if isinstance(limits, QueueLimits) else None


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
    list_filter = ("is_leader", "hostname")  # runtime_instances: one row per process
    selection_noun = "workers"

    @staticmethod
    def selection_key(text: str) -> Any:
        return check_uuid("worker", text)

    @admin.display(description="queues")
    def queue_list(self, obj: Worker) -> str:
        queues = obj.queues if isinstance(obj.queues, dict) else {}  # a row of another shape
        return ", ".join(f"{q}={n}" for q, n in sorted(queues.items()))


@admin.register(CronSchedule)
class CronScheduleAdmin(ReadOnlyAdmin):
    """Periodic schedules: next and last fire, the last job's state, enabled; pause, resume and
    trigger (``awa_django.manage_schedule``), each confirmed and logged."""

    list_display = (
        "name",
        "kind",
        "expression",
        "enabled",
        "next_fire",
        "last_fire_at",
        "last_job",
    )
    list_filter = ("enabled",)
    readonly_fields = (
        "name",
        "kind",
        "expression",
        "catch_up",
        "queue",
        "priority",
        "max_attempts",
        "enabled",
        "paused_at",
        "paused_by",
        "next_fire",
        "last_fire_at",
        "last_job",
        "pretty_args",
        "created_at",
        "updated_at",
    )
    fields = readonly_fields
    actions = ("pause_schedules", "resume_schedules", "trigger_schedules")
    selection_noun = "schedules"

    @staticmethod
    def selection_key(text: str) -> Any:
        return check_text("name", text, max_length=255)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The database clock, for the next fire time (never the web server's).
        queryset: QuerySet[Any] = super().get_queryset(request).annotate(db_now=Now())
        return queryset

    @admin.display(description="schedule")
    def expression(self, obj: CronSchedule) -> str:
        return f"{obj.cron_expr} ({obj.timezone})"

    @admin.display(description="next fire")
    def next_fire(self, obj: CronSchedule) -> str:
        if not obj.enabled:
            return "paused"
        now = getattr(obj, "db_now", None) or obj.fire_after
        try:
            upcoming = next_fire(obj.cron_expr, obj.timezone, max(obj.fire_after, now))
        except Exception:  # an expression or zone this process cannot read
            return "?"
        return "-" if upcoming is None else f"{upcoming:%Y-%m-%d %H:%M:%S %Z}"

    @admin.display(description="last job")
    def last_job(self, obj: CronSchedule) -> str:
        if obj.last_job_id is None:
            return "-"
        return f"{obj.last_job_id} ({obj.last_job_state or 'no longer in history'})"

    @admin.display(description="arguments")
    def pretty_args(self, obj: CronSchedule) -> str:
        return pretty(obj.args)

    def _schedules(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        *,
        title: str,
        note: str,
        act: Callable[[CronSchedule], str | None],
    ) -> HttpResponse | None:
        self._checked(request, "manage_schedule")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            done = []
            for schedule in objects:
                message = act(schedule)
                if message is not None:
                    log_change(request, [schedule], message)
                    done.append(f"{schedule.name} {message}")
            return f"{title}: " + ("; ".join(done) or "nothing changed")

        return confirm(
            self, request, queryset, title=title, note=note, form_class=None, perform=perform
        )

    @admin.action(description="Pause selected schedules", permissions=["manage_schedule"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        by = admin_actor(request)
        return self._schedules(
            request,
            queryset,
            title="Pause schedules",
            note="These schedules stop firing until resumed (the state survives restarts).",
            act=lambda s: "paused" if schedule_pause(s.name, True, by=by) else None,
        )

    @admin.action(description="Resume selected schedules", permissions=["manage_schedule"])
    def resume_schedules(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        return self._schedules(
            request,
            queryset,
            title="Resume schedules",
            note="These schedules fire again from now on; fires missed while paused are skipped.",
            act=lambda s: "resumed" if schedule_pause(s.name, False) else None,
        )

    @admin.action(description="Trigger selected schedules now", permissions=["manage_schedule"])
    def trigger_schedules(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        def act(schedule: CronSchedule) -> str | None:
            job = schedule_trigger(schedule.name)
            return None if job is None else f"triggered: enqueued job {job}"

        return self._schedules(
            request,
            queryset,
            title="Trigger schedules",
            note="One job of each schedule is enqueued now, paused or not; their fire times do "
            "not change.",
            act=act,
        )

    def has_manage_schedule_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.manage_schedule"))


# Job kinds' flow limits (awa_django.admin_kinds).
admin.site.register(KindLimit, KindLimitAdmin)
