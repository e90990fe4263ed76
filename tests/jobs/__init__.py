"""The job kinds of the test suite, one module per group of tests, and the one way a worker
subprocess is told to load them.

Every test process and every worker loads ``DEFAULT_MODULES`` (tests/settings.py's
``AWA["JOB_MODULES"]``): :mod:`tests.jobs.common` (the everyday kinds) and
:mod:`tests.jobs.tasks` (django.tasks tasks). The other modules register kinds with queues and
limits of their own, which only their tests' workers load, through :func:`worker_env`::

    manage_py("awa_worker", "--queue", "katk", extra_env=worker_env(kind_limits))
    manage_py("awa_worker", extra_env=worker_env(POLL_INTERVAL=10.0))

A module may declare ``WORKER_SETTINGS``, the AWA settings its handlers need (a longer
heartbeat staleness for handlers that block on purpose, say); ``worker_env`` applies them, then
the keyword arguments.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

__all__ = ["DEFAULT_MODULES", "worker_env", "worker_settings"]

#: The job modules every process of the test suite loads (tests/settings.py).
DEFAULT_MODULES = ["tests.jobs.common", "tests.jobs.tasks"]


def worker_settings(*modules: ModuleType, **settings: Any) -> dict[str, Any]:
    """The AWA settings that a subprocess applies over tests/settings.py's: ``modules``'
    kinds loaded beside ``DEFAULT_MODULES``, their ``WORKER_SETTINGS``, then ``settings``."""
    merged: dict[str, Any] = {}
    if modules:
        merged["JOB_MODULES"] = [*DEFAULT_MODULES, *(m.__name__ for m in modules)]
    for module in modules:
        merged.update(getattr(module, "WORKER_SETTINGS", {}))
    merged.update(settings)
    return merged


def worker_env(*modules: ModuleType, **settings: Any) -> dict[str, str]:
    """The environment (``AWA_TEST_OVERRIDES``, read by tests/settings.py) that makes a
    subprocess use :func:`worker_settings`; an empty dict when there is nothing to override."""
    merged = worker_settings(*modules, **settings)
    return {"AWA_TEST_OVERRIDES": json.dumps(merged)} if merged else {}
