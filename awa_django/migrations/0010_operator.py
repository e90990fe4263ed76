"""What operators and their probes need (issue 18): queue lag read cheaply, a queue's DLQ
switched on or off, retry from terminal history (and its permission)."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0009_callbacks")]

    operations = [
        RunAwaSQL("0010_operator.sql"),
        migrations.AlterModelOptions(
            name="terminaljob",
            options={
                "verbose_name": "terminal job",
                "ordering": ["-finalized_at", "-id"],
                "managed": False,
                "default_permissions": ("view",),
                "permissions": [("retry_job", "Can retry failed and cancelled jobs from history")],
            },
        ),
    ]
