"""Drains at the default settings (issue 14): finalize_v2 always probes the claims' index (its
generic plan could scan the whole claim partition), and a cheap exit check for burst workers,
awa.queues_idle_v2 (the answer of queues_idle_v1 from bounded probes, cheapest evidence
first)."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0013_kind_fast_claim")]

    operations = [RunAwaSQL("0014_drain.sql", reverse="0014_drain.sql")]
