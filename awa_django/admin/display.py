"""How the admin shows job data: escaped JSON blocks, the error timeline, the SVG sparkline.

Everything that comes from job data (arguments, metadata, tags, results, errors) is hostile
HTML: it reaches the page only through ``format_html``, which escapes it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from awa_django.timetext import ago, duration

__all__ = [
    "JobDetail",
    "attempt_timeline",
    "error_timeline",
    "outcome_chart",
    "pretty",
    "sparkline",
    "when",
]


def when(value: datetime | None, now: datetime | None = None) -> str:
    """A time as the admin shows it: how long ago (or from now), with the absolute time to
    the second in the site's time zone on hover (``<time title=...>``), one format
    everywhere."""
    if not isinstance(value, datetime):
        return "-"
    moment = value if timezone.is_aware(value) else timezone.make_aware(value, UTC)
    local = timezone.localtime(moment)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        moment.isoformat(timespec="seconds"),
        local.strftime("%Y-%m-%d %H:%M:%S %Z"),
        ago(((now or timezone.now()) - moment).total_seconds()),
    )


def pretty(value: Any) -> str:
    """JSON as an escaped <pre> block."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html("<pre style='white-space: pre-wrap'>{}</pre>", text)


def error_timeline(errors: Any) -> str:
    """One list item per failed attempt: attempt, time, type, message and traceback tail."""
    if not errors:
        return "-"
    return format_html(
        "<ol>{}</ol>",
        format_html_join(
            "",
            "<li><b>attempt {}</b> at {}: {}: {}<pre style='white-space: pre-wrap'>{}</pre></li>",
            (
                (
                    e.get("attempt", "?"),
                    e.get("at", "?"),
                    e.get("type", "-"),
                    e.get("message", ""),
                    e.get("traceback", ""),
                )
                for e in errors
                if isinstance(e, dict)
            ),
        ),
    )


def sparkline(points: Sequence[int], width: int = 240, height: int = 40) -> str:
    """An inline SVG polyline of ``points`` (server-rendered, no JavaScript)."""
    top = max(max(points, default=0), 1)
    step = width / max(len(points) - 1, 1)
    coords = " ".join(
        f"{i * step:.1f},{height - (p / top) * (height - 2) - 1:.1f}" for i, p in enumerate(points)
    )
    return format_html(
        '<svg width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<polyline fill="none" stroke="#417690" stroke-width="1.5" points="{}"/></svg>',
        width,
        height,
        width,
        height,
        f"completions per minute, last hour, peak {top}",
        coords,
    )


def outcome_chart(
    completed: Sequence[int], failed: Sequence[int], width: int = 240, height: int = 40
) -> str:
    """Two lines on one scale, server-rendered SVG (no JavaScript, no CDN): completions per
    minute (blue) and failures per minute (red: failed, cancelled by a handler or the
    operator, and dead-lettered), oldest first."""
    top = max(max(completed, default=0), max(failed, default=0), 1)
    step = width / max(len(completed) - 1, 1)

    def line(points: Sequence[int]) -> str:
        return " ".join(
            f"{i * step:.1f},{height - (p / top) * (height - 2) - 1:.1f}"
            for i, p in enumerate(points)
        )

    return format_html(
        '<svg width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<polyline fill="none" stroke="#417690" stroke-width="1.5" points="{}"/>'
        '<polyline fill="none" stroke="#ba2121" stroke-width="1.5" points="{}"/></svg>',
        width,
        height,
        width,
        height,
        f"per minute, last hour: completed (blue, {sum(completed)} in all), "
        f"failed (red, {sum(failed)} in all), peak {top}",
        line(completed),
        line(failed),
    )


