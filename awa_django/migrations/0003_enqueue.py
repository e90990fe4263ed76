"""Install awa.enqueue_one_v2, the single enqueue the Python producer calls (issue 14)."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0002_functions")]

    operations = [RunAwaSQL("0003_enqueue.sql")]
