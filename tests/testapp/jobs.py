"""Job kinds of the test app, found by awa_django's discovery of installed apps' ``jobs`` modules.

Most test kinds live in tests/jobs/common.py, registered through ``AWA["JOB_MODULES"]``.
"""

from awa_django import job


@job(queue="discovered")
def discovered() -> str:
    return "found by autodiscovery"
