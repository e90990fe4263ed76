"""What the two Django systems (awa_django, django-tasks-db) share: set-up, schema, closing."""

from __future__ import annotations

__all__ = ["DjangoProducer", "migrate", "setup"]


def setup() -> None:
    """``django.setup()`` with ``benchmarks.peers.django_settings`` (``BENCH_SYSTEM`` picks)."""
    import django

    django.setup()


def migrate() -> None:
    """Install the schema the way a Django project does: ``manage.py migrate``."""
    setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class DjangoProducer:
    """Base of the Django producers: Django set up on creation, its connection closed on close."""

    def __init__(self) -> None:
        setup()

    async def close(self) -> None:
        from django.db import connection

        connection.close()
