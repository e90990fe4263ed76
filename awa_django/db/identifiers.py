"""Validation of identifiers that reach SQL (queue names)."""

from __future__ import annotations

import re

from awa_django.exceptions import InvalidOptionError

__all__ = ["QUEUE_NAME_RE", "validate_queue_name"]

QUEUE_NAME_RE = re.compile(r"[a-z0-9_.-]{1,63}")


def validate_queue_name(queue: object) -> str:
    """Return ``queue`` if it matches ``[a-z0-9_.-]{1,63}``; raise ``InvalidOptionError`` otherwise.

    The same rule is enforced in SQL (``awa.valid_queue_name``), so a name that passes here is
    safe to embed in JSON and never needs quoting as an identifier (queues are values, not
    identifiers, everywhere in the schema).
    """
    if type(queue) is not str or QUEUE_NAME_RE.fullmatch(queue) is None:
        raise InvalidOptionError(
            "queue", f"{queue!r} is not a valid queue name (1-63 characters of a-z 0-9 _ . -)"
        )
    return queue
