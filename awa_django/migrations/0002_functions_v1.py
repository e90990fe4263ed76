"""Install the v1 SQL functions and read views. Never edit once released."""

from django.db import migrations

from awa_django.db.operations import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0001_schema")]
    operations = [RunAwaSQL("0002_functions_v1.sql")]
