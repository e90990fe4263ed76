"""The ``awa_jobs`` notes of a worker process: which of its queues a note wakes, and handing a
wake-up on to the rest of its ``awa_worker --processes N`` family (awa_django/worker/family.py
says why and when).

Both are parts of ``WorkerRuntime``: ``FamilyWakeups`` answers the notes its listen connection
receives, ``HandOffs`` sends the notes that hand a wake-up on (for ``FamilyWakeups`` and for the
``Dispatcher``, after a claim that filled its batch).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from awa_django.db.links import Link, first_line
from awa_django.limits import QUEUE_NAME_RE
from awa_django.sql import query
from awa_django.worker.config import WorkerConfig
from awa_django.worker.dispatch import Dispatcher
from awa_django.worker.family import HAND_OFF, Family
from awa_django.worker.slots import Slots

__all__ = ["FamilyWakeups", "HandOffs"]

log = logging.getLogger("awa_django.worker")


class HandOffs:
    """Wakes the rest of the family for a queue: a note on ``awa_jobs`` whose payload is the
    queue name behind ``HAND_OFF``, sent on ``control_link``, one in flight per queue.
    ``bind`` (on the event loop) must be called before ``send``."""

    def __init__(self, control_link: Link, *, stopping: Callable[[], bool]) -> None:
        self.control_link = control_link
        self._stopping = stopping
        self._handing_off: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send from ``loop``."""
        self._loop = loop

    def send(self, queue: str) -> None:
        """Wake the rest of the family for ``queue`` (one hand-off in flight per queue)."""
        loop = self._loop
        if queue in self._handing_off or self._stopping() or loop is None or loop.is_closed():
            return
        self._handing_off.add(queue)
        task = loop.create_task(self._send(queue))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, queue: str) -> None:
        async def send(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(query("hand_off"), [HAND_OFF + queue])

        try:
            await self.control_link.run(send, give_up=self._stopping)
        except Exception as exc:  # the others' poll interval still finds the work
            log.warning("awa worker: could not hand a wake-up on (%s)", first_line(exc))
        finally:
            self._handing_off.discard(queue)


class FamilyWakeups:
    """Answers the ``awa_jobs`` notes of a worker process: wakes ``dispatcher``'s queue when
    this process answers the note (in a family, the leader answers plain notes, and the others
    the notes it hands on, or every note while the leader is frozen), hands it on when no slot
    is free here, and calls ``rediscover()`` for a queue this worker does not serve yet (with
    ``config.discover``)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        family: Family,
        dispatcher: Dispatcher,
        slots: Slots,
        hand_off: Callable[[str], None],
        rediscover: Callable[[], None],
    ) -> None:
        self.config = config
        self.family = family
        self.dispatcher = dispatcher
        self.slots = slots
        self._hand_off = hand_off
        self._rediscover = rediscover
        # Plain notes left to the leader since the last look at whether it is frozen: a
        # leader frozen just after a note answers none, and is seen frozen only later.
        self._left: set[str] = set()
        self._look: asyncio.TimerHandle | None = None

    def on_note(self, payload: str) -> None:
        """A note on ``awa_jobs``: wake the queue's dispatcher if this process answers it (in a
        family, the leader answers plain notes and the others the notes it hands on)."""
        if payload.startswith(HAND_OFF):
            name = payload[len(HAND_OFF) :]
            if not self.family.leader:
                self.dispatcher.wake(name)
            return
        if self.dispatcher.serves(payload):
            if self.family.leads():
                self.dispatcher.wake(payload)
                if not self.family.alone and not self.slots.has_room(payload):
                    self._hand_off(payload)  # no slot free here: a sibling may have one
            elif self.family.leader_frozen():
                self.dispatcher.wake(payload)  # the leader holds the lock but answers nothing
            else:
                self._leave(payload)
        elif self.config.discover and QUEUE_NAME_RE.fullmatch(payload):
            self._rediscover()  # a queue this worker does not serve yet

    def _leave(self, queue: str) -> None:
        """A plain note left to the leader: look again once a leader frozen since before it
        would be seen frozen (a beat interval past ``stale_after``), and then answer the notes
        left meanwhile."""
        self._left.add(queue)
        if self._look is None:
            loop = asyncio.get_running_loop()
            self._look = loop.call_later(1.25 * self.family.stale_after, self._look_again)

    def _look_again(self) -> None:
        self._look = None
        left, self._left = self._left, set()
        if self.family.leader_frozen():
            for queue in left:
                self.dispatcher.wake(queue)
