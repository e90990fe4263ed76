"""A workflow's steps drawn as a graph: server-rendered SVG, one box per step coloured by its
state and linked to its job's page, dependencies as arrows, steps in columns by depth (a step
stands one column right of its deepest dependency)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from awa_django.operator import WorkflowStepState

__all__ = ["MAX_DRAWN", "workflow_svg"]

#: The most steps drawn; a larger workflow (a batch) shows its counts and step list instead.
MAX_DRAWN = 300

_WIDTH, _HEIGHT, _GAP_X, _GAP_Y, _PAD = 170, 34, 60, 14, 10

#: Fill and stroke of each state.
_COLOURS = {
    "waiting": ("#ffffff", "#8a8a8a"),
    "scheduled": ("#fff7d6", "#b59a2a"),
    "available": ("#fff7d6", "#b59a2a"),
    "retryable": ("#ffe9c7", "#c27a10"),
    "running": ("#dcecff", "#2f6fc0"),
    "waiting_external": ("#e6e0ff", "#6550c0"),
    "completed": ("#dff3e2", "#2f8a3f"),
    "failed": ("#fbdcdc", "#b42525"),
    "dead_lettered": ("#f3c2c2", "#8a1111"),
    "cancelled": ("#eeeeee", "#777777"),
    "skipped": ("#f6f6f6", "#aaaaaa"),
    "gone": ("#f6f6f6", "#cccccc"),
}


def _columns(steps: Sequence[WorkflowStepState]) -> dict[int, int]:
    """Each step's column: 0 without dependencies, else one more than its deepest one's (steps
    come in the order they were added, so every dependency is placed before its dependents)."""
    column: dict[int, int] = {}
    for step in steps:
        column[step.job_id] = 1 + max((column.get(u, 0) for u in step.after), default=-1)
    return column


def workflow_svg(steps: Sequence[WorkflowStepState], job_url: Callable[[int], str]) -> SafeString:
    """The graph of ``steps`` (at most ``MAX_DRAWN``) as an inline SVG element."""
    steps = list(steps)[:MAX_DRAWN]
    column = _columns(steps)
    rows: dict[int, int] = {}
    place: dict[int, tuple[int, int]] = {}
    for step in steps:
        c = column[step.job_id]
        r = rows.get(c, 0)
        rows[c] = r + 1
        place[step.job_id] = (_PAD + c * (_WIDTH + _GAP_X), _PAD + r * (_HEIGHT + _GAP_Y))
    width = _PAD * 2 + (max(column.values(), default=0) + 1) * (_WIDTH + _GAP_X) - _GAP_X
    height = _PAD * 2 + max(rows.values(), default=1) * (_HEIGHT + _GAP_Y) - _GAP_Y
    parts = [
        format_html(
            '<svg xmlns="http://www.w3.org/2000/svg" class="awa-workflow-graph" width="{}" '
            'height="{}" viewBox="0 0 {} {}" role="img" aria-label="workflow steps">'
            '<defs><marker id="awa-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
            'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            '<path d="M 0 0 L 10 5 L 0 10 z" fill="#888"/></marker></defs>',
            width,
            height,
            width,
            height,
        )
    ]
    for step in steps:
        x2, y2 = place[step.job_id]
        for upstream in step.after:
            if upstream not in place:
                continue
            x1, y1 = place[upstream]
            parts.append(
                format_html(
                    '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#888" '
                    'marker-end="url(#awa-arrow)"/>',
                    x1 + _WIDTH,
                    y1 + _HEIGHT // 2,
                    x2,
                    y2 + _HEIGHT // 2,
                )
            )
    for step in steps:
        x, y = place[step.job_id]
        fill, stroke = _COLOURS.get(step.state, ("#ffffff", "#444444"))
        label = step.step if len(step.step) <= 22 else step.step[:21] + "…"
        parts.append(
            format_html(
                '<a href="{}"><title>{}: {} (job {})</title>'
                '<rect x="{}" y="{}" width="{}" height="{}" rx="5" fill="{}" stroke="{}"/>'
                '<text x="{}" y="{}" font-size="12" font-family="sans-serif">{}</text>'
                '<text x="{}" y="{}" font-size="10" font-family="sans-serif" fill="#555">{}'
                "</text></a>",
                job_url(step.job_id),
                step.step,
                step.state,
                step.job_id,
                x,
                y,
                _WIDTH,
                _HEIGHT,
                fill,
                stroke,
                x + 6,
                y + 14,
                label,
                x + 6,
                y + 28,
                step.state.replace("_", " "),
            )
        )
    parts.append(mark_safe("</svg>"))
    return mark_safe("".join(str(p) for p in parts))
