"""Install the v1 operator functions: queue pause/resume/drain and statistics.

Never edit once released.
"""

from django.db import migrations

from awa_django.db.operations import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0003_maintenance_v1")]
    operations = [RunAwaSQL("0004_operator_v1.sql")]
