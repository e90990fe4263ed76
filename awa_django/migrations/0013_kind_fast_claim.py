"""Jobs of limited kinds go through the claim's one statement when their kinds do not bind
(issue 16): awa.claim_v3 takes each kind's rate tokens and permits up front for the run it reads;
the slow path decides only where a kind binds."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0012_kind_limits")]

    operations = [
        RunAwaSQL("0013_kind_fast_claim.sql", reverse="0013_kind_fast_claim.sql"),
    ]
