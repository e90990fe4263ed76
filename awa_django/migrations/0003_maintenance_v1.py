"""Install the v1 maintenance functions: rescue, rotate, prune, retention.

Never edit once released.
"""

from django.db import migrations

from awa_django.db.operations import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0002_functions_v1")]
    operations = [RunAwaSQL("0003_maintenance_v1.sql")]
