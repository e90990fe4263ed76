"""Job kinds for the observability tests (tests/test_observability_*.py): handlers that log,
fail, sleep, and record the trace they run in. Workers load them through
``AWA_TEST_OVERRIDES`` (``OBS_OVERRIDES``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from awa_django import job

log = logging.getLogger("tests.obs")

#: AWA overrides that make a worker subprocess load these kinds.
OBS_OVERRIDES: dict[str, Any] = {
    "JOB_MODULES": ["tests.testjobs", "tests.tasks_for_tests", "tests.obsjobs"],
}


@job(queue="obs")
def says(n: int) -> int:
    log.info("sync handler says %s", n)
    return n


@job(queue="obs")
async def says_async(n: int) -> int:
    await asyncio.sleep(0)
    log.info("async handler says %s", n)
    return n


@job(queue="obs", max_attempts=2)
def fails(n: int) -> None:
    raise ValueError(f"fails on purpose ({n})")


@job(queue="obs-slow")
def naps(seconds: float) -> str:
    import time

    time.sleep(seconds)
    return "rested"


@job(queue="obs")
def traced(n: int) -> int:
    from opentelemetry import trace  # only when the tracing test runs it

    with trace.get_tracer("tests.obs").start_as_current_span("inside the sync handler"):
        return n


@job(queue="obs")
async def traced_async(n: int) -> int:
    from opentelemetry import trace

    with trace.get_tracer("tests.obs").start_as_current_span("inside the async handler"):
        await asyncio.sleep(0)
        return n
