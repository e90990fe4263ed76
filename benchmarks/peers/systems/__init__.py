"""The systems under test, by name."""

from __future__ import annotations

import importlib

from benchmarks.peers.systems.base import System

__all__ = ["NAMES", "get"]

# name -> module under benchmarks.peers.systems; the order is the report's.
_MODULES = {
    "awa_django": "awa_system",
    "procrastinate": "procrastinate_system",
    "pgqueuer_asyncpg": "pgqueuer_system",
    "pgqueuer_psycopg": "pgqueuer_system",
    "django_tasks_db": "dtdb_system",
    "chancy": "chancy_system",
}
NAMES = tuple(_MODULES)


def get(name: str) -> System:
    """The :class:`System` called ``name``."""
    module = importlib.import_module(f"benchmarks.peers.systems.{_MODULES[name]}")
    system: System = module.make(name)
    return system
