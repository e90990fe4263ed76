"""tests.settings with ``DEBUG = True``, as ``startproject`` writes it: Django's default logging
then gives the ``django`` logger a console handler of its own
(``DJANGO_SETTINGS_MODULE=tests.settings_debug``)."""

from __future__ import annotations

from tests.settings import *  # noqa: F403

DEBUG = True
