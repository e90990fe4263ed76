"""The awa engine: the schema's functions and views (awa_django/sql/functions/, views.sql).

Every function is defined once, with CREATE OR REPLACE, so that a database migrated with a
development version converges to the same definitions.
"""

from django.db import migrations

from awa_django.db.migration import RunAwaSQL


class Migration(migrations.Migration):
    dependencies = [("awa_django", "0001_initial")]

    operations = [
        RunAwaSQL(
            "upgrades.sql",
            "superseded.sql",
            # In this order: a LANGUAGE sql function or a view needs what it reads to exist.
            "functions/common.sql",
            "functions/maintenance.sql",
            "functions/retry.sql",
            "functions/enqueue.sql",
            "functions/claim.sql",
            "functions/finalize.sql",
            "functions/flow.sql",
            "functions/callbacks.sql",
            "functions/unique.sql",
            "functions/periodic.sql",
            "functions/operator.sql",
            "views.sql",
            "functions/reads.sql",
            "functions/descriptors.sql",
            "functions/privileges.sql",
            name="0002_engine",
        ),
    ]
