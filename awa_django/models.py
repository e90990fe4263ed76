"""Read-only, unmanaged models over the engine's read surfaces, for the Django admin.

Nothing is ever written through them: ``save()``, ``delete()`` and the queryset's bulk writes
raise ``ReadOnlyError``. Every change goes through an SQL function of the engine, by way of
``awa_django.operator.actions``, which the admin actions call. A job's ``state`` is one of
:class:`~awa_django.states.JobState` (its ``choices``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

from awa_django.sql import table_name
from awa_django.states import JobState

__all__ = [
    "CallbackWait",
    "CronSchedule",
    "DeadLetter",
    "Descriptor",
    "KindLimit",
    "LiveJob",
    "QueueStat",
    "ReadOnlyError",
    "TerminalJob",
    "Worker",
    "WorkflowRecord",
]


class ReadOnlyError(RuntimeError):
    """awa_django's admin models are read-only views of the queue."""


class ReadOnlyQuerySet(models.QuerySet[Any]):
    def update(self, **kwargs: object) -> int:
        raise ReadOnlyError("awa_django models are read-only; use awa_django.operator.actions")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise ReadOnlyError("awa_django models are read-only; use awa_django.operator.actions")

    def bulk_create(self, *args: object, **kwargs: object) -> list[Any]:
        raise ReadOnlyError("awa_django models are read-only; use awa_django.operator.actions")

    def bulk_update(self, *args: object, **kwargs: object) -> int:
        raise ReadOnlyError("awa_django models are read-only; use awa_django.operator.actions")


class ReadOnlyModel(models.Model):
    objects: ClassVar[Any] = ReadOnlyQuerySet.as_manager()

    class Meta:
        abstract = True
        managed = False

    def save(self, *args: object, **kwargs: object) -> None:
        raise ReadOnlyError("awa_django models are read-only; use awa_django.operator.actions")

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise ReadOnlyError("awa_django models are read-only; use awa_django.operator.actions")


class TagsField(models.Field):  # type: ignore[type-arg]
    """A job's tags: a PostgreSQL ``text[]`` column, read as a list of str (None when unset).

    Migration 0002 recorded these fields as ``JSONField(null=True)``, which cannot load a
    ``text[]`` (psycopg hands back a list; ``JSONField`` expects JSON text), so every page
    showing a tagged job failed. The models are unmanaged: the recorded state never reaches
    the database, and ``deconstruct`` keeps describing the field as recorded, so no migration
    is needed. (``ArrayField`` would need ``django.contrib.postgres`` in INSTALLED_APPS.)
    """

    description = "A list of tags (PostgreSQL text[])"

    def db_type(self, connection: BaseDatabaseWrapper) -> str:
        return "text[]"

    def from_db_value(
        self, value: Iterable[object] | None, expression: object, connection: object
    ) -> list[str] | None:
        return None if value is None else [str(tag) for tag in value]

    def get_prep_value(self, value: Any) -> list[str] | None:
        return None if value is None else [str(tag) for tag in value]

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


if TYPE_CHECKING:
    _Lookup = models.Lookup[bool]
else:  # Lookup is generic to the type checker only
    _Lookup = models.Lookup


@TagsField.register_lookup
class HasTag(_Lookup):
    """``tags__has_tag="billing"``: the job carries that tag (``tags @> ARRAY[tag]``)."""

    lookup_name = "has_tag"
    prepare_rhs = False

    def get_db_prep_lookup(self, value: Any, connection: BaseDatabaseWrapper) -> Any:
        return ("%s", [str(value)])

    def as_sql(self, compiler: Any, connection: BaseDatabaseWrapper) -> Any:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} @> ARRAY[{rhs}]::text[]", (*lhs_params, *rhs_params)


class _JobFields(ReadOnlyModel):
    id = models.BigIntegerField(primary_key=True)
    kind = models.TextField()
    queue = models.TextField()
    state = models.TextField(choices=JobState.choices)
    priority = models.SmallIntegerField()
    attempt = models.SmallIntegerField()
    max_attempts = models.SmallIntegerField()
    run_lease = models.BigIntegerField()
    args = models.JSONField()
    run_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField(null=True)
    attempted_at = models.DateTimeField(null=True)
    finalized_at = models.DateTimeField(null=True)
    errors = models.JSONField(null=True)
    result = models.JSONField(null=True)
    progress = models.JSONField(null=True)
    metadata = models.JSONField(null=True)
    tags = TagsField(null=True)

    class Meta:
        abstract = True
        managed = False


