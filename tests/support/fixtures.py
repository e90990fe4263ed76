"""pytest fixtures for tests that touch the awa schema (loaded by conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.awa_schema import reset_awa


@pytest.fixture
def clean_awa(transactional_db: None) -> Iterator[None]:
    """Start and end the test with empty awa tables.

    TransactionTestCase flushes only the tables of Django models, so the awa schema is emptied
    here; this also clears the producer's cache of known lanes.
    """
    reset_awa()
    yield
    reset_awa()
