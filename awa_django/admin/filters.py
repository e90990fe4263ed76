"""The admin's list filters: choices that never scan job history.

Django's default filter on a field lists its choices with ``SELECT DISTINCT`` over the whole
table, which on terminal history is a scan of millions of rows per page view. These filters
take their choices from somewhere cheap instead:

* state: the fixed states of the list (terminal outcomes, or live states);
* queue: the queue registry (``awa.queue_lanes`` and ``awa.queue_meta``, small control tables);
* kind: the job kinds registered in this process with ``@job``;
* tag: the tags the job kinds registered in this process carry by default.

A value that is not one of the choices still filters (``?queue=reports`` works for a queue
without lanes yet); a value that no row can hold (a bad queue name, NUL, a lone surrogate, an
unknown state) gives an empty list, never an error.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib import admin
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest

from awa_django.admin.read_alias import admin_read_alias
from awa_django.exceptions import InvalidOptionError
from awa_django.jobs import registered_kinds
from awa_django.limits import MAX_TEXT, QUEUE_NAME_RE, check_text
from awa_django.sql import query
from awa_django.states import LIVE_STATES, TERMINAL_STATES, JobState

__all__ = [
    "KIND_MAX_LENGTH",
    "KindFilter",
    "LiveStateFilter",
    "QueueFilter",
    "TagFilter",
    "TerminalStateFilter",
    "storable",
]

#: The longest job kind the engine accepts (``awa._job_request_error_v1``).
KIND_MAX_LENGTH = 255

#: At most this many queues are offered as choices (any other still filters by URL).
QUEUE_CHOICES = 500


def storable(text: str, max_length: int) -> bool:
    """True when PostgreSQL can hold ``text`` (no NUL, no lone surrogate) within
    ``max_length`` characters: a value that could never match a row is not sent at all."""
    try:
        check_text("value", text, max_length=max_length)
    except InvalidOptionError:
        return False
    return True


class _ChoiceFilter(admin.SimpleListFilter):
    """A filter whose value always applies, even when there is nothing to offer as choices."""

    def has_output(self) -> bool:
        return bool(self.lookup_choices) or self.value() is not None


class _StateFilter(_ChoiceFilter):
    title = "state"
    parameter_name = "state"
    states: ClassVar[tuple[JobState, ...]] = ()

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state.value, str(state.label)) for state in self.states]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if value not in self.states:
            return queryset.none()
        return queryset.filter(state=value)


class TerminalStateFilter(_StateFilter):
    """Outcome of a finished job."""

    states = TERMINAL_STATES


class LiveStateFilter(_StateFilter):
    """State of a job not finished yet."""

    states = LIVE_STATES


class QueueFilter(_ChoiceFilter):
    """Queues from the queue registry (lanes and queue metadata), not from the jobs."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        with connections[admin_read_alias()].cursor() as cursor:
            cursor.execute(query("admin_queue_names"), [QUEUE_CHOICES])
            return [(str(row[0]), str(row[0])) for row in cursor.fetchall()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if QUEUE_NAME_RE.fullmatch(value) is None:
            return queryset.none()
        return queryset.filter(queue=value)


class KindFilter(_ChoiceFilter):
    """Job kinds registered in this process; other kinds through search or ``?kind=``."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in sorted(registered_kinds())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if not storable(value, KIND_MAX_LENGTH):
            return queryset.none()
        return queryset.filter(kind=value)


class TagFilter(_ChoiceFilter):
    """Jobs carrying one tag. Choices: the default tags of the kinds registered in this
    process; any other tag through ``?tag=``."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        tags = {tag for job in registered_kinds().values() for tag in job.options.tags}
        return [(tag, tag) for tag in sorted(tags)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if not storable(value, MAX_TEXT):
            return queryset.none()
        return queryset.filter(tags__has_tag=value)
