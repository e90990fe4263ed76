"""URLs of awa_django: ``path("awa/", include("awa_django.urls"))`` in a project's URLconf.

* ``health/`` (name ``awa_django:health``): the health view (docs/observability.md, "Health
  probes"). It needs no login, so that probes can call it: mount it where only they reach it
  if queue names and worker host names are not for everyone.
"""

from django.urls import path

from awa_django import views

app_name = "awa_django"

urlpatterns = [
    path("health/", views.health, name="health"),
]
