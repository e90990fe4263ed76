"""The admin page of worker processes (``awa.runtime_instances``): host, pid, leader,
concurrency, queues, when each started and was last seen."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from awa_django.admin.base import ReadOnlyAdmin
from awa_django.limits import check_uuid
from awa_django.models import Worker

__all__ = ["WorkerAdmin"]


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
