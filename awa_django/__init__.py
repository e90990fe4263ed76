"""awa_django: a Postgres-native, transactional background job queue for Django.

Public API (everything else is internal)::

    from awa_django import job, enqueue, enqueue_many

Jobs enqueued inside ``transaction.atomic()`` commit or roll back with the caller's rows.
Delivery is at-least-once: each attempt is fenced by ``(job_id, run_lease)``.
"""

from awa_django._version import __version__ as __version__
from awa_django.context import JobContext
from awa_django.exceptions import (
    AwaError,
    DuplicateJobError,
    InvalidArgumentsError,
    InvalidOptionError,
    IsolationLevelError,
    JobFailedError,
    JobValidationError,
    LimitExceededError,
    TerminalError,
    UnknownKindError,
)
from awa_django.jobs import Job, JobOptions, get_job, job
from awa_django.middleware import JobCall
from awa_django.operator.actions import (
    cancel,
    dlq_purge,
    dlq_retry,
    extend_callback,
    resolve_callback,
)
from awa_django.outcomes import Cancel, RetryAfter, Snooze, WaitForCallback
from awa_django.producer import aenqueue, aenqueue_many, enqueue, enqueue_many
from awa_django.retry import RetryPolicy
from awa_django.types import EnqueuedJob, JobRequest
from awa_django.workflows import (
    Batch,
    Step,
    Workflow,
    WorkflowRun,
    batch,
    chain,
    chord,
    get_workflow,
    group,
    workflow,
)

__all__ = [
    "AwaError",
    "Batch",
    "Cancel",
    "DuplicateJobError",
    "EnqueuedJob",
    "InvalidArgumentsError",
    "InvalidOptionError",
    "IsolationLevelError",
    "Job",
    "JobCall",
    "JobContext",
    "JobFailedError",
    "JobOptions",
    "JobRequest",
    "JobValidationError",
    "LimitExceededError",
    "RetryAfter",
    "RetryPolicy",
    "Snooze",
    "Step",
    "TerminalError",
    "UnknownKindError",
    "WaitForCallback",
    "Workflow",
    "WorkflowRun",
    "aenqueue",
    "aenqueue_many",
    "batch",
    "cancel",
    "chain",
    "chord",
    "dlq_purge",
    "dlq_retry",
    "enqueue",
    "enqueue_many",
    "extend_callback",
    "get_job",
    "get_workflow",
    "group",
    "job",
    "resolve_callback",
    "workflow",
]
