"""Per-job retry policies: awa._backoff_v2 on every retry path (issue 15)."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0006_periodic")]

    operations = [RunAwaSQL("0007_retry.sql", reverse="0007_retry.sql")]
