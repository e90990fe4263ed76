"""The named statements of fleet.sql."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.db import named_statements

__all__ = ["statement"]

FLEET_SQL = Path(__file__).with_name("fleet.sql")


def statement(name: str) -> str:
    """The statement named ``name`` in fleet.sql (``KeyError`` if unknown)."""
    return named_statements(FLEET_SQL)[name]
