"""The admin page of periodic schedules (docs/periodic.md): next and last fire, the last job's
state; pause, resume and trigger."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse

from awa_django.admin.actions import admin_actor, confirm, log_change
from awa_django.admin.base import ReadOnlyAdmin
from awa_django.admin.display import pretty
from awa_django.cron import next_fire
from awa_django.limits import check_text
from awa_django.models import CronSchedule
from awa_django.operator import schedule_pause, schedule_trigger

__all__ = ["CronScheduleAdmin"]


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

    def object_action_applies(self, name: str, obj: Any) -> bool:
        if name in ("pause_schedules", "resume_schedules"):
            return (obj.paused_at is not None) == (name == "resume_schedules")
        return True

    def has_manage_schedule_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.manage_schedule"))
