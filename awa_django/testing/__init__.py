"""A test kit for your own tests (docs/testing.md).

* ``drain()`` runs enqueued jobs in-process, inside the test's transaction, and returns what
  happened to each (``JobRun``); ``kinds=`` and ``with_scheduled=True`` narrow or widen it.
* ``enqueued_jobs()``, ``assert_enqueued()`` and ``assert_not_enqueued()`` read the jobs the
  test enqueued (committed or not) that wait to run; a failed assertion lists what is there.
* ``immediate()`` (or ``AWA["TESTING"]["MODE"] = "immediate"``) runs each job when the
  transaction that enqueued it commits; ``ImmediateJobFailed`` reports a job that failed.
* With pytest, the fixtures ``awa_drain``, ``awa_jobs`` and ``awa_immediate``
  (``awa_django.testing.fixtures``, loaded by pytest on its own).

Nothing here runs in production: importing this package turns immediate mode's enqueue hook on
for the process, at the cost of one settings read per enqueue.
"""

from awa_django.testing.drain import JobRun, drain
from awa_django.testing.enqueued import (
    QueuedJob,
    assert_enqueued,
    assert_not_enqueued,
    enqueued_jobs,
)
from awa_django.testing.immediate_mode import ImmediateJobFailed, immediate

__all__ = [
    "ImmediateJobFailed",
    "JobRun",
    "QueuedJob",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued_jobs",
    "immediate",
]
