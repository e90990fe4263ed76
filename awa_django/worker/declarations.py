"""What a worker process declares (docs/descriptors.md): the queues it starts with (those
``--queue`` names, or the configured and default ones) and those of ``AWA["QUEUES"]``, and each
job kind it can run, with its descriptor (label, description, owner, links) and the hash of
its declaration, which tells processes running other code or settings apart.

The hash covers the descriptor and, for a queue, its settings; for a kind, its options as in
force (the defaults of ``AWA`` filled in), its flow limits (``AWA["KINDS"]`` winning) and its
function's module, name and source. It is computed over a canonical form (mappings and sets
sorted, other objects by ``repr``), so processes running the same code and settings agree
whatever their hash seed. A kind whose declaration cannot be described is left out (logged),
never the whole report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from awa_django.conf import AwaSettings, QueueSettings
from awa_django.jobs import Job

__all__ = ["MAX_DECLARATIONS", "declarations", "live_seconds"]

log = logging.getLogger("awa_django.worker")

#: The most queues and kinds one report holds (awa.descriptors_report_v1's bound).
MAX_DECLARATIONS = 10_000


def live_seconds(cfg: AwaSettings) -> float:
    """How long after its last runtime refresh a process counts as gone: three refreshes."""
    return min(3 * cfg.RUNTIME_REFRESH_INTERVAL, 86_400.0)


def declarations(
    kinds: Mapping[str, Job[Any, Any]], queues: Iterable[str], cfg: AwaSettings
) -> list[dict[str, Any]]:
    """The items of ``awa.descriptors_report_v1``: the queues (``queues`` and those of
    ``AWA["QUEUES"]``), then the kinds, each by name, at most :data:`MAX_DECLARATIONS`."""
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
        item = _kind_item(kind, kinds[kind], cfg)
        if item is not None:
            items.append(item)
    if len(items) > MAX_DECLARATIONS:
        log.warning(
            "awa worker: %d queues and kinds declared; only the first %d are reported",
            len(items),
            MAX_DECLARATIONS,
        )
        del items[MAX_DECLARATIONS:]
    return items


def _kind_item(kind: str, handle: Job[Any, Any], cfg: AwaSettings) -> dict[str, Any] | None:
    """A kind's item, computed once per handle and settings (reading its source is not free,
    and a worker reports on every tenth refresh); None when it cannot be described (logged
    once)."""
    key = (kind, handle, cfg)  # the objects themselves: an id could be reused
    if key not in _kind_items:
        if len(_kind_items) >= 10 * MAX_DECLARATIONS:
            _kind_items.clear()
        try:
            _kind_items[key] = _item("kind", kind, handle.descriptor, _kind_options(handle, cfg))
        except Exception as exc:  # a declaration that cannot be described: only it is left out
            log.warning("awa worker: kind %s is not reported (%s)", kind, exc)
            _kind_items[key] = None
    return _kind_items[key]


#: Items of kinds already described, by kind, handle and settings (both live as long as the
#: process, or the settings until an override).
_kind_items: dict[tuple[str, object, object], dict[str, Any] | None] = {}


def _kind_options(handle: Job[Any, Any], cfg: AwaSettings) -> dict[str, Any]:
    options = dataclasses.asdict(handle.options)
    options["queue"] = options.get("queue") or cfg.DEFAULT_QUEUE
    options["max_attempts"] = options.get("max_attempts") or cfg.MAX_ATTEMPTS
    limits = cfg.KINDS.get(handle.kind, handle.limits)
    func = handle.func
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        source = None  # no source to read (a built-in, a frozen module): its name stands
    return {
        "options": options,
        "limits": None if limits is None else dataclasses.asdict(limits),
        "takes_context": handle.takes_context,
        "function": f"{func.__module__}.{getattr(func, '__qualname__', '')}",
        "source": source,
    }


def _canonical(value: Any) -> Any:
    """``value`` as plain JSON whose text does not depend on dict or set order."""
    if isinstance(value, Mapping):
        pairs = [(_text(_canonical(k)), _canonical(v)) for k, v in value.items()]
        return [["map"], *sorted(pairs, key=lambda pair: pair[0])]
    if isinstance(value, set | frozenset):
        return [["set"], *sorted((_canonical(v) for v in value), key=_text)]
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _canonical(dataclasses.asdict(value))
    return repr(value)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True)


def _item(what: str, name: str, descriptor: Mapping[str, Any], options: Any) -> dict[str, Any]:
    described = {key: descriptor.get(key) for key in ("label", "description", "owner", "links")}
    text = _text(_canonical({"descriptor": described, "options": options}))
    return {
        "what": what,
        "name": name,
        "hash": hashlib.sha256(text.encode("ascii")).hexdigest(),
        **described,
    }
