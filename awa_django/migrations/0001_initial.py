"""The awa schema's tables (awa_django/sql/tables.sql) and the admin's unmanaged models.

This is the settled schema of 0.1.0. It replaces the migrations of development versions: a
database migrated with those is taken as having applied it, and the next migration converges
its functions (awa_django/sql/superseded.sql drops the ones nothing calls).
"""

from django.db import migrations, models

from awa_django.db.migration import RunAwaSQL

#: ``awa_django.states.JobState.choices`` (the ``state`` of LiveJob and TerminalJob, the last
#: job state of CronSchedule).
JOB_STATES = [
    ("available", "Available"),
    ("running", "Running"),
    ("waiting_external", "waiting external"),
    ("scheduled", "Scheduled"),
    ("retryable", "Retryable"),
    ("completed", "Completed"),
    ("failed", "Failed"),
    ("cancelled", "Cancelled"),
]

#: The migrations of development versions this one stands for.
DEVELOPMENT_MIGRATIONS = [
    "0001_schema",
    "0002_functions",
    "0003_enqueue",
    "0004_claim",
    "0005_unique",
    "0006_periodic",
    "0007_retry",
    "0008_flow",
    "0009_callbacks",
    "0010_operator",
    "0011_roles",
    "0012_kind_limits",
    "0013_kind_fast_claim",
    "0014_drain",
    "0015_unpark_weight",
    "0016_claim_cost",
    "0017_claim_lean",
    "0018_queues_ready",
]


