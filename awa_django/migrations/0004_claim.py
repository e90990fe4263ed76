"""A cheap claim and a lean finalize: awa.claim_v2 and awa.finalize_v2 (issue 14)."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0003_enqueue")]

    operations = [RunAwaSQL("0004_claim.sql")]
