"""Flow limits per job kind (issue 16): a kind's global concurrency and rate limit across every
queue, process and host; jobs their kind holds back are parked (awa.flow_waiting), not left
blocking their lane."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0011_roles")]

    operations = [RunAwaSQL("0012_kind_limits.sql", reverse="0012_kind_limits.sql")]
