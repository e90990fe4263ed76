"""Periodic jobs as the database stores them: declared schedules resolved against the job
registry, and the system check that needs the registry (awa.E008).

:mod:`awa_django.cron` validates what can be validated without the registry (expression, time
zone, catch-up policy, names: awa.E007). Here each valid schedule is resolved into the row
``awa.cron_sync_v1`` takes: its kind must be registered, and its arguments and options are
validated and encoded exactly as an enqueue would (``build_request``), with the job's own
options under the schedule's overrides. A schedule that does not resolve is reported, and
left out of the sync (so it does not fire).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, register
from django.core.exceptions import ImproperlyConfigured

from awa_django import cron
from awa_django.conf import get_awa_settings
from awa_django.db.enqueue import build_request
from awa_django.exceptions import AwaError
from awa_django.jobs import get_job

__all__ = ["check_schedule_jobs", "schedule_rows", "sync_payload"]


def schedule_rows() -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of every declared schedule that is valid and resolves, by name, and the
    problems of the others (each naming its schedule)."""
    schedules, problems = cron.declared(get_awa_settings().PERIODIC)
    rows, unresolved = _resolve(schedules)
    return rows, problems + unresolved


def _resolve(schedules: list[cron.Schedule]) -> tuple[list[dict[str, Any]], list[str]]:
    problems: list[str] = []
    rows = []
    for schedule in schedules:
        try:
            handle = get_job(schedule.kind)
            if schedule.options:
                handle = handle.using(**schedule.options)
            request = build_request(
                schedule.kind, list(schedule.args), dict(schedule.kwargs), handle.options
            )
        except (AwaError, TypeError, ValueError) as exc:
            problems.append(f"schedule {schedule.name!r} (job {schedule.kind!r}): {exc}")
            continue
        rows.append(
            {
                "name": schedule.name,
                "kind": schedule.kind,
                "cron_expr": schedule.cron,
                "timezone": schedule.timezone,
                "catch_up": schedule.catch_up_limit,
                "queue": request.queue,
                "priority": request.priority,
                "max_attempts": request.max_attempts,
                "args": json.loads(request.args_json),
                "deadline_secs": request.deadline,
                "metadata": None
                if request.metadata_json is None
                else json.loads(request.metadata_json),
                "tags": list(request.tags) if request.tags else None,
            }
        )
    return rows, problems


def sync_payload() -> tuple[str, list[str]]:
    """The JSON array ``awa.cron_sync_v1`` takes, and the problems of the schedules left out."""
    rows, problems = schedule_rows()
    return json.dumps(rows), problems


@register()
def check_schedule_jobs(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """awa.E008: every valid declared schedule resolves: its job kind is registered and its
    arguments and options are valid. (awa.E007, in ``awa_django.checks``, reports schedules
    that are not valid in themselves.)"""
    try:
        cfg = get_awa_settings()
    except ImproperlyConfigured:
        return []  # awa.E005's to report
    schedules, _ = cron.declared(cfg.PERIODIC)
    _, problems = _resolve(schedules)
    return [
        Error(
            problem,
            hint="Fix the schedule (docs/periodic.md); until then it is not synced and does "
            "not fire.",
            id="awa.E008",
        )
        for problem in problems
    ]
