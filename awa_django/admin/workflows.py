"""The admin page of workflows and batches (``WorkflowRecord``): the list (state, progress),
each one's page with its steps drawn as a graph (docs/workflows.md), and the actions: cancel
a workflow, retry its dead-lettered steps (each needs ``awa_django.manage_workflow``, is
confirmed on a separate page and logged, like every admin action)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from awa_django.admin.actions import confirm, log_change
from awa_django.admin.base import ReadOnlyAdmin
from awa_django.admin.read_alias import admin_read_alias
from awa_django.admin.selection import job_id_key
from awa_django.admin.workflow_graph import MAX_DRAWN, workflow_svg
from awa_django.models import WorkflowRecord
from awa_django.operator import cancel_workflow, retry_workflow, workflow_steps

__all__ = ["WorkflowAdmin"]

#: The most steps listed under the graph of a large workflow or batch.
_LISTED = 200


def _job_url(job_id: int) -> str:
    return reverse("admin:awa_django_find_job") + "?" + urlencode({"id": job_id})


class WorkflowAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "kind", "state", "progress", "created_at", "finished_at")
    list_filter = ("state", "kind")
    search_fields = ("name",)
    fields = (
        "id",
        "name",
        "kind",
        "state",
        "progress",
        "created_at",
        "finished_at",
        "graph",
    )
    readonly_fields = fields
    actions = ("cancel_workflows", "retry_workflows")
    selection_noun = "workflows"

    @staticmethod
    def selection_key(text: str) -> Any:
        return job_id_key(text)

    @admin.display(description="progress")
    def progress(self, obj: WorkflowRecord) -> str:
        ended = obj.completed + obj.failed + obj.cancelled + obj.skipped
        parts = [f"{ended:,} of {obj.steps:,} steps ended"]
        parts += [
            f"{n:,} {what}"
            for what, n in (
                ("completed", obj.completed),
                ("failed", obj.failed),
                ("cancelled", obj.cancelled),
                ("skipped", obj.skipped),
            )
            if n
        ]
        return ", ".join(parts)

    @admin.display(description="steps")
    def graph(self, obj: WorkflowRecord) -> SafeString:
        steps = workflow_steps(obj.id, limit=max(MAX_DRAWN, _LISTED) + 1, using=admin_read_alias())
        if len(steps) <= MAX_DRAWN:
            return format_html(
                '<div style="overflow:auto;max-width:100%">{}</div>', workflow_svg(steps, _job_url)
            )
        listed = format_html_join(
            "",
            '<li><a href="{}">{}</a>: {}</li>',
            ((_job_url(s.job_id), s.step, s.state) for s in steps[:_LISTED]),
        )
        return format_html(
            "<p>{} steps: too many to draw; the first {} are listed.</p><ul>{}</ul>",
            f"{obj.steps:,}",
            _LISTED,
            listed,
        )

    def _workflows(
        self, request: HttpRequest, queryset: QuerySet[Any], *, title: str, note: str, act: Any
    ) -> HttpResponse | None:
        self._checked(request, "manage_workflow")

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            done = [act(w) for w in objects]
            for record, message in zip(objects, done, strict=True):
                log_change(request, [record], message)
            return f"{title}: " + "; ".join(
                f"{w.kind} {w.id} {m}" for w, m in zip(objects, done, strict=True)
            )

        return confirm(
            self, request, queryset, title=title, note=note, form_class=None, perform=perform
        )

    @admin.action(description="Cancel selected workflows", permissions=["manage_workflow"])
    def cancel_workflows(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        return self._workflows(
            request,
            queryset,
            title="Cancel workflows",
            note=(
                "Every step that has not ended is cancelled: steps waiting for their "
                "dependencies, available and running jobs (a running handler is told to stop), "
                "and dead-lettered steps."
            ),
            act=lambda w: f"cancelled {cancel_workflow(w.id)} step(s)",
        )

    @admin.action(
        description="Retry the dead-lettered steps of selected workflows",
        permissions=["manage_workflow"],
    )
    def retry_workflows(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._workflows(
            request,
            queryset,
            title="Retry workflows",
            note=(
                "Every dead-lettered step runs again; once it completes, the steps waiting "
                "for it are released and the workflow goes on."
            ),
            act=lambda w: f"retried {len(retry_workflow(w.id))} step(s)",
        )

    def has_manage_workflow_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.manage_workflow"))
