"""What operators and their probes need (issue 18): queue lag read cheaply, a queue's DLQ
switched on or off, retry from terminal history."""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0007_retry")]

    operations = [RunAwaSQL("0010_operator.sql")]
