"""Integrations with other Django APIs (the django.tasks backend)."""
