"""Minimal Django settings for the benchmarks (database from DATABASE_URL).

``AWA_BENCH_SETTINGS``, a JSON object, is merged into ``AWA`` (``drain.py --setting`` sets it,
so the worker processes a drain starts read the same settings).
"""

from __future__ import annotations

import json
import os

import environ

SECRET_KEY = "benchmarks-only"
USE_TZ = True
DATABASES = {"default": environ.Env().db_url_config(os.environ["DATABASE_URL"])}
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "awa_django"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AWA = {"JOB_MODULES": ["benchmarks.benchjobs"]}
AWA.update(json.loads(os.environ.get("AWA_BENCH_SETTINGS", "{}")))