class Migration(migrations.Migration):
    initial = True
    replaces = [("awa_django", name) for name in DEVELOPMENT_MIGRATIONS]
    dependencies = []

    operations = [
        RunAwaSQL("tables.sql", name="0001_initial", drop_schema=True),
        migrations.CreateModel(
            name="CallbackWait",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("run_lease", models.BigIntegerField()),
                ("callback_id", models.UUIDField()),
                ("parked_at", models.DateTimeField()),
                ("timeout_at", models.DateTimeField()),
                ("resume", models.BooleanField()),
                ("attempt", models.SmallIntegerField()),
                ("kind", models.TextField()),
                ("queue", models.TextField()),
                ("priority", models.SmallIntegerField()),
                ("max_attempts", models.SmallIntegerField()),
                ("created_at", models.DateTimeField()),
                ("metadata", models.JSONField(null=True)),
                ("progress", models.JSONField(null=True)),
            ],
            options={
                "verbose_name": "callback wait",
                "db_table": 'awa"."callback_waits',
                "ordering": ["timeout_at", "job_id"],
                "permissions": [
                    ("resolve_callback", "Can resolve or fail jobs waiting for a callback")
                ],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="CronSchedule",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("kind", models.TextField()),
                ("cron_expr", models.TextField()),
                ("timezone", models.TextField()),
                ("catch_up", models.IntegerField()),
                ("queue", models.TextField()),
                ("priority", models.SmallIntegerField()),
                ("max_attempts", models.SmallIntegerField()),
                ("args", models.JSONField()),
                ("metadata", models.JSONField(null=True)),
                ("tags", models.JSONField(null=True)),
                ("fire_after", models.DateTimeField()),
                ("last_fire_at", models.DateTimeField(null=True)),
                ("last_job_id", models.BigIntegerField(null=True)),
                ("last_job_state", models.TextField(choices=JOB_STATES, null=True)),
                ("enabled", models.BooleanField()),
                ("paused_at", models.DateTimeField(null=True)),
                ("paused_by", models.TextField(null=True)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "periodic schedule",
                "db_table": 'awa"."cron_schedule_status',
                "ordering": ["name"],
                "permissions": [
                    ("manage_schedule", "Can pause, resume and trigger periodic schedules")
                ],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="DeadLetter",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("queue", models.TextField()),
                ("priority", models.SmallIntegerField()),
                ("kind", models.TextField()),
                ("args", models.JSONField()),
                ("attempt", models.SmallIntegerField()),
                ("max_attempts", models.SmallIntegerField()),
                ("run_lease", models.BigIntegerField()),
                ("original_run_lease", models.BigIntegerField()),
                ("run_at", models.DateTimeField()),
                ("created_at", models.DateTimeField()),
                ("attempted_at", models.DateTimeField(null=True)),
                ("metadata", models.JSONField(null=True)),
                ("tags", models.JSONField(null=True)),
                ("errors", models.JSONField(null=True)),
                ("progress", models.JSONField(null=True)),
                ("dlq_reason", models.TextField()),
                ("dlq_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "dead-lettered job",
                "verbose_name_plural": "dead letter queue",
                "db_table": 'awa"."dlq_entries',
                "ordering": ["-dlq_at", "-job_id"],
                "permissions": [
                    ("retry_dlq", "Can retry dead-lettered jobs"),
                    ("purge_dlq", "Can purge dead-lettered jobs"),
                ],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="KindLimit",
            fields=[
                ("kind", models.TextField(primary_key=True, serialize=False)),
                ("max_running", models.IntegerField(null=True)),
                ("rate", models.FloatField(null=True)),
                ("burst", models.IntegerField(null=True)),
                ("source", models.TextField()),
                ("updated_by", models.TextField(null=True)),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "job kind flow limit",
                "db_table": 'awa"."flow_kind_limits',
                "ordering": ["kind"],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="LiveJob",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("kind", models.TextField()),
                ("queue", models.TextField()),
                ("state", models.TextField(choices=JOB_STATES)),
                ("priority", models.SmallIntegerField()),
                ("attempt", models.SmallIntegerField()),
                ("max_attempts", models.SmallIntegerField()),
                ("run_lease", models.BigIntegerField()),
                ("args", models.JSONField()),
                ("run_at", models.DateTimeField(null=True)),
                ("created_at", models.DateTimeField(null=True)),
                ("attempted_at", models.DateTimeField(null=True)),
                ("finalized_at", models.DateTimeField(null=True)),
                ("errors", models.JSONField(null=True)),
                ("result", models.JSONField(null=True)),
                ("progress", models.JSONField(null=True)),
                ("metadata", models.JSONField(null=True)),
                ("tags", models.JSONField(null=True)),
                ("in_dlq", models.BooleanField()),
                ("dlq_reason", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "job",
                "db_table": 'awa"."live_jobs',
                "ordering": ["-id"],
                "permissions": [("cancel_job", "Can cancel jobs")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="QueueStat",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                ("available", models.BigIntegerField()),
                ("running", models.BigIntegerField()),
                ("waiting_external", models.BigIntegerField()),
                ("scheduled", models.BigIntegerField()),
                ("retryable", models.BigIntegerField()),
                ("completed", models.BigIntegerField()),
                ("failed", models.BigIntegerField()),
                ("cancelled", models.BigIntegerField()),
                ("dlq", models.BigIntegerField()),
                ("paused", models.BooleanField()),
                ("lag_seconds", models.FloatField(null=True)),
                ("completed_last_hour", models.BigIntegerField()),
            ],
            options={
                "verbose_name": "queue",
                "db_table": 'awa"."queue_stats',
                "ordering": ["queue"],
                "permissions": [("manage_queue", "Can pause, resume and drain queues")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="TerminalJob",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("kind", models.TextField()),
                ("queue", models.TextField()),
                ("state", models.TextField(choices=JOB_STATES)),
                ("priority", models.SmallIntegerField()),
                ("attempt", models.SmallIntegerField()),
                ("max_attempts", models.SmallIntegerField()),
                ("run_lease", models.BigIntegerField()),
                ("args", models.JSONField()),
                ("run_at", models.DateTimeField(null=True)),
                ("created_at", models.DateTimeField(null=True)),
                ("attempted_at", models.DateTimeField(null=True)),
                ("finalized_at", models.DateTimeField(null=True)),
                ("errors", models.JSONField(null=True)),
                ("result", models.JSONField(null=True)),
                ("progress", models.JSONField(null=True)),
                ("metadata", models.JSONField(null=True)),
                ("tags", models.JSONField(null=True)),
            ],
            options={
                "verbose_name": "terminal job",
                "db_table": 'awa"."terminal_jobs',
                "ordering": ["-finalized_at", "-id"],
                "permissions": [("retry_job", "Can retry failed and cancelled jobs from history")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="Worker",
            fields=[
                ("instance_id", models.UUIDField(primary_key=True, serialize=False)),
                ("hostname", models.TextField()),
                ("pid", models.IntegerField()),
                ("queues", models.JSONField()),
                ("concurrency", models.IntegerField()),
                ("version", models.TextField(null=True)),
                ("is_leader", models.BooleanField()),
                ("started_at", models.DateTimeField()),
                ("last_seen_at", models.DateTimeField()),
            ],
            options={
                "db_table": 'awa"."runtime_instances',
                "ordering": ["started_at"],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
