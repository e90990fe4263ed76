"""The ``awa_django`` app config: registers system checks and job kinds when Django starts."""

from django.apps import AppConfig


class AwaDjangoConfig(AppConfig):
    """The awa_django app. ``ready()`` registers system checks and job kinds; no database I/O."""

    name = "awa_django"
    label = "awa_django"
    verbose_name = "Awa job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from awa_django import checks, periodic  # noqa: F401  (importing registers the checks)
        from awa_django.jobs import autodiscover_jobs

        # Import every installed app's jobs module and AWA["JOB_MODULES"], so kinds can be
        # enqueued by name anywhere and workers know every kind. Imports only; no database I/O.
        autodiscover_jobs()
