from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from django.views.static import serve

from shop import views

urlpatterns = [
    path("", RedirectView.as_view(url="/orders/new/", permanent=False)),
    path("orders/new/", views.new_order, name="new_order"),
    path("orders/<int:order_id>/", views.order_detail, name="order"),
    path("admin/", admin.site.urls),
    # The signed callback receiver: POST /awa/callbacks/<callback_id>/ (docs/callbacks.md).
    path("awa/", include("awa_django.urls")),
]

if settings.AWA_DEMO_SERVE_STATIC:
    # Local demo only (see settings.AWA_DEMO_SERVE_STATIC): works with DEBUG off, unlike
    # django.conf.urls.static.static(), because the demo runs with production settings.
    urlpatterns += [
        path(
            f"{settings.STATIC_URL.lstrip('/')}<path:path>",
            serve,
            {"document_root": settings.STATIC_ROOT},
        ),
    ]
