"""The operator API: what an operator, the admin and the ``awa_*`` commands do to the queue.

One rule splits it: :mod:`~awa_django.operator.reads` only reads (it never writes; it returns
typed rows), and :mod:`~awa_django.operator.actions` holds every write (each one atomic, in the
caller's transaction or one of its own). :mod:`~awa_django.operator.rows` builds the typed rows.

``cancel``, ``dlq_retry``, ``dlq_purge`` and ``resolve_callback`` are also exported from
``awa_django`` itself, the public API.
"""

from awa_django.operator.actions import (
    DRAIN_BATCH,
    HistoryRetry,
    cancel,
    dlq_purge,
    dlq_retry,
    history_retry,
    queue_dlq,
    queue_drain,
    queue_pause,
    resolve_callback,
    schedule_pause,
    schedule_trigger,
)
from awa_django.operator.reads import (
    DlqEntry,
    JobDetail,
    JobSummary,
    QueueStats,
    RingState,
    ScheduleStatus,
    WorkerStatus,
    dlq_list,
    job_list,
    job_show,
    queue_dlq_enabled,
    queue_stats,
    rings,
    schedules,
    throughput,
    workers,
)

__all__ = [
    "DRAIN_BATCH",
    "DlqEntry",
    "HistoryRetry",
    "JobDetail",
    "JobSummary",
    "QueueStats",
    "RingState",
    "ScheduleStatus",
    "WorkerStatus",
    "cancel",
    "dlq_list",
    "dlq_purge",
    "dlq_retry",
    "history_retry",
    "job_list",
    "job_show",
    "queue_dlq",
    "queue_dlq_enabled",
    "queue_drain",
    "queue_pause",
    "queue_stats",
    "resolve_callback",
    "rings",
    "schedule_pause",
    "schedule_trigger",
    "schedules",
    "throughput",
    "workers",
]
