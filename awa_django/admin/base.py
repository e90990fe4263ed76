"""The base of awa_django's admin pages: read-only, bounded, and robust to any URL.

* Lists never count a whole table: :class:`CappedPaginator` counts at most ``CAP + 1`` rows,
  ``show_full_result_count`` is off, and filter facets (which count per choice) are never
  shown.
* Detail, history and delete pages refuse staff without the view permission (403) before
  reading the row.
* Search (:class:`JobListAdmin`) and URL filters never raise on any input: a value no row can
  hold (out of ``bigint`` range, NUL, lone surrogates, too long) finds nothing, and a field
  lookup whose value PostgreSQL cannot take is refused (400).
* Lists and detail pages read from ``AWA["READ_DATABASE_ALIAS"]`` (a streaming replica; by
  default ``AWA["DATABASE_ALIAS"]``), and a list read from a standby says how far behind its
  primary it is (``read_alias.replica_banner``). Actions act on ``AWA["DATABASE_ALIAS"]``, on
  the rows as the primary has them (``awa_django.admin.actions.confirm``).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import SEARCH_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, PageNotAnInteger, Paginator
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.functional import cached_property

from awa_django.admin.display import when
from awa_django.admin.filters import KIND_MAX_LENGTH, storable
from awa_django.admin.find_job import job_page, place
from awa_django.admin.read_alias import admin_read_alias, choose_read_alias
from awa_django.admin.selection import job_id_key, valid_key
from awa_django.limits import MAX_BIGINT, MAX_TEXT

__all__ = ["CappedPaginator", "JobListAdmin", "ReadOnlyAdmin", "search_jobs"]

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() is also true for "²" and "٣"


_SELECTED = re.compile(r"\s*(?:of |for )?selected (?:failed or cancelled )?\w+")


def _description(action: Any) -> str:
    """An action's description: an attribute on Django 6 (indexing it is deprecated there),
    the third item of its tuple before."""
    found = getattr(action, "description", None)
    return str(found if found is not None else action[2])


def _button_label(description: str) -> str:
    """A list action's description as its button on one row's page: "Retry selected jobs" is
    "Retry", "Turn the DLQ on for selected queues" is "Turn the DLQ on"."""
    label = _SELECTED.sub("", description, count=1).replace("(as new jobs)", "(as a new job)")
    return label.strip() or description


class CappedPaginator(Paginator):  # type: ignore[type-arg]
    """Counts at most ``CAP + 1`` rows: a queue's history can be millions of rows.

    The count is ``SELECT count(*) FROM (SELECT pk ... LIMIT CAP + 1)``, without the list's
    ordering (which does not change how many rows there are). A list of more than ``CAP``
    rows says "more than 10,000" and pages on past them, up to page ``MAX_PAGE`` (an offset
    costs the rows it skips: narrow a longer list with its filters). A page past the end is
    the last page, and ``asked`` keeps the number asked for, so the list can say so.
    """

    CAP = 10_000
    MAX_PAGE = 1_000
    #: The page number asked for when it was past the end, and the page shown instead.
    asked: int | None = None
    landed: int = 1

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if isinstance(rows, QuerySet):
            return rows.order_by().values("pk")[: self.CAP + 1].count()
        return len(rows[: self.CAP + 1])

    @property
    def capped(self) -> bool:
        """Whether the list holds more rows than it counts."""
        return self.count > self.CAP

    @property
    def shown_count(self) -> str:
        """The row count for people: ``1,234``, or ``more than 10,000``."""
        return f"more than {self.CAP:,}" if self.capped else f"{self.count:,}"

    @property
    def last_page(self) -> int:
        return self.MAX_PAGE if self.capped else int(self.num_pages)

    def validate_number(self, number: Any) -> int:
        try:
            valid = max(int(number), 1)
        except (TypeError, ValueError):
            raise PageNotAnInteger("That page number is not an integer") from None
        if valid > self.last_page:
            self.asked, valid = valid, self.last_page
        return valid

    def get_elided_page_range(
        self, number: Any = 1, *, on_each_side: int = 3, on_ends: int = 2
    ) -> Any:
        if not self.capped:
            yield from super().get_elided_page_range(
                number, on_each_side=on_each_side, on_ends=on_ends
            )
            return
        # More rows than counted: no last page to link to, only the pages around this one.
        number = self.validate_number(number)
        start = max(number - on_each_side, 1)
        if start > on_ends + 2:
            yield from range(1, on_ends + 1)
            yield self.ELLIPSIS
        else:
            start = 1
        yield from range(start, min(number + on_each_side, self.last_page) + 1)
        if number + on_each_side < self.last_page:
            yield self.ELLIPSIS

    def page(self, number: Any) -> Any:
        if not self.capped:
            self.landed = self.validate_number(number)
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        rows = list(self.object_list[bottom : bottom + self.per_page])
        if not rows and number > 1:
            # Past the end of a list longer than the count: its last page, found by counting
            # up to this page (at most MAX_PAGE pages of keys).
            keys = self.object_list
            if isinstance(keys, QuerySet):
                rows_before = keys.order_by().values("pk")[:bottom].count()
            else:
                rows_before = len(keys[:bottom])
            self.asked = self.asked or number
            number = max(math.ceil(rows_before / self.per_page), 1)
            bottom = (number - 1) * self.per_page
            rows = list(self.object_list[bottom : bottom + self.per_page])
        self.landed = number
        return Page(rows, number, self)


def search_jobs(
    queryset: QuerySet[Any], search_term: str, *, whole_kind: bool = False
) -> QuerySet[Any]:
    """Jobs matching ``search_term``: an id (ASCII digits), or part of a kind (any case), or
    with ``whole_kind`` exactly a kind (an index range of history instead of a read of all of it).

    Never raises: an id beyond ``bigint``, or a text no kind can contain (NUL, lone
    surrogates, longer than a kind), matches nothing.
    """
    term = search_term.strip()
    if not term:
        return queryset
    if _DIGITS.fullmatch(term):
        if len(term) > 19 or int(term) > MAX_BIGINT:
            return queryset.none()
        return queryset.filter(pk=int(term))
    if not storable(term, KIND_MAX_LENGTH):
        return queryset.none()
    if whole_kind:
        return queryset.filter(kind=term)
    return queryset.filter(kind__icontains=term)


class RefusedSearchChangeList(ChangeList):
    """A list whose search Django's own form refused (a NUL in ``?q=``: "Null characters are
    not allowed") shows nothing, where Django shows every row: "Select all" and an action
    must never act on the whole table because a search could not be read."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> Any:
        queryset = super().get_queryset(request, exclude_parameters)
        if SEARCH_VAR in request.GET and not self.search_form_class(request.GET).is_valid():
            return queryset.none()
        return queryset


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """No add, change or delete (so no "delete selected" either); view only, plus explicit
    actions (see ``awa_django.admin.actions``)."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RefusedSearchChangeList

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedPaginator
    list_per_page = 50
    #: What the confirmation page calls the selected rows.
    selection_noun = "jobs"
    #: Whether "Select all" past 1,000 rows runs the actions in batches (admin/bulk.py).
    acts_on_all_matching = False
    #: The field saying when a row joined this list (``dlq_at``): such a run leaves rows that
    #: joined after its confirmation, as well as rows with a higher key (admin/bulk.py).
    arrived_field: str | None = None

    def arrived_by(self, queryset: QuerySet[Any], moment: datetime) -> QuerySet[Any]:
        """The rows of ``queryset`` that were in this list at ``moment`` (the database clock
        at a select-all's confirmation), as far as the rows tell: by :attr:`arrived_field`."""
        if self.arrived_field is None:
            return queryset
        return queryset.filter(**{f"{self.arrived_field}__lte": moment})

    def __init__(self, model: Any, admin_site: Any) -> None:
        super().__init__(model, admin_site)
        # Every date-time column and field is shown by display.when (relative, the absolute
        # time to the second on hover): each becomes a "<name>_when" display of this admin,
        # sorted by its field where the field was sortable.
        times = {f.name for f in model._meta.get_fields() if isinstance(f, models.DateTimeField)}

        self._times = times

        self.list_display = self._shown(self.list_display)

    def _shown(self, names: Any) -> Any:
        if names is None:
            return None
        return type(names)(self._when(n) if n in self._times else n for n in names)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._shown(super().get_readonly_fields(request, obj))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.fields:
            return self._shown(self.fields)
        return super().get_fields(request, obj)

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> Any:
        # The fields shown through their "<name>_when" display, not as form fields.
        return (*(super().get_exclude(request, obj) or ()), *sorted(self._times))

    def get_sortable_by(self, request: HttpRequest) -> Any:
        sortable = super().get_sortable_by(request)
        return (*sortable, *(f"{n}_when" for n in sortable if n in self._times))

    def _when(self, name: str) -> str:
        field = self.model._meta.get_field(name)

        def show(obj: Any) -> str:
            return when(getattr(obj, name))

        show.short_description = field.verbose_name  # type: ignore[attr-defined]
        show.admin_order_field = name  # type: ignore[attr-defined]
        setattr(self, f"{name}_when", show)
        return f"{name}_when"

    @staticmethod
    def selection_key(text: str) -> Any:
        """A primary key from its text in a selection (``ValueError`` when it is not one)."""
        return job_id_key(text)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Lists and detail pages read from the read alias (a replica, or the primary).
        queryset: QuerySet[Any] = super().get_queryset(request).using(admin_read_alias())
        return queryset

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        # Django checks the permission only after loading the row: check it first, so that
        # staff without it get 403 whatever the row holds, and the row is never read for them.
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if from_field is None and not valid_key(object_id, self.selection_key):
            return None  # not a key at all (NUL, out of range): "does not exist", never a 500
        return super().get_object(request, object_id, from_field)

    def url_lookups(self) -> set[str]:
        """The URL parameters a list accepts: its filters' own and its primary key's."""
        pk = self.model._meta.pk.name
        names = {pk, f"{pk}__in", f"{pk}__exact"}
        for spec in self.list_filter:
            if isinstance(spec, type) and issubclass(spec, admin.SimpleListFilter):
                names.add(str(spec.parameter_name))
            else:
                field = spec[0] if isinstance(spec, tuple | list) else str(spec)
                names |= {field, f"{field}__exact", f"{field}__isnull"}
                names |= {f"{field}__gte", f"{field}__lt"}  # a date filter's range
        return names

    def lookup_allowed(self, lookup: str, value: Any, request: HttpRequest | None = None) -> bool:
        # Only the list's own filters: any other field lookup from the URL (?args__contains=,
        # ?kind__regex=, ?attempt=) would read a whole history, or fail in the database (an
        # invalid regex, a year PostgreSQL has but Python has not). Refused: 400.
        if lookup not in self.url_lookups():
            return False
        # A value PostgreSQL cannot take would fail in the database (500); refused: 400.
        values = value if isinstance(value, list | tuple) else [value]
        if not all(isinstance(v, str) and storable(v, MAX_TEXT) for v in values):
            return False
        return bool(super().lookup_allowed(lookup, value, request))  # type: ignore[arg-type]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        posted = request.POST.getlist("action") if request.method == "POST" else []
        if any(a in (self.actions or ()) and a not in self.get_actions(request) for a in posted):
            # An action of this page the user may not run (its button and its entry in the
            # list are not shown): a forged POST, refused as such.
            raise PermissionDenied
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if not all(valid_key(text, self.selection_key) for text in selected):
            self.message_user(
                request, "The selection was not understood; nothing was changed.", messages.ERROR
            )
            return HttpResponseRedirect(request.get_full_path())
        banner = choose_read_alias()
        if banner is not None and request.method == "GET":
            self.message_user(request, banner[1], banner[0])
        response = super().changelist_view(request, extra_context)
        changelist = getattr(response, "context_data", None) or {}
        paginator = getattr(changelist.get("cl"), "paginator", None)
        if isinstance(paginator, CappedPaginator) and paginator.asked is not None:
            changelist["cl"].page_num = paginator.landed
            self.message_user(
                request,
                f"There is no page {paginator.asked:,}: this is the last page, "
                f"{paginator.landed:,}"
                + (
                    " (narrow a longer list with its filters)."
                    if paginator.capped and paginator.landed >= paginator.MAX_PAGE
                    else "."
                ),
                messages.WARNING,
            )
        return response

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        banner = choose_read_alias()
        if banner is not None and banner[0] >= messages.WARNING and request.method == "GET":
            self.message_user(request, banner[1], banner[0])
        response = super().change_view(request, object_id, form_url, extra_context)
        context = getattr(response, "context_data", None)
        if context is not None and context.get("original") is not None:
            # The row's own actions, as buttons on its page: each posts the list's action for
            # this one row, so it is confirmed, permission-checked and logged like any other.
            original = context["original"]
            context["object_actions"] = [
                (name, _button_label(_description(action)))
                for name, action in self.get_actions(request).items()
                if action is not None and self.object_action_applies(name, original)
            ]
            context["object_key"] = str(original.pk)
        return response

    def object_action_applies(self, name: str, obj: Any) -> bool:
        """Whether the action ``name`` is offered on ``obj``'s own page (all of them, unless a
        page says otherwise: a paused queue is not offered Pause)."""
        return True

    def _checked(self, request: HttpRequest, perm: str) -> None:
        # The action list already hides actions without permission; a forged POST is refused.
        if not request.user.has_perm(f"awa_django.{perm}"):
            raise PermissionDenied


class JobListAdmin(ReadOnlyAdmin):
    """A list of jobs, searched by job id or kind (see :func:`search_jobs`).

    A job's page that no longer has it (a live job that finished, a DLQ job retried) leads to
    the page that has it now: the live jobs, history or the DLQ, whichever holds it; a job
    that is nowhere (aged out of history, purged) leads to this list, saying so.
    """

    search_fields = ("kind",)
    search_help_text = "A job id, or part of a job kind."
    #: Search by a whole kind only (lists over retained history: see :func:`search_jobs`).
    search_whole_kind = False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return search_jobs(queryset, search_term, whole_kind=self.search_whole_kind), False

    def _get_obj_does_not_exist_redirect(
        self, request: HttpRequest, opts: Any, object_id: str
    ) -> HttpResponseRedirect:
        found = job_page(object_id)
        if found is not None and found[0] != opts.model_name:
            model, state, key = found
            self.message_user(request, f"Job {key} is {place(model, state)} now.")
            return HttpResponseRedirect(reverse(f"admin:awa_django_{model}_change", args=[key]))
        self.message_user(
            request,
            f"No job {object_id!r} here: it finished, left the DLQ, or aged out of history "
            "(search for its id on the other job lists).",
            messages.WARNING,
        )
        return HttpResponseRedirect(reverse(f"admin:awa_django_{opts.model_name}_changelist"))
