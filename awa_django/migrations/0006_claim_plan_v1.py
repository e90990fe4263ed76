"""Replace awa.claim_v1 with a plan that stays index-only under stale statistics.

Never edit once released.
"""

from django.db import migrations

from awa_django.db.operations import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0005_admin_views_v1")]
    operations = [RunAwaSQL("0006_claim_plan_v1.sql")]
