"""The named statements of fleet.sql."""

from __future__ import annotations

import functools
import re
from pathlib import Path

__all__ = ["statement"]

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


@functools.cache
def _statements() -> dict[str, str]:
    text = Path(__file__).with_name("fleet.sql").read_text(encoding="utf-8")
    matches = list(_NAME_RE.finditer(text))
    found: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        found[match.group(1)] = text[match.end() : end].strip().rstrip(";")
    return found


def statement(name: str) -> str:
    """The statement named ``name`` in fleet.sql (``KeyError`` if unknown)."""
    return _statements()[name]
