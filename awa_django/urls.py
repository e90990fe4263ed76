"""URLs of awa_django: the signed callback receiver (docs/callbacks.md).

Include them under any prefix::

    urlpatterns = [path("awa/", include("awa_django.urls"))]

which serves ``POST /awa/callbacks/<callback_id>/`` (``awa_django.callbacks.views.receive``).
``awa_django.callbacks.callback_path(callback_id)`` gives that path for a callback id.
"""

from __future__ import annotations

from django.urls import path

from awa_django.callbacks.views import receive

__all__ = ["app_name", "urlpatterns"]

app_name = "awa_django"

urlpatterns = [
    path("callbacks/<str:callback_id>/", receive, name="callback"),
]
