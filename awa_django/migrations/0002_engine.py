"""The awa engine: the schema's functions and views (awa_django/sql/functions/, views.sql), and
the admin's model of workflows (WorkflowRecord).

Every function is defined once, with CREATE OR REPLACE, so that a database migrated with a
development version converges to the same definitions.
"""

from django.db import migrations, models

from awa_django.db.migration import RunAwaSQL
from awa_django.sql import table_name


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0001_initial")]

    operations = [
        RunAwaSQL(
            "upgrades.sql",
            "superseded.sql",
            # In this order: a LANGUAGE sql function or a view needs what it reads to exist.
            "functions/common.sql",
            "functions/maintenance.sql",
            "functions/retry.sql",
            "functions/enqueue.sql",
            "functions/claim.sql",
            "functions/finalize.sql",
            "functions/flow.sql",
            "functions/callbacks.sql",
            "functions/unique.sql",
            "functions/periodic.sql",
            "functions/operator.sql",
            "views.sql",
            "functions/workflows.sql",
            "functions/reads.sql",
            "functions/descriptors.sql",
            "functions/privileges.sql",
            name="0002_engine",
        ),
        migrations.CreateModel(
            name="WorkflowRecord",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("name", models.TextField()),
                ("kind", models.TextField(choices=[("workflow", "workflow"), ("batch", "batch")])),
                (
                    "state",
                    models.TextField(
                        choices=[
                            ("running", "running"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                        ]
                    ),
                ),
                ("steps", models.IntegerField()),
                ("completed", models.IntegerField()),
                ("failed", models.IntegerField()),
                ("cancelled", models.IntegerField()),
                ("skipped", models.IntegerField()),
                ("created_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(null=True)),
            ],
            options={
                "verbose_name": "workflow",
                "verbose_name_plural": "workflows and batches",
                "db_table": table_name("workflow_status"),
                "ordering": ["-id"],
                "permissions": [
                    ("manage_workflow", "Can cancel workflows and retry their failed steps")
                ],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
