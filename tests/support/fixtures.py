"""pytest fixtures for tests that touch the awa schema (loaded by conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.awa_schema import reset_awa

__all__ = ["clean_awa"]


@pytest.fixture
def clean_awa(transactional_db: None) -> Iterator[None]:
    """Start and end the test with empty awa tables.

    TransactionTestCase flushes only the tables of Django models, so the awa schema is emptied
    here; this also clears the producer's cache of known lanes.
    """
    reset_awa()
    yield
    reset_awa()


@pytest.fixture(autouse=True)
def _one_process_per_test() -> Iterator[None]:
    """Forget, after each test, the database a worker runtime run in this process first
    reached, and its hook that exits the process when a reconnect reaches another one
    (awa_django.db.connection.on_database_replaced, set by ``WorkerRuntime.run`` and
    ``awa_maintenance``).

    A worker process runs against one database for its life; the test session runs many
    runtimes in one process, between tests that reinstall the awa schema (migrations reversed
    and applied again): without this, the first runtime after a reinstall would take the new
    schema for a replaced database and end the whole session with status 70.
    """
    yield
    from awa_django.db import connection

    connection.on_database_replaced(None)
    with connection._identities_lock:
        connection._identities.clear()
