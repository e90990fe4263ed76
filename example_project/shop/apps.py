from django.apps import AppConfig


class ShopConfig(AppConfig):
    """A toy shop whose orders enqueue jobs in the same transaction."""

    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"
