"""The django-tasks-db task of the cross-system benchmark."""

from __future__ import annotations

from django_tasks import task

from benchmarks.peers.sql import handle


@task()
def peer(key: int) -> None:
    """No-op or ledger row, per ``BENCH_MODE``."""
    handle(key)
