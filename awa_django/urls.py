"""URLs of awa_django. Include them under any prefix::

    urlpatterns = [path("awa/", include("awa_django.urls"))]

* ``callbacks/<callback_id>/`` (name ``awa_django:callback``): the signed callback receiver,
  ``POST /awa/callbacks/<callback_id>/`` (``awa_django.callbacks.views.receive``,
  docs/callbacks.md); ``awa_django.callbacks.callback_path(callback_id)`` gives that path for a
  callback id.
* ``health/`` (name ``awa_django:health``): the health view (docs/observability.md, "Health
  probes"). It needs no login, so that probes can call it: mount it where only they reach it
  if queue names and worker host names are not for everyone.
"""

from __future__ import annotations

from django.urls import path

from awa_django import views
from awa_django.callbacks.views import receive

__all__ = ["app_name", "urlpatterns"]

app_name = "awa_django"

urlpatterns = [
    path("callbacks/<str:callback_id>/", receive, name="callback"),
    path("health/", views.health, name="health"),
]
