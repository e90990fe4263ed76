"""Spans and times as people read them, in log lines and the admin: ``18.9 ms``, ``4.2 s``,
``3 min 5 s``, ``2 h 10 min``, ``3.5 days``; ``3 min ago``, ``in 2 h``."""

from __future__ import annotations

__all__ = ["ago", "duration"]


def duration(seconds: float) -> str:
    """A span, precise where it is short: ``18.9 ms``, ``4.2 s``, ``3 min 5 s``,
    ``2 h 10 min``, ``3.5 days`` (negative spans read as 0)."""
    if seconds < 1:
        return f"{max(seconds, 0) * 1000:.1f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if seconds < 172_800:
        hours, minutes = divmod(round(seconds / 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{seconds / 86_400:.1f} days"


def ago(seconds: float) -> str:
    """How long ago (``seconds`` > 0) or from now (< 0), coarse: ``just now``, ``12 s ago``,
    ``3 min ago``, ``in 2 h 5 min``, ``4 days ago``."""
    span = abs(seconds)
    if span < 1:
        return "just now"
    if span < 60:
        text = f"{int(span)} s"
    elif span < 3600:
        text = f"{int(span // 60)} min"
    elif span < 86_400:
        hours, minutes = divmod(int(span // 60), 60)
        text = f"{hours} h {minutes} min" if minutes else f"{hours} h"
    else:
        text = f"{int(span // 86_400)} days"
    return f"{text} ago" if seconds > 0 else f"in {text}"
