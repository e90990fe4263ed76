"""A steady producer: ``python -m tests.fleet.producer RATE SECONDS JOB_SECONDS``.

Enqueues ``fleet.work`` jobs at RATE per second for SECONDS, each job recorded in
``fleet.committed`` in the same transaction, then exits. Runs in the root namespace.
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str]) -> int:
    rate, seconds, job_seconds = (float(a) for a in argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.fleet.settings")
    import django

    django.setup()
    from django.db import connection, transaction

    import awa_django
    from tests.fleet.sql import statement

    start = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) + 1
        while sent < due:
            with transaction.atomic():
                handle = awa_django.enqueue("fleet.work", [job_seconds])
                with connection.cursor() as cursor:
                    cursor.execute(statement("committed_insert"), [handle.id])
            sent += 1
        time.sleep(max(0.0, (sent / rate) - (time.monotonic() - start)))
    print(f"enqueued {sent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
