"""Flow limits per job kind (docs/flow.md, "Per kind"): the operator's read, set and clear.

A kind's limits bound its attempts across every queue, worker process and host: a global
concurrency (counted by job weight) and a rate (jobs started per second, with a burst). Rows
of ``awa.flow_kind_limits``: ``"settings"`` rows written by workers when they start (from
``@job(global_concurrency=, rate_limit=, rate_burst=)`` and ``AWA["KINDS"]``), and
``"operator"`` overrides written here, which settings leave alone until cleared.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from datetime import datetime
from typing import Literal

from django.db import transaction

from awa_django.db.transactions import write_transaction
from awa_django.exceptions import InvalidOptionError
from awa_django.limits import check_flow_limits, check_kind_name, check_text
from awa_django.operator.rows import alias, fetch, fetch_one
from awa_django.sql import query

__all__ = ["KindLimits", "clear_kind_limits", "kind_limits", "set_kind_limits"]

log = logging.getLogger("awa_django.operator")


@dataclasses.dataclass(frozen=True, slots=True)
class KindLimits:
    """One job kind's flow limits in force across the fleet (``awa.flow_kind_limits``).

    ``global_concurrency`` is the most attempts of the kind running at once, in every queue,
    counted by job weight, and ``in_use`` the kind's permits held now (read from the server's
    lock table; None without a concurrency limit). ``rate_limit`` is jobs of the kind started
    per second and ``rate_burst`` the burst as set (None: the default,
    :attr:`burst_in_force`). ``waiting`` counts the jobs its limits hold parked now (shown as
    available everywhere). ``source`` is ``"settings"`` (from ``@job`` and ``AWA["KINDS"]``,
    written by the workers) or ``"operator"`` (the admin or ``awa_queue limit --kind``);
    ``updated_by`` says who wrote it.
    """

    kind: str
    global_concurrency: int | None
    in_use: int | None
    rate_limit: float | None
    rate_burst: int | None
    waiting: int
    source: Literal["settings", "operator"]
    updated_by: str | None
    updated_at: datetime

    @property
    def burst_in_force(self) -> int | None:
        """The burst the claim applies: ``rate_burst``, or a tenth of a second's worth of jobs,
        at least 1 (None without a rate)."""
        if self.rate_limit is None:
            return None
        if self.rate_burst is not None:
            return self.rate_burst
        return max(1, math.ceil(self.rate_limit / 10))

    def summary(self, *, in_use: bool = True) -> str:
        """One line: ``limit N (in use M), rate R/s burst B, W parked, source`` (the parts it
        has; what is in use and parked only with ``in_use``)."""
        parts = []
        if self.global_concurrency is not None:
            used = f" (in use {self.in_use or 0})" if in_use else ""
            parts.append(f"limit {self.global_concurrency}{used}")
        if self.rate_limit is not None:
            parts.append(f"rate {self.rate_limit:g}/s burst {self.burst_in_force}")
        if not parts:
            parts.append("no limits")
        if in_use and self.waiting:
            parts.append(f"{self.waiting} parked")
        return ", ".join([*parts, self.source])


def kind_limits(using: str | None = None) -> list[KindLimits]:
    """The flow limits of every job kind that has some (or jobs parked by them), by kind, with
    the permits in use and the jobs parked now (``awa.flow_kind_status_v1()``: it reads the
    server's lock table, for operators, not for the hot path)."""
    return fetch(KindLimits, "kind_limits", using=using)


def set_kind_limits(
    kind: str,
    *,
    global_concurrency: int | None = None,
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    actor: str,
    using: str | None = None,
) -> KindLimits:
    """Set job kind ``kind``'s flow limits across the fleet as an operator override; return the
    limits now in force.

    As :func:`~awa_django.operator.set_queue_limits` for a queue: the given limits replace the
    kind's as a whole (one left out is lifted, also when ``@job`` or ``AWA["KINDS"]`` sets it,
    until :func:`clear_kind_limits`); the same bounds; ``actor`` (text, at most 255
    characters) is recorded. ``kind`` is any job kind name (1-255 characters): kinds are names
    in the database, so one no process registers may be limited too. Bad input raises
    ``InvalidOptionError`` before anything is written; workers apply the limits from their
    next claim (within a poll interval) once the transaction commits.
    """
    check_kind_name(kind)
    limits = check_flow_limits(global_concurrency, rate_limit, rate_burst)
    who = _actor(actor)
    now = _write(using, [kind, *limits, who, False, None], kind, who, "set")
    if now is None:  # flow_kind_set_v1 returns the row it wrote, in the same transaction
        raise RuntimeError(f"awa.flow_kind_set_v1 wrote no limits for kind {kind!r}")
    return now


def clear_kind_limits(kind: str, *, actor: str, using: str | None = None) -> KindLimits | None:
    """Remove the operator's override of ``kind``'s flow limits; return the limits now in
    force (what this project's ``@job`` and ``AWA["KINDS"]`` give the kind, written as its
    ``"settings"`` row), or None when it has none. One transaction."""
    from awa_django.jobs import kind_flow_limits

    check_kind_name(kind)
    who = _actor(actor)
    configured = kind_flow_limits().get(kind)
    settings = json.dumps(configured) if configured is not None else None
    return _write(using, [kind, None, None, None, who, True, settings], kind, who, "cleared")


def _actor(actor: object) -> str:
    who = check_text("actor", actor, max_length=255)
    if not who.strip():
        raise InvalidOptionError("actor", "must name who made the change")
    return who


def _write(
    using: str | None,
    params: list[int | float | str | bool | None],
    kind: str,
    actor: str,
    done: str,
) -> KindLimits | None:
    """``awa.flow_kind_set_v1`` then the kind's limits now in force, in one transaction;
    logged once it commits."""
    database = alias(using)
    with write_transaction(database, statements=2) as connection:
        with connection.cursor() as c:
            c.execute(query("flow_kind_set"), params)
            c.fetchall()
        limits = fetch_one(KindLimits, "kind_limits_of", [kind], using=database)
        now = "no limits" if limits is None else limits.summary(in_use=False)

        def record() -> None:
            log.info("flow limits of kind %s %s by %s: %s", kind, done, actor, now)

        if connection.in_atomic_block:
            transaction.on_commit(record, using=database)
        else:
            record()
    return limits
