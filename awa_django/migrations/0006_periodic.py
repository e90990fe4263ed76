"""Periodic jobs: awa.cron_schedules and its functions (issue 15), and the admin's unmanaged
model over awa.cron_schedule_status."""

from django.db import migrations, models

from awa_django.db.migration import RunAwaSQL

#: ``awa_django.states.JobState.choices`` when this migration was written.
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


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0005_unique")]

    operations = [
        RunAwaSQL("0006_periodic.sql"),
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
    ]
