"""Descriptors from real worker processes (docs/descriptors.md): two workers that declare one
queue differently drift; a worker killed with SIGKILL leaves what only it declared stale once
its live seconds pass (three runtime refreshes). The SQL rules:
tests/storage/test_descriptors.py."""

from __future__ import annotations

from typing import Any

import pytest

from awa_django.operator import DescriptorStatus, descriptors
from tests.support.polling import wait_for
from tests.support.workers import Start, worker

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]


def orders() -> DescriptorStatus | None:
    return next((d for d in descriptors() if (d.what, d.name) == ("queue", "orders")), None)


def declared(description: str) -> dict[str, Any]:
    return {"QUEUES": {"orders": {"description": description, "owner": "team-shop"}}}


def test_two_deploys_drift_and_a_killed_worker_goes_stale(manage_py: Start) -> None:
    old = worker(manage_py, "--queue", "orders", overrides=declared("Orders, v1"))
    new = worker(manage_py, "--queue", "orders", overrides=declared("Orders, v2"))
    wait_for(
        lambda: (d := orders()) is not None and d.live_workers == 2,
        timeout=30,
        message=lambda: f"both workers' declarations; output:\n{old.output()}{new.output()}",
    )
    both = orders()
    assert both is not None and both.drift and both.versions == 2 and both.owner == "team-shop"
    kinds = [d for d in descriptors() if d.what == "kind"]
    assert kinds and not any(d.drift for d in kinds)  # the same code: the kinds agree
    noop = next(d for d in kinds if d.name == "tests.jobs.common.noop")
    assert noop.description == "Do nothing."  # the docstring
    old.kill()
    wait_for(
        lambda: (d := orders()) is not None and d.live_workers == 1 and not d.drift,
        timeout=30,
        message="the killed worker to stop counting",
    )
    new.kill()
    wait_for(
        lambda: (d := orders()) is not None and d.stale,
        timeout=30,
        message="the queue to go stale",
    )
    assert all(d.stale for d in descriptors())
