"""Flow control across the fleet: global concurrency by weight, rate limits and per-key
serialisation (issue 16)."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0007_retry")]

    operations = [RunAwaSQL("0008_flow.sql", reverse="0008_flow.sql")]