class JobDetail:
    """Pretty-printed read-only fields shared by the job admins' detail pages."""

    @admin.display(description="arguments")
    def pretty_args(self, obj: Any) -> str:
        return pretty(obj.args)

    @admin.display(description="metadata")
    def pretty_metadata(self, obj: Any) -> str:
        return pretty(obj.metadata)

    @admin.display(description="unique key")
    def unique_key(self, obj: Any) -> str:
        """The key a unique job holds (or held): its text, how long and in which states it
        blocks duplicates; "-" for a job that is not unique."""
        spec = obj.metadata.get("awa:unique") if isinstance(obj.metadata, dict) else None
        if not isinstance(spec, dict):
            return "-"
        states = spec.get("states")
        key = spec.get("key")
        return format_html(
            "<code>{}</code> while {}{}",
            "(its arguments)" if key is None else str(key)[:200],
            ", ".join(map(str, states)) if isinstance(states, list) else "?",
            _seconds_text(spec.get("for")),
        )

    @admin.display(description="retry policy")
    def retry_policy(self, obj: Any) -> str:
        """The job's own retry policy (shape, base, cap, jitter, maximum age, exceptions); "-"
        for a job that follows RETRY_BACKOFF_BASE."""
        spec = obj.metadata.get("awa:retry") if isinstance(obj.metadata, dict) else None
        if not isinstance(spec, dict):
            return "-"
        parts = [str(spec.get("backoff", "?"))]
        for field in ("base", "cap", "jitter", "max_age"):
            if isinstance(spec.get(field), int | float):
                parts.append(f"{field} {spec[field]:g}")
        for field in ("retry_on", "fail_on"):
            if isinstance(spec.get(field), list):
                parts.append(f"{field} {', '.join(map(str, spec[field]))}")
        return format_html("<code>{}</code>", "; ".join(parts))

    @admin.display(description="tags")
    def tag_list(self, obj: Any) -> str:
        if not obj.tags:
            return "-"
        return format_html_join(", ", "<code>{}</code>", ((tag,) for tag in obj.tags))

    @admin.display(description="result")
    def pretty_result(self, obj: Any) -> str:
        return pretty(obj.result)

    @admin.display(description="progress")
    def pretty_progress(self, obj: Any) -> str:
        return pretty(obj.progress)

    @admin.display(description="attempts")
    def attempt_timeline(self, obj: Any) -> str:
        """One line per attempt, oldest first: each failed one with when, how (failed, or
        rescued by the maintenance leader, and why) and its error and traceback tail; then
        the last one as it stands (running, waiting, completed after how long, in the DLQ)."""
        return attempt_timeline(obj)


_FAILED = "<li><b>attempt {}</b>, {}: {} {}: {}<pre style='white-space: pre-wrap'>{}</pre></li>"
#: How an attempt with an error entry ended, by the error's type (else it failed).
_ENDED = {
    "awa_django.Rescued": "rescued by the maintenance leader:",
    "awa_django.Cancel": "cancelled by its handler:",
}


def attempt_timeline(obj: Any) -> str:
    """The attempts of a job row (live, terminal or dead-lettered) as an ordered list."""
    errors = [e for e in (obj.errors or []) if isinstance(e, dict)]
    failed = format_html_join(
        "",
        _FAILED,
        (
            (
                e.get("attempt", "?"),
                _at(e.get("at")),
                _ENDED.get(str(e.get("type")), "failed with"),
                e.get("type", "-"),
                e.get("message", ""),
                e.get("traceback", ""),
            )
            for e in errors
        ),
    )
    last = _last_attempt(obj, {e.get("attempt") for e in errors})
    if not errors and not last:
        return "-"
    return format_html("<ol>{}{}</ol>", failed, last)


def _at(value: Any) -> str:
    """An error's time (ISO text in the job's errors) as the admin shows times."""
    try:
        return when(datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)


def _last_attempt(obj: Any, failed: set[Any]) -> str:
    attempt = getattr(obj, "attempt", 0) or 0
    if getattr(obj, "dlq_at", None) is not None:  # a dead-lettered job
        return format_html(
            "<li>moved to the DLQ {}: {}</li>", when(obj.dlq_at), obj.dlq_reason or "-"
        )
    state = str(getattr(obj, "state", "") or "")
    claimed = getattr(obj, "attempted_at", None)
    if attempt < 1 or claimed is None or (state in ("failed", "cancelled") and attempt in failed):
        return ""  # its error entry above says how it ended
    ended = getattr(obj, "finalized_at", None)
    if state in ("completed", "failed", "cancelled") and ended is not None:
        how = f"{state} after {duration((ended - claimed).total_seconds())}"
    elif state == "waiting_external":
        how = "waiting for a callback"
    elif state == "running":
        how = "running"
    else:
        return ""
    return format_html("<li><b>attempt {}</b>, claimed {}: {}</li>", attempt, when(claimed), how)


def _seconds_text(value: object) -> str:
    """ ", for N s" for a stored number of seconds (any JSON number, however large), else ""."""
    if type(value) not in (int, float):
        return ""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return ", for a very long time"
    return f", for {seconds:g} s" if math.isfinite(seconds) else ""
