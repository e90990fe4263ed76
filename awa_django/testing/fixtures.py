"""The test kit's pytest fixtures, loaded by pytest on its own (the ``pytest11`` entry point):
``awa_drain``, ``awa_jobs`` and ``awa_immediate`` (docs/testing.md).

A test that uses them needs database access as any other does (pytest-django's ``django_db``
mark, or its ``db`` / ``transactional_db`` fixture). Nothing is imported from Django until a
fixture is used, so the plugin is harmless in a project that does not use awa_django.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = ["AwaJobs", "awa_drain", "awa_immediate", "awa_jobs"]


class AwaJobs:
    """The ``awa_jobs`` fixture: the test kit's reads and assertions in one place.

    ``enqueued(kind=None, queue=None)`` is ``enqueued_jobs``; ``assert_enqueued``,
    ``assert_not_enqueued`` and ``drain`` are those of ``awa_django.testing``."""

    def __init__(self) -> None:
        from awa_django import testing

        self.enqueued = testing.enqueued_jobs
        self.assert_enqueued = testing.assert_enqueued
        self.assert_not_enqueued = testing.assert_not_enqueued
        self.drain = testing.drain


@pytest.fixture
def awa_drain() -> Callable[..., Any]:
    """``awa_django.testing.drain``: run the enqueued jobs in-process, in the test's
    transaction; returns one ``JobRun`` per job run."""
    from awa_django.testing import drain

    return drain


@pytest.fixture
def awa_jobs() -> AwaJobs:
    """What the test enqueued, and assertions on it (:class:`AwaJobs`)."""
    return AwaJobs()


@pytest.fixture
def awa_immediate() -> Iterator[list[Any]]:
    """Immediate mode for the test: each job runs when the transaction that enqueued it
    commits. The value is the list of the jobs run (``JobRun``)."""
    from awa_django.testing import immediate

    with immediate() as runs:
        yield runs