class LiveJob(_JobFields):
    """Jobs not finished yet (``awa.live_jobs``: available, running, waiting, scheduled,
    retryable), read from the live planes only."""

    in_dlq = models.BooleanField()
    dlq_reason = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = table_name("live_jobs")
        ordering = ["-id"]
        verbose_name = "job"
        default_permissions = ("view",)
        permissions = [("cancel_job", "Can cancel jobs")]

    def __str__(self) -> str:
        return f"job {self.id} ({self.kind})"


class TerminalJob(_JobFields):
    """Finished jobs still in history (``awa.terminal_jobs``)."""

    class Meta:
        managed = False
        db_table = table_name("terminal_jobs")
        ordering = ["-finalized_at", "-id"]
        default_permissions = ("view",)
        permissions = [("retry_job", "Can retry failed and cancelled jobs from history")]
        verbose_name = "terminal job"

    def __str__(self) -> str:
        return f"job {self.id} ({self.state})"


class DeadLetter(ReadOnlyModel):
    """A dead-lettered job (``awa.dlq_entries``)."""

    job_id = models.BigIntegerField(primary_key=True)
    queue = models.TextField()
    priority = models.SmallIntegerField()
    kind = models.TextField()
    args = models.JSONField()
    attempt = models.SmallIntegerField()
    max_attempts = models.SmallIntegerField()
    run_lease = models.BigIntegerField()
    original_run_lease = models.BigIntegerField()
    run_at = models.DateTimeField()
    created_at = models.DateTimeField()
    attempted_at = models.DateTimeField(null=True)
    metadata = models.JSONField(null=True)
    tags = TagsField(null=True)
    errors = models.JSONField(null=True)
    progress = models.JSONField(null=True)
    dlq_reason = models.TextField()
    dlq_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = table_name("dlq_entries")
        ordering = ["-dlq_at", "-job_id"]
        default_permissions = ("view",)
        permissions = [
            ("retry_dlq", "Can retry dead-lettered jobs"),
            ("purge_dlq", "Can purge dead-lettered jobs"),
        ]
        verbose_name = "dead-lettered job"
        verbose_name_plural = "dead letter queue"

    def __str__(self) -> str:
        return f"job {self.job_id} ({self.kind})"


class QueueStat(ReadOnlyModel):
    """One queue's counts, lag and throughput (``awa.queue_stats``)."""

    queue = models.TextField(primary_key=True)
    available = models.BigIntegerField()
    running = models.BigIntegerField()
    waiting_external = models.BigIntegerField()
    scheduled = models.BigIntegerField()
    retryable = models.BigIntegerField()
    completed = models.BigIntegerField()
    failed = models.BigIntegerField()
    cancelled = models.BigIntegerField()
    dlq = models.BigIntegerField()
    paused = models.BooleanField()
    lag_seconds = models.FloatField(null=True)
    completed_last_hour = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = table_name("queue_stats")
        ordering = ["queue"]
        default_permissions = ("view",)
        permissions = [("manage_queue", "Can pause, resume and drain queues")]
        verbose_name = "queue"

    def __str__(self) -> str:
        return self.queue


class KindLimit(ReadOnlyModel):
    """One job kind's flow limits (``awa.flow_kind_limits``, docs/flow.md "Per kind"): a row
    without limits is a cleared settings row. Changed through ``awa_django.operator``
    (``set_kind_limits``, ``clear_kind_limits``), never saved."""

    kind = models.TextField(primary_key=True)
    max_running = models.IntegerField(null=True)
    rate = models.FloatField(null=True)
    burst = models.IntegerField(null=True)
    source = models.TextField()
    updated_by = models.TextField(null=True)
    updated_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = table_name("flow_kind_limits")
        ordering = ["kind"]
        default_permissions = ("view",)
        verbose_name = "job kind flow limit"

    def __str__(self) -> str:
        return self.kind


class Descriptor(ReadOnlyModel):
    """A queue or job kind declared in code (``awa.descriptor_status``, docs/descriptors.md):
    what it is for, and whether live workers declare it (``stale``: none does) and agree on
    it (``drift``: they do not). ``id`` is ``what:name``."""

    id = models.TextField(primary_key=True)
    what = models.TextField(choices=[("queue", "queue"), ("kind", "job kind")])
    name = models.TextField()
    label = models.TextField(null=True)
    description = models.TextField(null=True)
    owner = models.TextField(null=True)
    links = models.JSONField(null=True)
    declared_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    live_workers = models.IntegerField()
    versions = models.IntegerField()
    stale = models.BooleanField()
    drift = models.BooleanField()

    class Meta:
        managed = False
        db_table = table_name("descriptor_status")
        ordering = ["-what", "name"]
        default_permissions = ("view",)
        verbose_name = "queue and job kind"
        verbose_name_plural = "queues and job kinds"

    def __str__(self) -> str:
        return f"{self.what} {self.name}"


