"""Which queues have work, for many queues in one statement (awa.queues_ready_v1): how a
worker serving many queues finds the idle ones that have work again."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0017_claim_lean")]

    operations = [RunAwaSQL("0018_queues_ready.sql", reverse="0018_queues_ready.sql")]
