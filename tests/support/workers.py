"""Worker subprocesses started through the ``manage_py`` fixture (tests/conftest.py): start one
with AWA settings of its own, wait for it to exit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.jobs import worker_env
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

__all__ = ["Start", "exited", "worker"]

#: The ``manage_py`` fixture: starts ``python -m django <args>`` against the test database.
Start = Callable[..., ManagedProcess]


def worker(start: Start, *args: str, overrides: dict[str, Any] | None = None) -> ManagedProcess:
    """``manage.py awa_worker *args``, with ``overrides`` applied over tests/settings.py's AWA."""
    return start("awa_worker", *args, extra_env=worker_env(**(overrides or {})))


def exited(proc: ManagedProcess, timeout: float) -> int:
    """Wait (at most ``timeout`` seconds) for ``proc`` to exit; its exit status."""
    wait_for(
        lambda: proc.proc.poll() is not None,
        timeout=timeout,
        message=lambda: f"the worker to exit; output:\n{proc.output()}",
    )
    code = proc.proc.returncode
    assert code is not None
    return code
