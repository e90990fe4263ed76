"""The completion batcher: handler outcomes are written in batches, one statement each.

The execution slot is freed as soon as a handler returns; its outcome waits here for at most
``flush_interval`` (or until ``batch_size`` outcomes are pending) and is then written with one
``awa.finalize_v1`` call. Finalizations found stale (the attempt was rescued, cancelled or
closed elsewhere) are logged and counted, never raised into handlers. If the process dies with
outcomes still here, their attempts stay open and are rescued: there is no replay log.
"""

from __future__ import annotations

import asyncio
import logging

from awa_django.db.storage import Finalization, afinalize
from awa_django.worker.links import Link

__all__ = ["CompletionBatcher"]

log = logging.getLogger("awa_django.worker")


class CompletionBatcher:
    """Collects ``Finalization``s and flushes them through one ``Link``."""

    def __init__(
        self,
        link: Link,
        *,
        batch_size: int,
        flush_interval: float,
    ) -> None:
        self.link = link
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.pending: list[Finalization] = []
        self.written = 0
        self.stale = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    def add(self, item: Finalization) -> None:
        """Queue one outcome (non-blocking)."""
        self.pending.append(item)
        self._idle.clear()
        if len(self.pending) >= self.batch_size or len(self.pending) == 1:
            self._wake.set()

    async def run(self) -> None:
        """Flush loop; returns after ``close()`` once everything pending is written."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.pending:
                if self._closing:
                    return
                continue
            if len(self.pending) < self.batch_size and not self._closing:
                # Give concurrent handlers a moment to add to this batch.
                await asyncio.sleep(self.flush_interval)
            while self.pending:
                batch = self.pending[: self.batch_size]
                del self.pending[: len(batch)]
                await self._write(batch)
            self._idle.set()
            if self._closing:
                return

    async def _write(self, batch: list[Finalization]) -> None:
        tries = 0

        async def write(conn: object) -> list[tuple[int, int]]:
            nonlocal tries
            tries += 1
            return await afinalize(conn, batch)  # type: ignore[arg-type]

        stale = await self.link.run(write)
        self.written += len(batch) - len(stale)
        if stale:
            if tries > 1:
                # A retried batch may find attempts its interrupted first try already closed.
                log.info(
                    "awa worker: %d finalization(s) were already closed after a reconnect",
                    len(stale),
                )
            else:
                self.stale += len(stale)
                for job_id, lease in stale:
                    log.warning(
                        "awa worker: stale finalization of job %s attempt lease %s ignored "
                        "(rescued, cancelled or closed elsewhere)",
                        job_id,
                        lease,
                    )

    async def drain(self) -> None:
        """Wait until everything queued so far is written."""
        if self.pending:
            self._wake.set()
        await self._idle.wait()

    def close(self) -> None:
        """Stop the loop after the pending outcomes are written."""
        self._closing = True
        self._wake.set()
