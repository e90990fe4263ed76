"""The operator API: what an operator, the admin and the ``awa_*`` commands do to the queue.

One rule splits it: :mod:`~awa_django.operator.reads` only reads (it never writes; it returns
typed rows), and :mod:`~awa_django.operator.actions` holds every write (each one atomic, in the
caller's transaction or one of its own). :mod:`~awa_django.operator.rows` builds the typed rows.

``cancel``, ``dlq_retry``, ``dlq_purge``, ``resolve_callback`` and ``extend_callback`` are also
exported from ``awa_django`` itself, the public API.
"""

from awa_django.operator.actions import (
    DRAIN_BATCH,
    HistoryRetry,
    cancel,
    clear_queue_limits,
    dlq_purge,
    dlq_retry,
    extend_callback,
    history_retry,
    queue_dlq,
    queue_drain,
    queue_pause,
    resolve_callback,
    schedule_pause,
    schedule_trigger,
    set_queue_limits,
)
from awa_django.operator.kinds import (
    KindLimits,
    clear_kind_limits,
    kind_limits,
    set_kind_limits,
)
from awa_django.operator.reads import (
    DlqEntry,
    JobDetail,
    JobSummary,
    QueueLimits,
    QueueStats,
    ReplicaStatus,
    RingState,
    ScheduleStatus,
    WorkerStatus,
    dlq_list,
    job_list,
    job_show,
    queue_dlq_enabled,
    queue_limits,
    queue_stats,
    replica_status,
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
    "KindLimits",
    "QueueLimits",
    "QueueStats",
    "ReplicaStatus",
    "RingState",
    "ScheduleStatus",
    "WorkerStatus",
    "cancel",
    "clear_kind_limits",
    "clear_queue_limits",
    "dlq_list",
    "dlq_purge",
    "dlq_retry",
    "extend_callback",
    "history_retry",
    "job_list",
    "job_show",
    "kind_limits",
    "queue_dlq",
    "queue_dlq_enabled",
    "queue_drain",
    "queue_limits",
    "queue_pause",
    "queue_stats",
    "replica_status",
    "resolve_callback",
    "rings",
    "schedule_pause",
    "schedule_trigger",
    "schedules",
    "set_kind_limits",
    "set_queue_limits",
    "throughput",
    "workers",
]
