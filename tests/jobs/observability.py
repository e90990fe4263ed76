"""Job kinds for the observability tests (tests/operations/: health, logs, metrics, traces and
their documented promises): handlers that log, fail, sleep, and record the trace they run in.
Workers load them with ``worker_env(observability)`` (tests/jobs/__init__.py)."""

from __future__ import annotations

import asyncio
import logging
import time

from awa_django import RetryPolicy, job

log = logging.getLogger("tests.obs")


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


# For tests/operations/test_observability_promises.py: retry ages, the DLQ, rescue.


@job(queue="atk-age", max_attempts=5, retry=RetryPolicy(base=5.0, jitter=0.0, max_age=0.5))
def too_old_to_retry(n: int) -> None:
    """Fails; its first retry would run 10 s after enqueue, past ``max_age`` (0.5 s)."""
    raise ValueError(f"fails on purpose ({n})")


@job(queue="atk-dlq", max_attempts=1)
def fails_for_good(n: int) -> None:
    raise ValueError(f"fails on purpose ({n})")


@job(queue="atk-dlq")
def fine(n: int) -> int:
    return n


@job(queue="atk-rescue", max_attempts=1)
def sleeps(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"
