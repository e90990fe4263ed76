"""External callbacks, complete (issue 17): receipts of the signed HTTP receiver, extensions,
sequential waits (awa.finalize_v3, awa.callback_resolve_v2), and the admin's unmanaged model
over awa.callback_waits."""

from django.db import migrations, models

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0008_flow")]

    operations = [
        RunAwaSQL("0009_callbacks.sql"),
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
    ]
