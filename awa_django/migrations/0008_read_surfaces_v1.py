"""Read surfaces bounded by the live planes and small index ranges, never by retained history.

Never edit once released.
"""

from django.db import migrations

from awa_django.db.operations import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0007_faults_v1")]
    operations = [RunAwaSQL("0008_read_surfaces_v1.sql")]
