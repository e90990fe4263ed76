from django.apps import AppConfig


class TestAppConfig(AppConfig):
    """Application rows for tests that enqueue jobs in the same transaction."""

    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"
