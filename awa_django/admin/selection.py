"""The rows an admin action acts on: the primary keys of the selected rows, as the confirmation
page carries them in one form field (comma-separated, at most :data:`BULK_LIMIT`), each checked
by its page's ``selection_key``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from awa_django.exceptions import AwaError
from awa_django.limits import MAX_BIGINT

__all__ = ["BULK_LIMIT", "SELECTION_FIELD", "job_id_key", "parse_selection", "valid_key"]

#: The most rows one action may change.
BULK_LIMIT = 1000

#: The confirmation page's single field holding the selected primary keys.
SELECTION_FIELD = "awa_selected"

_JOB_ID = re.compile(r"[0-9]{1,19}")


def job_id_key(text: str) -> int:
    """A job id from its decimal text (ASCII digits, within ``bigint``), else ``ValueError``."""
    if _JOB_ID.fullmatch(text) is None or int(text) > MAX_BIGINT:
        raise ValueError(f"{text[:40]!r} is not a job id")
    return int(text)


def parse_selection(raw: str, key: Callable[[str], Any]) -> list[Any] | None:
    """The primary keys in ``raw`` (comma-separated, each checked by ``key``), or None when
    it is empty, malformed or longer than :data:`BULK_LIMIT`."""
    parts = raw.split(",") if raw else []
    if not parts or len(parts) > BULK_LIMIT:
        return None
    try:
        return [key(part) for part in parts]
    except (ValueError, AwaError):
        return None


def valid_key(text: str, key: Callable[[str], Any]) -> bool:
    """True when ``key`` accepts ``text`` as a primary key."""
    try:
        key(text)
    except (ValueError, AwaError):
        return False
    return True
