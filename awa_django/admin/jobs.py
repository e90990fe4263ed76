"""The admin pages of jobs: live jobs (cancel), terminal history (retry failed and cancelled
jobs as new jobs) and the dead letter queue (retry, purge).

Like every admin action (awa_django/admin/actions.py), each needs a custom permission, is
confirmed on a separate page, acts on at most ``BULK_LIMIT`` rows and commits with one admin
``LogEntry`` per row it changed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import path

from awa_django.admin.actions import log_change
from awa_django.admin.base import JobListAdmin
from awa_django.admin.bulk import confirm_rows
from awa_django.admin.display import JobDetail
from awa_django.admin.filters import (
    KindFilter,
    LiveStateFilter,
    QueueFilter,
    TagFilter,
    TerminalStateFilter,
)
from awa_django.admin.find_job import find_job
from awa_django.admin.forms import RetryForm, RetryFromHistoryForm
from awa_django.admin.read_alias import admin_read_alias
from awa_django.operator import cancel, dlq_purge, dlq_retry, history_retry, paused_queues
from awa_django.sql import query
from awa_django.timetext import duration

__all__ = ["DeadLetterAdmin", "JobAdmin", "TerminalJobAdmin"]


#: The log entry's note for a job of a run over everything a filtered list matched.
_WHOLE_RUN = " (in one admin action on every job the list's filters matched)"
#: Why a job of history was not retried.
_NOT_RETRIED = "completed, already retried, or unique jobs whose key another job holds"


def _together(n: int) -> str:
    return "" if n == 1 else f" (one of {n} in one admin action)"


def _who(request: HttpRequest) -> str:
    """Who asked, for ``awa:retried_by``: the user name and that it came from the admin."""
    name = request.user.get_username() or f"user {request.user.pk}"
    return f"{name} (admin)"[:255]


class DeadLetterAdmin(JobDetail, JobListAdmin):
    change_list_template = "admin/awa_django/job_change_list.html"
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
        "attempt_timeline",
    )
    exclude = ("args", "metadata", "progress", "errors", "tags", "run_lease", "attempted_at")
    actions = ("retry_jobs", "purge_jobs")
    acts_on_all_matching = True
    arrived_field = "dlq_at"

    @admin.action(description="Retry selected jobs", permissions=["retry_dlq"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "retry_dlq")

        def retry(
            objects: list[Any], data: dict[str, Any], together: str | None = None
        ) -> tuple[int, int]:
            queue, priority = data.get("queue") or None, data.get("priority")
            ids = set(dlq_retry([o.job_id for o in objects], queue=queue, priority=priority))
            where = f" into queue {queue}" if queue else ""
            if priority is not None:
                where += f" with priority {priority}"
            log_change(
                request,
                [o for o in objects if o.job_id in ids],
                f"retried{where}{_together(len(ids)) if together is None else together}",
            )
            return len(ids), len({o.job_id for o in objects} - ids)

        def said(done: int, refused: int) -> str:
            if refused:
                return (
                    f"Retried {done} job(s); {refused} stayed in the DLQ (gone meanwhile, "
                    "or unique jobs whose key another job holds)."
                )
            return f"Retried {done} job(s)."

        return confirm_rows(
            self,
            request,
            queryset,
            title="Retry dead-lettered jobs",
            note="These jobs go back to work with attempt 0 (their error history is kept).",
            form_class=RetryForm,
            act=retry,
            said=said,
            verb="retried",
            left_why="unique jobs whose key another job holds, or gone meanwhile",
            whole_run=_WHOLE_RUN,
        )

    @admin.action(description="Purge selected jobs", permissions=["purge_dlq"])
    def purge_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "purge_dlq")

        def purge(
            objects: list[Any], data: dict[str, Any], together: str | None = None
        ) -> tuple[int, int]:
            ids = set(dlq_purge([o.job_id for o in objects]))
            suffix = _together(len(ids)) if together is None else together
            log_change(request, [o for o in objects if o.job_id in ids], f"purged{suffix}")
            return len(ids), len(objects) - len(ids)

        return confirm_rows(
            self,
            request,
            queryset,
            title="Purge dead-lettered jobs",
            note="These jobs are deleted for good.",
            form_class=None,
            act=purge,
            said=lambda done, _: f"Purged {done} job(s).",
            verb="purged",
            whole_run=_WHOLE_RUN,
        )

    def has_retry_dlq_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.retry_dlq"))

    def has_purge_dlq_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.purge_dlq"))


class TerminalJobAdmin(JobDetail, JobListAdmin):
    change_list_template = "admin/awa_django/job_change_list.html"
    acts_on_all_matching = True
    arrived_field = "finalized_at"
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
        "queue_wait",
        "run_time",
        "retried_as",
        "tag_list",
        "unique_key",
        "retry_policy",
        "pretty_args",
        "pretty_metadata",
        "pretty_result",
        "pretty_progress",
        "attempt_timeline",
    )
    exclude = ("args", "metadata", "result", "progress", "errors", "tags", "run_at")

    @admin.display(description="queue wait (last attempt)")
    def queue_wait(self, obj: Any) -> str:
        """From when the last attempt was due to when a worker claimed it."""
        if obj.run_at is None or obj.attempted_at is None:
            return "-"
        return duration((obj.attempted_at - obj.run_at).total_seconds())

    @admin.display(description="claimed to finished (last attempt)")
    def run_time(self, obj: Any) -> str:
        """From the last attempt's claim to the commit of its outcome: the handler's run time
        plus the wait for its outcome's batch (worker.md has the handler's own, in the log)."""
        if obj.attempted_at is None or obj.finalized_at is None:
            return "-"
        return duration((obj.finalized_at - obj.attempted_at).total_seconds())

    @admin.action(
        description="Retry selected failed or cancelled jobs (as new jobs)",
        permissions=["retry_job"],
    )
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "retry_job")
        retried: dict[int, int] = {}  # of a selection's run: named in its message

        def retry(
            objects: list[Any], data: dict[str, Any], together: str | None = None
        ) -> tuple[int, int]:
            queue, priority = data.get("queue") or None, data.get("priority")
            rows = history_retry(
                [o.id for o in objects], by=_who(request), queue=queue, priority=priority
            )
            done = {
                r.job_id: r.retry_job_id
                for r in rows
                if r.outcome == "retried" and r.retry_job_id is not None
            }
            for obj in objects:
                if obj.id in done:
                    log_change(
                        request,
                        [obj],
                        f"retried from history as job {done[obj.id]}{together or ''}",
                    )
            retried.update(done)
            return len(done), len(objects) - len(done)

        def said(done: int, left: int) -> str:
            text = f"Retried {done} job(s) as new jobs"
            if retried:
                text += " (" + ", ".join(f"{a} → {b}" for a, b in sorted(retried.items())) + ")"
            if left:
                text += f"; {left} not retried ({_NOT_RETRIED})"
            return text + "."

        return confirm_rows(
            self,
            request,
            queryset,
            title="Retry jobs from history",
            note=(
                "Each failed or cancelled job is enqueued again as a new job with the same "
                "arguments (attempt 0); the original stays in history. A job is retried from "
                "history at most once. Completed jobs are left alone."
            ),
            form_class=RetryFromHistoryForm,
            act=retry,
            said=said,
            verb="retried",
            left_why=_NOT_RETRIED,
            whole_run=_WHOLE_RUN,
        )

    def object_action_applies(self, name: str, obj: Any) -> bool:
        if name != "retry_jobs":
            return True
        return obj.state in ("failed", "cancelled") and self.retried_as(obj) is None

    @admin.display(description="retried from history as")
    def retried_as(self, obj: Any) -> int | None:
        """The job this one was retried as from history (a job is retried at most once)."""
        with connections[admin_read_alias()].cursor() as c:
            c.execute(query("history_retried_as"), [obj.id])
            row = c.fetchone()
        return None if row is None else row[0]

    def has_retry_job_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.retry_job"))


class JobAdmin(JobDetail, JobListAdmin):
    change_list_template = "admin/awa_django/job_change_list.html"
    acts_on_all_matching = True

    def arrived_by(self, queryset: QuerySet[Any], moment: datetime) -> QuerySet[Any]:
        """Live jobs that were due by ``moment``, or scheduled: a job enqueued, or retried
        from the DLQ (it keeps its id), after a select-all's confirmation is due after it."""
        return queryset.filter(Q(run_at__lte=moment) | Q(state="scheduled"))

    list_display = (
        "id",
        "kind",
        "queue",
        "state_shown",
        "priority",
        "attempt",
        "tag_list",
        "run_at",
    )
    list_filter = (LiveStateFilter, QueueFilter, KindFilter, TagFilter)
    readonly_fields = (
        "id",
        "kind",
        "queue",
        "state_shown",
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
        "attempt_timeline",
    )
    exclude = ("args", "metadata", "result", "progress", "errors", "tags", "state")
    actions = ("cancel_jobs",)

    def get_urls(self) -> list[Any]:
        # The "find a job" box of the job lists and the dashboard.
        find = path("find/", self.admin_site.admin_view(find_job), name="awa_django_find_job")
        return [find, *super().get_urls()]

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        # Which queues are paused: one read for the page, not one per row.
        changelist = super().get_changelist_instance(request)
        paused = paused_queues(using=admin_read_alias())
        for job in changelist.result_list:
            job.queue_paused = job.queue in paused
        return changelist

    @admin.display(description="state", ordering="state")
    def state_shown(self, obj: Any) -> str:
        """The job's state; an available job of a paused queue says that nothing runs it."""
        paused = getattr(obj, "queue_paused", None)
        if paused is None:  # the detail page: one job, one read
            paused = obj.queue in paused_queues(using=admin_read_alias())
        if obj.state == "available" and paused:
            return "available (queue paused: nothing claims it until the queue resumes)"
        if obj.state == "waiting_external":
            return "waiting (for a callback)"
        return str(obj.state)

    @admin.action(description="Cancel selected jobs", permissions=["cancel_job"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "cancel_job")

        def act(
            objects: list[Any], data: dict[str, Any], together: str | None = None
        ) -> tuple[int, int]:
            ordered = sorted(objects, key=lambda o: int(o.id))  # one lock order for all
            done = [o for o in ordered if cancel(o.id, reason="cancelled in admin")]
            suffix = _together(len(done)) if together is None else together
            log_change(request, done, f"cancelled{suffix}")
            return len(done), len(objects) - len(done)

        return confirm_rows(
            self,
            request,
            queryset,
            title="Cancel jobs",
            note="Waiting jobs are cancelled; running handlers are told to stop.",
            form_class=None,
            act=act,
            said=lambda done, _: f"Cancelled {done} job(s).",
            verb="cancelled",
            left_why="finished meanwhile",
            whole_run=_WHOLE_RUN,
        )

    def has_cancel_job_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.cancel_job"))
