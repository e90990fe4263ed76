"""The global-concurrency permits one worker process holds (docs/flow.md).

A permit is a session-level advisory lock of the process's claim connection, taken by
``awa.claim_v3`` for a job of a queue with a ``global_concurrency`` limit, one per unit of the
job's weight. The process keeps them while the handler runs (also past a rescue or a stop: the
limit counts handlers that really run) and hands them back on the claim connection, in the
next claim's ``p_release``, once the handler ended. Three things keep the bookkeeping and the
server's lock table equal:

* after a reconnect (the server freed the old session's locks), every held permit is taken
  again before the next claim; one another session took meanwhile cannot be, and is logged
  with its attempt: until that attempt ends the limit may be passed by it;
* after a claim that failed (a session lock taken by a statement that then failed stays
  held), every permit of the session not in the held set is released;
* permits to hand back are kept until a claim carrying them succeeded.

Everything here runs on the worker's event loop; nothing is thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import psycopg

from awa_django.sql import query

__all__ = ["Permits"]

log = logging.getLogger("awa_django.worker")


class Permits:
    """The permits of one worker process, by key (see the module docstring)."""

    def __init__(self) -> None:
        self.held: dict[int, str] = {}  # key -> what holds it, for log lines
        self.to_release: list[int] = []
        self._dirty = False

    def hold(self, keys: Iterable[int] | None, what: str) -> None:
        """A claim gave ``what`` (an attempt) these permits."""
        if keys:
            for key in keys:
                self.held[key] = what

    def give_back(self, keys: Iterable[int] | None) -> bool:
        """The attempt holding ``keys`` ended: hand them back with the next claim. Returns
        whether there was anything to hand back."""
        if not keys:
            return False
        for key in keys:
            if self.held.pop(key, None) is not None:
                self.to_release.append(key)
        return True

    def held_keys(self) -> list[int]:
        """The keys of attempts still running."""
        return list(self.held)

    def release_batch(self) -> list[int]:
        """The keys the next claim hands back (call ``released`` once it succeeded)."""
        return list(self.to_release)

    def released(self, keys: list[int]) -> None:
        """A claim handing back ``keys`` succeeded."""
        if keys:
            done = set(keys)
            self.to_release = [k for k in self.to_release if k not in done]

    def claim_failed(self) -> None:
        """A claim failed on a live connection: reset the session's permits before the next."""
        self._dirty = True

    async def on_connect(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A new claim connection: take the held permits again (the old session's are gone)."""
        self.to_release.clear()  # the server freed them with the old session
        self._dirty = False
        if not self.held:
            return
        cursor = await conn.execute(query("flow_retake"), [list(self.held)])
        row = await cursor.fetchone()
        lost = list(row[0]) if row and row[0] else []
        log.warning(
            "awa worker: claim connection reopened; took back %d global-concurrency permit(s)%s",
            len(self.held) - len(lost),
            ""
            if not lost
            else f"; {len(lost)} were taken by other workers meanwhile, so until "
            f"{', '.join(sorted({self.held[k] for k in lost}))} end(s) the queue's global "
            "limit may be passed",
        )
        for key in lost:
            # Not ours any more: never hand it back (that would free another worker's permit).
            self.held.pop(key, None)

    async def prepare(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Before a claim: after a failed one, release what the failed statement left held."""
        if not self._dirty:
            return
        await conn.execute(query("flow_reset"), [list(self.held)])
        self.to_release.clear()
        self._dirty = False
