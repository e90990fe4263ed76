"""Job kinds for tests/test_attack_obs.py (hostile tests of the observability features).
Workers load them through ``AWA_TEST_OVERRIDES`` (``ATK_OVERRIDES``)."""

from __future__ import annotations

import time
from typing import Any

from awa_django import RetryPolicy, job

ATK_OVERRIDES: dict[str, Any] = {
    "JOB_MODULES": ["tests.testjobs", "tests.tasks_for_tests", "tests.atkjobs"],
}


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
