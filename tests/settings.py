"""Django settings for awa_django's own test suite.

The database comes from ``DATABASE_URL``. When it is unset, tests/conftest.py starts an embedded
PostgreSQL and rewrites DATABASES before any connection is made; the placeholder below only lets
tools such as mypy's Django plugin import this module without a server.
"""

from __future__ import annotations

import json
from typing import Any

import environ

env = environ.Env()


def database_settings(url: str) -> dict[str, Any]:
    """DATABASES["default"] for a ``postgresql://`` URL."""
    config: dict[str, Any] = env.db_url_config(url)
    # A worker subprocess may be given persistent connections (AWA_TEST_CONN_MAX_AGE seconds).
    config["CONN_MAX_AGE"] = env.int("AWA_TEST_CONN_MAX_AGE", default=0)
    # As docs/configuration.md recommends (awa.W003): no JIT compilation of awa's views.
    options = "-c jit=off"
    # A second Django project on the same database keeps its own tables in a schema of its own
    # (tests/worker/test_queue_schema.py): AWA_TEST_SEARCH_PATH names it.
    search_path = env.str("AWA_TEST_SEARCH_PATH", default="")
    if search_path:
        options += f" -c search_path={search_path}"
    config["OPTIONS"] = {**config.get("OPTIONS", {}), "options": options}
    return config


SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]


def repeatable_settings(url: str) -> dict[str, Any]:
    """The same database as ``default``, with REPEATABLE READ as its transactions' default
    isolation (for tests of the isolation awa_django enforces)."""
    from psycopg import IsolationLevel

    config = database_settings(url)
    config["OPTIONS"] = {
        **config.get("OPTIONS", {}),
        "isolation_level": IsolationLevel.REPEATABLE_READ,
    }
    config["TEST"] = {"MIRROR": "default"}
    return config


_URL = env.str("DATABASE_URL", default="postgresql://postgres@127.0.0.1:5432/postgres")
DATABASES = {"default": database_settings(_URL), "repeatable": repeatable_settings(_URL)}

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "awa_django",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Intervals compressed so that worker and maintenance tests run in seconds. A subprocess can be
# given more overrides as JSON in AWA_TEST_OVERRIDES (a child of the fork server rebuilds AWA
# from AWA_BASE and its own overrides: tests/support/forkserver.py).
AWA_BASE: dict[str, Any] = {
    "JOB_MODULES": ["tests.jobs.common", "tests.jobs.tasks"],  # tests.jobs.DEFAULT_MODULES
    "POLL_INTERVAL": 0.05,
    "HEARTBEAT_INTERVAL": 0.2,
    "HEARTBEAT_STALENESS": 2.0,
    "PROMOTE_INTERVAL": 0.05,
    "RESCUE_INTERVAL": 0.2,
    "LEADER_ELECTION_INTERVAL": 0.2,
    "RUNTIME_REFRESH_INTERVAL": 0.5,
    "SHUTDOWN_TIMEOUT": 10.0,
    "RETRY_BACKOFF_BASE": 0.01,
}
AWA: dict[str, Any] = {**AWA_BASE, **json.loads(env.str("AWA_TEST_OVERRIDES", default="{}"))}

# The django.tasks backend (Django 6's django.tasks, or the django-tasks backport on 5.2).
TASKS = {
    "default": {
        "BACKEND": "awa_django.backends.tasks.AwaTaskBackend",
        "QUEUES": [],
        "OPTIONS": {},
    }
}
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")
