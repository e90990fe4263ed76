"""A cheap exit check for burst workers: awa.queues_idle_v2, the answer of queues_idle_v1 from
bounded probes, cheapest evidence first (issue 14)."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0012_kind_limits")]

    operations = [RunAwaSQL("0015_idle_check.sql")]
