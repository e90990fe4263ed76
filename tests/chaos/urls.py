"""URLs of the chaos lane's Django settings: only awa_django's callback receiver."""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [path("awa/", include("awa_django.urls"))]
