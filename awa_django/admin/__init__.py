"""The Django admin: read-only views of the queue, with permission-gated operator actions.

Django imports this package (admin autodiscovery), which registers the pages below. Each module
holds one part:

* pages (a ``ModelAdmin`` each): ``jobs`` (live jobs, terminal history, the dead letter queue),
  ``queues`` (the queue list, its actions and the dashboard), ``kinds`` (job kinds' flow
  limits), ``descriptors`` (the queues and kinds declared in code), ``callbacks`` (callback
  waits), ``schedules`` (periodic schedules), ``workers`` (worker processes);
* ``base``: the read-only base of every page (capped counts, permission before data, search
  and URL filters that never raise);
* ``read_alias``: where the pages read (a replica, or the primary when it cannot be read), and
  the banner that says how far behind a replica is;
* ``filters``: list filters whose choices never scan job history;
* ``selection``: the selected rows' keys, in one field of the confirmation page;
* ``actions``: the confirmation page, atomic execution with ``LogEntry`` audit records;
* ``forms``: what an operator types in before an action runs;
* ``display``: escaped JSON, error timelines, sparklines.

Imports run one way: the pages import the parts; ``actions`` imports ``base``, which imports
``filters``, ``selection`` and ``read_alias``; no part imports a page or this package.

Actions call the same operator API (``awa_django.operator``) as the management commands, need
custom permissions, are always confirmed on a separate page, act on at most ``BULK_LIMIT`` rows,
and commit together with one admin ``LogEntry`` per row they changed.
"""

from __future__ import annotations

from django.contrib import admin

from awa_django.admin.actions import confirm
from awa_django.admin.base import CappedPaginator
from awa_django.admin.callbacks import CallbackWaitAdmin
from awa_django.admin.descriptors import DescriptorAdmin
from awa_django.admin.display import error_timeline, pretty, sparkline
from awa_django.admin.forms import FlowLimitsForm
from awa_django.admin.jobs import DeadLetterAdmin, JobAdmin, TerminalJobAdmin
from awa_django.admin.kinds import KindLimitAdmin
from awa_django.admin.queues import QueueStatAdmin
from awa_django.admin.schedules import CronScheduleAdmin
from awa_django.admin.selection import BULK_LIMIT
from awa_django.admin.workers import WorkerAdmin
from awa_django.admin.workflows import WorkflowAdmin
from awa_django.models import (
    CallbackWait,
    CronSchedule,
    DeadLetter,
    Descriptor,
    KindLimit,
    LiveJob,
    QueueStat,
    TerminalJob,
    Worker,
    WorkflowRecord,
)

__all__ = [
    "BULK_LIMIT",
    "CallbackWaitAdmin",
    "CappedPaginator",
    "CronScheduleAdmin",
    "DeadLetterAdmin",
    "DescriptorAdmin",
    "FlowLimitsForm",
    "JobAdmin",
    "KindLimitAdmin",
    "QueueStatAdmin",
    "TerminalJobAdmin",
    "WorkerAdmin",
    "WorkflowAdmin",
    "confirm",
    "error_timeline",
    "pretty",
    "sparkline",
]

admin.site.register(CallbackWait, CallbackWaitAdmin)
admin.site.register(DeadLetter, DeadLetterAdmin)
admin.site.register(TerminalJob, TerminalJobAdmin)
admin.site.register(LiveJob, JobAdmin)
admin.site.register(QueueStat, QueueStatAdmin)
admin.site.register(Worker, WorkerAdmin)
admin.site.register(CronSchedule, CronScheduleAdmin)
admin.site.register(KindLimit, KindLimitAdmin)
admin.site.register(Descriptor, DescriptorAdmin)
admin.site.register(WorkflowRecord, WorkflowAdmin)
