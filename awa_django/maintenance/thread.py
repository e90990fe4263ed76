"""The maintenance loop of a worker process, on a thread of its own with its own event loop.

A worker process that takes part in the leader election runs ``Maintenance`` here rather than
as a task of its own event loop: hundreds of handlers' tasks, the dispatcher and the batcher
share that loop, and when the worker is saturated a maintenance task waited its turn behind
them (a scheduled job was promoted 42 s late beside two 512-slot workers draining a backlog).
On its own loop maintenance waits for nothing but the GIL and its own statements.

A loop that ends for any reason but ``stop`` (an error that is not a lost connection escaped
``Maintenance.run``, say) is reported to ``on_failure``: the worker then exits for its
supervisor to restart it, never running half-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from awa_django.maintenance.leader import Maintenance

__all__ = ["MaintenanceThread"]

log = logging.getLogger("awa_django.maintenance")


class MaintenanceThread:
    """Runs ``maintenance.run()`` on a daemon thread until ``stop``."""

    def __init__(
        self, maintenance: Maintenance, on_failure: Callable[[BaseException | None], None]
    ) -> None:
        self.maintenance = maintenance
        self._on_failure = on_failure
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="awa-maintenance", daemon=True)

    def start(self) -> None:
        """Start the thread; returns once its loop runs."""
        self._thread.start()
        self._ready.wait(10.0)

    def _main(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        error: BaseException | None = None
        try:
            loop.run_until_complete(self._run())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:
            error = exc
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
        if not self._stopping:
            self._on_failure(error)

    async def _run(self) -> None:
        self._task = asyncio.current_task()
        self._ready.set()
        await self.maintenance.run()

    def stop(self, timeout: float = 10.0) -> None:
        """Give up leadership and end the thread (waits up to ``timeout`` seconds)."""
        self._stopping = True
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "awa maintenance: the maintenance thread did not end within %.0f s", timeout
            )
