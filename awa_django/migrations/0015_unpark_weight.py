"""Parked jobs' weights counted as the claim counts them (issue 16): awa._flow_unpark_v2 caps a
parked job's weight at the claiming process's bound and the queue's limit too, so a job heavier
than any worker's slots is never stranded in awa.flow_waiting."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0014_drain")]

    operations = [RunAwaSQL("0015_unpark_weight.sql")]
