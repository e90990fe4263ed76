"""The global-concurrency permits and serial-key locks one worker process holds (docs/flow.md).

A permit is a session-level advisory lock of the process's claim connection, taken by
``awa.claim_v3`` for a job of a queue with a ``global_concurrency`` limit, one per unit of the
job's weight. A serial key's run lock is the same kind of lock (another class), taken for a job
enqueued with a ``serial_key``: while it is held no other job of the key starts anywhere. The
process keeps both while the handler runs (also past a rescue or a stop: the limit and the key
count handlers that really run) and hands them back on the claim connection, in the next
claim's ``p_release`` and ``p_serial_release``, once the handler ended; a released serial key
is handed on to the oldest job waiting for it. These things keep the bookkeeping and the
server's lock table equal:

* after a reconnect (the server freed the old session's locks), every held lock is taken again
  before the next claim; one another session took meanwhile cannot be, and is logged with its
  attempt: until that attempt ends the limit may be passed by it, or two jobs of its serial
  key may run at once. Serial keys of attempts that ended are handed on then (the old session
  freed them, nobody handed them on);
* after a claim that failed (a session lock taken by a statement that then failed stays
  held), every lock of the session not in the held set is released, and the serial keys that
  claim carried are handed on (its unlock may have stuck while its hand-off rolled back);
* locks to hand back are taken out of the list by the claim that carries them
  (``release_batch``), and that claim sends them once (a retry of its statement does not), so
  that two claims never hand back the same lock: the second would free it from an attempt the
  first one gave it to. A claim that fails leaves them to the reset before the next claim, or
  to the server when the session is lost (``claim_failed`` with its serial keys).

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


class _Locks:
    """The locks of one advisory-lock class: held ones (key -> what holds it, for log lines),
    ended ones not handed back yet, and (serial keys) those a failed claim carried.

    ``kind`` names them in log lines and ``lost`` says what a lock taken by another worker
    during a reconnect means; ``prefix`` names the class's queries (``<prefix>_retake``,
    ``<prefix>_reset``, ``<prefix>_release``). Serial keys (``hands_on``) are handed on to
    their next job when released, so keys that ended are handed on after a reconnect and by the
    reset after a failed claim.
    """

    def __init__(self, kind: str, lost: str, prefix: str, *, hands_on: bool) -> None:
        self.kind = kind
        self.lost = lost
        self.prefix = prefix
        self.hands_on = hands_on
        self.held: dict[int, str] = {}
        self.to_release: list[int] = []
        self.failed: list[int] = []

    def hold(self, keys: Iterable[int], what: str) -> None:
        for key in keys:
            self.held[key] = what

    def give_back(self, keys: Iterable[int]) -> None:
        for key in keys:
            if self.held.pop(key, None) is not None:
                self.to_release.append(key)

    def release_batch(self) -> list[int]:
        keys, self.to_release = self.to_release, []
        return keys

    def _ended(self) -> list[int]:
        ended = self.to_release + self.failed
        self.to_release = []
        self.failed = []
        return ended

    async def retake(self, conn: psycopg.AsyncConnection[Any]) -> None:
        ended = self._ended()  # the server freed them with the old session
        if ended:
            # Their attempts ended while the connection was down, and whenever the old session
            # ended before they did, another worker may have taken their locks meanwhile.
            log.warning(
                "awa worker: claim connection reopened; %d %s of attempts that ended while it "
                "was down were not held for all that time, so meanwhile %s",
                len(ended),
                self.kind,
                self.lost,
            )
            if self.hands_on:
                await conn.execute(query(f"{self.prefix}_release"), [ended])
        if not self.held:
            return
        cursor = await conn.execute(query(f"{self.prefix}_retake"), [list(self.held)])
        row = await cursor.fetchone()
        lost = list(row[0]) if row and row[0] else []
        log.warning(
            "awa worker: claim connection reopened; took back %d %s%s",
            len(self.held) - len(lost),
            self.kind,
            ""
            if not lost
            else f"; {len(lost)} were taken by other workers meanwhile, so until "
            f"{', '.join(sorted({self.held[k] for k in lost}))} end(s) {self.lost}",
        )
        for key in lost:
            # Not ours any more: never hand it back (that would free another worker's lock).
            self.held.pop(key, None)

    async def reset(self, conn: psycopg.AsyncConnection[Any]) -> None:
        ended = self._ended()  # released by the reset (still held) or handed on here
        params: list[Any] = [list(self.held)]
        if self.hands_on:
            params.append(ended)
        await conn.execute(query(f"{self.prefix}_reset"), params)


class Permits:
    """The permits and serial-key locks of one worker process, by key (see the module
    docstring)."""

    def __init__(self) -> None:
        self._permits = _Locks(
            "concurrency permit(s) (of queue and kind limits)",
            "the queue's global limit may be passed",
            "flow",
            hands_on=False,
        )
        self._serial = _Locks(
            "serial key lock(s)",
            "another job of the same serial key may run at the same time",
            "serial",
            hands_on=True,
        )
        self._dirty = False

    @property
    def held(self) -> dict[int, str]:
        """Permits held by running attempts: key -> what holds it."""
        return self._permits.held

    @property
    def to_release(self) -> list[int]:
        """Permits of ended attempts that no claim carries yet."""
        return self._permits.to_release

    def hold(self, keys: Iterable[int] | None, what: str, serial: int | None = None) -> None:
        """A claim gave ``what`` (an attempt) these permits and, for a job with a serial key,
        its key's lock ``serial``."""
        if keys:
            self._permits.hold(keys, what)
        if serial is not None:
            self._serial.hold([serial], what)

    def give_back(self, keys: Iterable[int] | None, serial: int | None = None) -> bool:
        """The attempt holding ``keys`` (and ``serial``) ended: hand them back with the next
        claim. Returns whether there was anything to hand back."""
        if keys:
            self._permits.give_back(keys)
        if serial is not None:
            self._serial.give_back([serial])
        return bool(keys) or serial is not None

    def pending(self) -> bool:
        """Whether permits or serial keys of ended attempts wait for a claim to hand them back
        (or a failed claim's reset for the next one)."""
        return bool(self._permits.to_release or self._serial.to_release or self._dirty)

    def held_keys(self) -> list[int]:
        """The permits of attempts still running."""
        return list(self._permits.held)

    def serial_held_keys(self) -> list[int]:
        """The serial key locks of attempts still running."""
        return list(self._serial.held)

    def release_batch(self) -> list[int]:
        """The permits the next claim hands back, taken out of the list: only that claim carries
        them (after it failed, ``prepare`` frees whatever the session holds and no running
        attempt does)."""
        return self._permits.release_batch()

    def serial_release_batch(self) -> list[int]:
        """The serial key locks the next claim hands back (and hands on), taken out of the list
        like permits."""
        return self._serial.release_batch()

    def claim_failed(self, serial: Iterable[int] = ()) -> None:
        """A claim failed (its statement, or its connection): reset the session's locks before
        the next claim, and hand on the serial keys ``serial`` it carried then (or after a
        reconnect)."""
        self._dirty = True
        self._serial.failed.extend(serial)

    async def on_connect(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A new claim connection: take the held locks again (the old session's are gone) and
        hand on the serial keys of attempts that ended."""
        self._dirty = False
        await self._permits.retake(conn)
        await self._serial.retake(conn)

    async def prepare(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Before a claim: after a failed one, release what the failed statement left held
        (serial keys released so, and those it carried, are handed on)."""
        if not self._dirty:
            return
        await self._permits.reset(conn)
        await self._serial.reset(conn)
        self._dirty = False
