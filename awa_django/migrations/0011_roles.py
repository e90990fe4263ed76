"""Least-privilege roles (issue 19): the producer's entry points run as their owner, so an
application role enqueues without INSERT on the ring tables or CREATE on the schema."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0010_operator")]

    operations = [RunAwaSQL("0011_roles.sql", reverse="0011_roles.sql")]
