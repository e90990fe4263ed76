"""Reads of the queues and job kinds declared in code (docs/descriptors.md): what each is for,
whether live workers declare it (stale: none does) and agree on it (drift: they do not), and
the kinds of available jobs no live worker declares."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Literal

from awa_django.operator.rows import cursor, fetch, json_value
from awa_django.sql import query

__all__ = ["DescriptorStatus", "UndeclaredKind", "descriptors", "undeclared_kinds"]


@dataclasses.dataclass(frozen=True, slots=True)
class DescriptorStatus:
    """One declared queue or job kind (``what``). ``links`` maps names to http(s) URLs (a row
    written by other means that holds anything else reads as no links). ``live_workers``: the
    live processes that declare it; ``versions``: how many different declarations they hold.
    ``stale``: no live process declares it; ``drift``: live processes disagree (a deploy half
    rolled out). ``declared_at``: when its current declaration was first written;
    ``last_seen_at``: when a process last declared it (written at most hourly)."""

    what: Literal["queue", "kind"]
    name: str
    label: str | None
    description: str | None
    owner: str | None
    links: dict[str, str]
    declared_at: datetime
    last_seen_at: datetime
    live_workers: int
    versions: int
    stale: bool
    drift: bool


@dataclasses.dataclass(frozen=True, slots=True)
class UndeclaredKind:
    """A kind of available jobs that no live worker declares: no worker serves it.
    ``available`` counts among the first 100,000 available jobs."""

    kind: str
    available: int


def safe_links(value: object) -> dict[str, str]:
    """``value``'s links whose URL is http(s); anything else is dropped (rows are written by
    a function that checks them, but an admin page must never link to ``javascript:``)."""
    try:
        decoded = json_value(value)
    except ValueError:  # a JSON string Django already decoded, or not JSON at all
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {
        str(name): url
        for name, url in decoded.items()
        if isinstance(url, str) and url[:8].lower().startswith(("http://", "https://"))
    }


def descriptors(using: str | None = None) -> list[DescriptorStatus]:
    """Every declared queue, then every declared kind, by name."""
    return fetch(DescriptorStatus, "descriptor_status", using=using, convert={"links": safe_links})


def undeclared_kinds(using: str | None = None) -> list[UndeclaredKind]:
    """Kinds of available jobs no live worker declares, most jobs first (none while no live
    worker reports its declarations)."""
    with cursor(using) as c:
        c.execute(query("undeclared_kinds"))
        return [UndeclaredKind(str(kind), int(n)) for kind, n in c.fetchall()]
