"""Install the awa schema: ring-partitioned planes, control tables, their indexes."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [RunAwaSQL("0001_schema.sql", drop_schema=True)]
