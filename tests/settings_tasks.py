"""tests.settings with more django.tasks backends, for the task tests and the workers they start
(``DJANGO_SETTINGS_MODULE=tests.settings_tasks``): a second AwaTaskBackend, ``secondary``, and
a backend of another kind, ``immediate``."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import TASKS as _TASKS

try:
    import django.tasks  # noqa: F401

    _IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
except ImportError:
    _IMMEDIATE = "django_tasks.backends.immediate.ImmediateBackend"

TASKS = {
    **_TASKS,
    "secondary": {
        "BACKEND": "awa_django.backends.tasks.AwaTaskBackend",
        "QUEUES": [],
        "OPTIONS": {"max_attempts": 2},
    },
    "immediate": {"BACKEND": _IMMEDIATE, "QUEUES": []},
}
