"""The admin page of job kinds' flow limits (docs/flow.md, "Per kind"): every kind with a row
in ``awa.flow_kind_limits``, with its limit, permits in use, rate, parked jobs and who set
them; the "Set flow limits of selected kinds" action and the "limit a kind" page (for a kind
that has no row yet). Both need the ``manage_queue`` permission, call the operator API
(``set_kind_limits``, ``clear_kind_limits``) and log one ``LogEntry`` per kind they changed,
as the queue list's "Set flow limits" does.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from awa_django.admin.actions import admin_actor, confirm, log_change, run_atomically
from awa_django.admin.base import ReadOnlyAdmin
from awa_django.admin.forms import KindFlowLimitsForm, LimitKindForm, limits_in_force
from awa_django.conf import awa_settings
from awa_django.limits import check_kind_name, rate_text
from awa_django.models import KindLimit
from awa_django.operator import KindLimits, clear_kind_limits, kind_limits, set_kind_limits

__all__ = ["KindLimitAdmin"]


class KindLimitAdmin(ReadOnlyAdmin):
    list_display = ("kind", "global_limit", "limit_in_use", "rate_and_burst", "parked", "limits_by")
    # The detail page in the list's words: a rate with its burst, not the row's raw numbers.
    fields = (*list_display, "updated_at")
    readonly_fields = fields
    actions = ("limit_kinds",)
    selection_noun = "kinds"

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        row = super().get_object(request, object_id, from_field)
        if row is not None:  # the permits in use and parked jobs, as the list reads them
            row.flow_status = next((k for k in kind_limits() if k.kind == row.kind), None)
        return row

    @staticmethod
    def selection_key(text: str) -> Any:
        return check_kind_name(text)

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        # Permits in use and parked jobs of the page's kinds in one read, on the primary (its
        # lock table holds the permits), as the queue list does.
        changelist = super().get_changelist_instance(request)
        status = {k.kind: k for k in kind_limits()}
        for row in changelist.result_list:
            row.flow_status = status.get(row.kind)
        return changelist

    @admin.display(description="global limit")
    def global_limit(self, obj: KindLimit) -> str:
        return "-" if obj.max_running is None else str(obj.max_running)

    @admin.display(description="in use")
    def limit_in_use(self, obj: KindLimit) -> str:
        status = _status(obj)
        if status is None or status.global_concurrency is None:
            return "-"
        return str(status.in_use or 0)

    # Not named "rate": the model's field of that name would be shown instead, raw ("2.0").
    @admin.display(description="rate")
    def rate_and_burst(self, obj: KindLimit) -> str:
        status = _status(obj)
        if status is None or status.rate_limit is None:
            return "-"
        return f"{rate_text(status.rate_limit)}/s (burst {status.burst_in_force})"

    @admin.display(description="parked")
    def parked(self, obj: KindLimit) -> str:
        status = _status(obj)
        return "0" if status is None else str(status.waiting)

    @admin.display(description="limits by")
    def limits_by(self, obj: KindLimit) -> str:
        return f"{obj.source}: {obj.updated_by or '?'}"

    @admin.action(description="Set flow limits of selected kinds", permissions=["manage_queue"])
    def limit_kinds(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        self._checked(request, "manage_queue")
        by = admin_actor(request)
        current = {k.kind: k for k in kind_limits()}

        def perform(objects: list[Any], data: dict[str, Any]) -> str:
            done = []
            for row in objects:
                if data.get("clear"):
                    now = clear_kind_limits(row.kind, actor=by)
                    verb = "cleared"
                else:
                    now = set_kind_limits(
                        row.kind,
                        global_concurrency=data.get("global_concurrency"),
                        rate_limit=data.get("rate_limit"),
                        rate_burst=data.get("rate_burst"),
                        actor=by,
                    )
                    verb = "set"
                shown = "no limits" if now is None else now.summary(in_use=False)
                message = f"flow limits {verb}: {shown}"
                log_change(request, [row], message)
                done.append(f"{row.kind} {message}")
            return "Set flow limits: " + "; ".join(done)

        def describe(row: KindLimit) -> str:
            limits = current.get(row.kind)
            return f"{row.kind}: {limits.summary() if limits else 'no flow limits'} now"

        return confirm(
            self,
            request,
            queryset,
            title="Set flow limits of job kinds",
            note=(
                "The form shows the limits in force. The limits given replace each kind's "
                "flow limits in every queue and across every worker: a limit left empty is "
                "lifted, also one @job or AWA['KINDS'] sets, until cleared. Workers apply them "
                "from their next claim. docs/flow.md."
            ),
            form_class=KindFlowLimitsForm,
            perform=perform,
            describe=describe,
            initial=lambda objects: self._limits_now(
                request, [current.get(o.kind) for o in objects]
            ),
        )

    def _limits_now(self, request: HttpRequest, limits: list[Any]) -> dict[str, Any]:
        initial = limits_in_force(limits)
        if initial is None:
            self.message_user(
                request,
                "The selected kinds have different flow limits: the form is empty, and the "
                "limits given replace each one's whole.",
                messages.WARNING,
            )
        return initial or {}

    def has_manage_queue_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("awa_django.manage_queue"))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # "Add" is the "limit a kind" page (a kind with no row yet): an operator override.
        return self.has_manage_queue_permission(request)

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = LimitKindForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            kind = data["kind"]

            def perform() -> str:
                now = set_kind_limits(
                    kind,
                    global_concurrency=data.get("global_concurrency"),
                    rate_limit=data.get("rate_limit"),
                    rate_burst=data.get("rate_burst"),
                    actor=admin_actor(request),
                )
                message = f"flow limits set: {now.summary(in_use=False)}"
                row = KindLimit.objects.using(awa_settings.DATABASE_ALIAS).get(pk=kind)
                log_change(request, [row], message)
                return f"{kind} {message}"

            self.message_user(request, run_atomically(perform), messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:awa_django_kindlimit_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Limit a job kind",
            "opts": self.model._meta,
            "form": form,
        }
        return TemplateResponse(request, "admin/awa_django/kindlimit/limit_kind.html", context)


def _status(obj: KindLimit) -> KindLimits | None:
    status = getattr(obj, "flow_status", None)
    return status if isinstance(status, KindLimits) else None
