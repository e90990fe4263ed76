"""The admin page of the queues and job kinds declared in code (``awa.descriptor_status``,
docs/descriptors.md): what each is for (label, description, owner, links), how many live
workers declare it, and its status: live, stale (no live worker declares it) or drift (live
workers disagree: a deploy half rolled out). Above the list, a warning for each kind of
available jobs that no live worker declares."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from awa_django.admin.base import ReadOnlyAdmin
from awa_django.admin.read_alias import admin_read_alias
from awa_django.models import Descriptor
from awa_django.operator.descriptors import safe_links, undeclared_kinds

__all__ = ["DescriptorAdmin"]

#: The most "no worker serves" warnings one page shows.
_WARNINGS = 10


class DescriptorAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "what",
        "label",
        "owner",
        "status",
        "live_workers",
        "link_list",
        "summary",
    )
    list_filter = ("what", "stale", "drift")
    search_fields = ("name", "label", "owner")
    fields = (
        "what",
        "name",
        "label",
        "description",
        "owner",
        "link_list",
        "status",
        "live_workers",
        "versions",
        "declared_at",
        "last_seen_at",
    )
    readonly_fields = fields
    selection_noun = "descriptors"

    @staticmethod
    def selection_key(text: str) -> Any:
        """``what:name``: text PostgreSQL can store (a NUL in a URL is no descriptor's)."""
        if "\x00" in text or len(text) > 300 or ":" not in text:
            raise ValueError("not a descriptor's id")
        return text

    @admin.display(description="status", ordering="stale")
    def status(self, obj: Descriptor) -> str:
        if obj.stale:
            return "stale: no live worker declares it"
        if obj.drift:
            return f"drift: live workers hold {obj.versions} different declarations"
        return "live"

    @admin.display(description="links")
    def link_list(self, obj: Descriptor) -> SafeString:
        links = safe_links(obj.links)
        return format_html_join(
            ", ",
            '<a href="{}" rel="noopener noreferrer">{}</a>',
            ((url, name) for name, url in sorted(links.items())),
        )

    @admin.display(description="description")
    def summary(self, obj: Descriptor) -> SafeString:
        text = obj.description or ""
        short = text if len(text) <= 120 else text[:117] + "..."
        return format_html('<span title="{}">{}</span>', text, short)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "GET" and self.has_view_permission(request):
            orphans = undeclared_kinds(using=admin_read_alias())
            for orphan in orphans[:_WARNINGS]:
                self.message_user(
                    request,
                    f"No worker serves {orphan.kind}; {orphan.available:,} available.",
                    messages.WARNING,
                )
            if len(orphans) > _WARNINGS:
                self.message_user(
                    request,
                    f"... and {len(orphans) - _WARNINGS:,} more kinds no worker serves "
                    "(manage.py awa_status lists them).",
                    messages.WARNING,
                )
        return super().changelist_view(request, extra_context)
