"""The ``awa_django`` app config: registers system checks and job kinds when Django starts."""

from typing import Any

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db.models.signals import pre_migrate


class AwaDjangoConfig(AppConfig):
    """The awa_django app. ``ready()`` registers system checks and job kinds; no database I/O."""

    name = "awa_django"
    label = "awa_django"
    verbose_name = "Awa job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from awa_django import checks, periodic  # noqa: F401  (importing registers the checks)
        from awa_django.db import schema_guard
        from awa_django.jobs import autodiscover_jobs

        # Import every installed app's jobs module and AWA["JOB_MODULES"], so kinds can be
        # enqueued by name anywhere and workers know every kind. Imports only; no database I/O.
        autodiscover_jobs()
        _load_immediate_mode()
        setting_changed.connect(_on_setting_changed, dispatch_uid="awa_django.immediate_mode")
        # One queue schema per project: refused before any app migrates (docs/schema.md).
        pre_migrate.connect(schema_guard.check_before_migrate, sender=self)


def _load_immediate_mode() -> None:
    """Test settings with ``AWA["TESTING"]["MODE"] = "immediate"``: load the test kit, whose
    import hooks immediate mode into enqueue (docs/testing.md). Otherwise nothing is loaded."""
    from awa_django.conf import get_awa_settings

    try:
        mode = get_awa_settings().TESTING["MODE"]
    except ImproperlyConfigured:
        return  # reported by the system checks, and by whatever reads the settings
    if mode == "immediate":
        import awa_django.testing  # noqa: F401


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "AWA":  # override_settings(AWA={... "TESTING": {"MODE": "immediate"}})
        _load_immediate_mode()
