"""Flow limits per job kind (issue 16): a kind's global concurrency and rate limit across every
queue, process and host; jobs their kind holds back are parked (awa.flow_waiting), not left
blocking their lane. The admin's model of awa.flow_kind_limits (unmanaged: state only)."""

from django.db import migrations, models

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0011_roles")]

    operations = [
        RunAwaSQL("0012_kind_limits.sql", reverse="0012_kind_limits.sql"),
        migrations.CreateModel(
            name="KindLimit",
            fields=[
                ("kind", models.TextField(primary_key=True, serialize=False)),
                ("max_running", models.IntegerField(null=True)),
                ("rate", models.FloatField(null=True)),
                ("burst", models.IntegerField(null=True)),
                ("source", models.TextField()),
                ("updated_by", models.TextField(null=True)),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "job kind flow limit",
                "db_table": 'awa"."flow_kind_limits',
                "ordering": ["kind"],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
