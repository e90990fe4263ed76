"""A deliberately broken build, for proving the checker: ``AWA_CHAOS_BREAK=limit,unique,...``.

Each name makes the harness ask awa_django for one thing and record another in the ledger, as a
queue that ignored what it was asked would behave; a run must then report violations of the
invariant named (``--break NAME`` of tests/chaos/run.py sets the variable, also for the
workers). Read only by the chaos harness; never set in CI.

| name | the harness | invariant that must fail |
| --- | --- | --- |
| ``limit`` | records concurrency limits 3 below those it sets | ``flow_concurrency`` |
| ``rate`` | records a quarter of the rates it sets, bursts 2 lower | ``flow_rate`` |
| ``serial`` | enqueues serial jobs without their key | ``flow_serial`` |
| ``unique`` | enqueues unique jobs without their key | ``unique_one_holder`` |
| ``unique_rollback`` | commits the "rolled back" holder | ``unique_rollback_releases`` |
| ``cron`` | forges a second job for fires, pauses a schedule unrecorded | ``periodic_fires`` |
| ``retry`` | enqueues retry policies with 4 times the recorded base | ``retry_delays`` |
| ``callback`` | records one acting resolution of a race as stale | ``callback_outcomes`` |
"""

from __future__ import annotations

import functools
import os

__all__ = ["BREAKABLE", "ENV", "broken", "enabled"]

ENV = "AWA_CHAOS_BREAK"
BREAKABLE = ("limit", "rate", "serial", "unique", "unique_rollback", "cron", "retry", "callback")


@functools.cache
def enabled() -> frozenset[str]:
    """The names in ``AWA_CHAOS_BREAK`` (``all``: every one); unknown names are refused."""
    names = {n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()}
    if "all" in names:
        return frozenset(BREAKABLE)
    unknown = names - set(BREAKABLE)
    if unknown:
        raise ValueError(f"{ENV}: unknown {sorted(unknown)}; known: {', '.join(BREAKABLE)}")
    return frozenset(names)


def broken(name: str) -> bool:
    """Whether the harness should break ``name`` in this run."""
    return name in enabled()