class Worker(ReadOnlyModel):
    """A registered worker or maintenance process (``awa.runtime_instances``)."""

    instance_id = models.UUIDField(primary_key=True)
    hostname = models.TextField()
    pid = models.IntegerField()
    queues = models.JSONField()
    concurrency = models.IntegerField()
    version = models.TextField(null=True)
    is_leader = models.BooleanField()
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = table_name("runtime_instances")
        ordering = ["started_at"]
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"


class CronSchedule(ReadOnlyModel):
    """A periodic schedule (``awa.cron_schedule_status``): its definition, as synced from code,
    its last fire and the state of the last job it enqueued. Schedules are declared in code;
    operators pause, resume or trigger them (``awa_django.operator``)."""

    name = models.TextField(primary_key=True)
    kind = models.TextField()
    cron_expr = models.TextField()
    timezone = models.TextField()
    catch_up = models.IntegerField()
    queue = models.TextField()
    priority = models.SmallIntegerField()
    max_attempts = models.SmallIntegerField()
    args = models.JSONField()
    metadata = models.JSONField(null=True)
    tags = TagsField(null=True)
    fire_after = models.DateTimeField()
    last_fire_at = models.DateTimeField(null=True)
    last_job_id = models.BigIntegerField(null=True)
    last_job_state = models.TextField(choices=JobState.choices, null=True)
    enabled = models.BooleanField()
    paused_at = models.DateTimeField(null=True)
    paused_by = models.TextField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = table_name("cron_schedule_status")
        ordering = ["name"]
        default_permissions = ("view",)
        permissions = [("manage_schedule", "Can pause, resume and trigger periodic schedules")]
        verbose_name = "periodic schedule"

    def __str__(self) -> str:
        return self.name


class CallbackWait(ReadOnlyModel):
    """A job parked until its callback is resolved (``awa.callback_waits``): its attempt, its
    callback id, when it parked and when rescue will take it (``timeout_at``, on the database
    clock; ``awa_django.extend_callback`` moves it), and whether a result resumes the job
    (``WaitForCallback(..., resume=True)``) or completes it."""

    job_id = models.BigIntegerField(primary_key=True)
    run_lease = models.BigIntegerField()
    callback_id = models.UUIDField()
    parked_at = models.DateTimeField()
    timeout_at = models.DateTimeField()
    resume = models.BooleanField()
    attempt = models.SmallIntegerField()
    kind = models.TextField()
    queue = models.TextField()
    priority = models.SmallIntegerField()
    max_attempts = models.SmallIntegerField()
    created_at = models.DateTimeField()
    metadata = models.JSONField(null=True)
    progress = models.JSONField(null=True)

    class Meta:
        managed = False
        db_table = table_name("callback_waits")
        ordering = ["timeout_at", "job_id"]
        default_permissions = ("view",)
        permissions = [("resolve_callback", "Can resolve or fail jobs waiting for a callback")]
        verbose_name = "callback wait"

    def __str__(self) -> str:
        return f"job {self.job_id} ({self.kind})"


class WorkflowRecord(ReadOnlyModel):
    """A workflow or batch (``awa.workflow_status``, docs/workflows.md): its name, kind, state
    (running, completed, failed) and how its steps ended so far."""

    id = models.BigIntegerField(primary_key=True)
    name = models.TextField()
    kind = models.TextField(choices=[("workflow", "workflow"), ("batch", "batch")])
    state = models.TextField(
        choices=[("running", "running"), ("completed", "completed"), ("failed", "failed")]
    )
    steps = models.IntegerField()
    completed = models.IntegerField()
    failed = models.IntegerField()
    cancelled = models.IntegerField()
    skipped = models.IntegerField()
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = table_name("workflow_status")
        ordering = ["-id"]
        default_permissions = ("view",)
        permissions = [("manage_workflow", "Can cancel workflows and retry their failed steps")]
        verbose_name = "workflow"
        verbose_name_plural = "workflows and batches"

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.name})"
