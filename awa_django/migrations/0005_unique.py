"""Unique jobs: awa.unique_keys, awa.enqueue_one_v3 and the sweep (issue 15)."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0004_claim")]

    operations = [RunAwaSQL("0005_unique.sql")]
