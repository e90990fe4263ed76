"""Bounded values, key spaces per kind of lock, READ COMMITTED enforced, early callbacks,
idempotent parks, rotation on the database clock, fair promotion, set-based drains.

Never edit once released.
"""

from django.db import migrations

from awa_django.db.operations import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0006_claim_plan_v1")]
    operations = [RunAwaSQL("0007_faults_v1.sql")]
