"""Several worker hosts (docs/deployment.md, "Several worker hosts"): three network namespaces
each running ``awa_worker --processes 2`` against one PostgreSQL; links cut and healed.
Needs root and network namespaces; skipped, with the reason, otherwise. See tests/fleet/run.py
for the scenario and its checks."""

from __future__ import annotations

import pytest

from tests.fleet.net import unavailable
from tests.fleet.run import run

pytestmark = [pytest.mark.slow, pytest.mark.worker]


def test_a_fleet_of_hosts_survives_partitions() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    report = run()
    print(report.show())
    assert not report.violations, report.show()
