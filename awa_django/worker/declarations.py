"""What a worker process declares (docs/descriptors.md): each queue it serves or the settings
name, and each job kind it can run, with its descriptor (label, description, owner, links)
and the hash of its declaration, which tells processes running other code apart."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from awa_django.conf import AwaSettings, QueueSettings
from awa_django.jobs import Job

__all__ = ["declarations", "live_seconds"]


def live_seconds(cfg: AwaSettings) -> float:
    """How long after its last runtime refresh a process counts as gone: three refreshes."""
    return min(3 * cfg.RUNTIME_REFRESH_INTERVAL, 86_400.0)


def declarations(
    kinds: Mapping[str, Job[Any, Any]], queues: Iterable[str], cfg: AwaSettings
) -> list[dict[str, Any]]:
    """The items of ``awa.descriptors_report_v1``: the queues (``queues`` and those of
    ``AWA["QUEUES"]``), then the kinds, each by name. The hash covers the descriptor and the
    options: for a queue its settings, for a kind its ``@job`` options, limits and function."""
    items: list[dict[str, Any]] = []
    for name in sorted(set(queues) | set(cfg.QUEUES)):
        settings = cfg.QUEUES.get(name, QueueSettings())
        options = {
            f.name: getattr(settings, f.name)
            for f in dataclasses.fields(settings)
            if f.name != "descriptor"
        }
        items.append(_item("queue", name, settings.descriptor, options))
    for kind in sorted(kinds):
        handle = kinds[kind]
        options = {
            "options": dataclasses.asdict(handle.options),
            "limits": None if handle.limits is None else dataclasses.asdict(handle.limits),
            "takes_context": handle.takes_context,
            "function": f"{handle.func.__module__}.{getattr(handle.func, '__qualname__', '')}",
        }
        items.append(_item("kind", kind, handle.descriptor, options))
    return items


def _item(what: str, name: str, descriptor: Mapping[str, Any], options: Any) -> dict[str, Any]:
    described = {key: descriptor.get(key) for key in ("label", "description", "owner", "links")}
    text = json.dumps({"descriptor": described, "options": options}, sort_keys=True, default=repr)
    return {
        "what": what,
        "name": name,
        "hash": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
        **described,
    }
