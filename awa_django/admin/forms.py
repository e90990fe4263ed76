"""The forms of the admin's actions and pages: what an operator types in before an action runs.

* retrying dead-lettered jobs (:class:`RetryForm`) and failed or cancelled jobs from history
  (:class:`RetryFromHistoryForm`): another queue or priority, both optional;
* "Set flow limits" (docs/flow.md): :class:`FlowLimitsForm` for queues,
  :class:`KindFlowLimitsForm` for job kinds, :class:`LimitKindForm` for the "limit a kind" page.
  They check their values as ``set_queue_limits`` and ``set_kind_limits`` do, so a bad value is
  shown on the page and nothing changes; ``clear`` goes back to the project's settings;
* callback waits: :class:`ResolveForm` (a JSON result), :class:`FailForm` (an error),
  :class:`ExtendForm` (a new timeout).
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

from django import forms
from django.core.exceptions import ValidationError

from awa_django import serialization
from awa_django.conf import awa_settings
from awa_django.exceptions import InvalidOptionError
from awa_django.jobs import registered_kinds
from awa_django.limits import (
    FLOW_BURST_RANGE,
    FLOW_CONCURRENCY_RANGE,
    MAX_SECONDS,
    MAX_TEXT,
    check_flow_limits,
    check_kind_name,
)

__all__ = [
    "ExtendForm",
    "FailForm",
    "FlowLimitsForm",
    "KindFlowLimitsForm",
    "LimitKindForm",
    "ResolveForm",
    "RetryForm",
    "RetryFromHistoryForm",
]

_LIMITS = ("global_concurrency", "rate_limit", "rate_burst")


class RetryForm(forms.Form):
    """Retry dead-lettered jobs: into another queue, with another priority (both optional)."""

    queue = forms.CharField(required=False, help_text="Retry into another queue (optional).")
    priority = forms.IntegerField(
        required=False,
        min_value=-100,
        max_value=100,
        help_text="Retry with another priority (optional).",
    )


class RetryFromHistoryForm(forms.Form):
    """Retry failed or cancelled jobs from history as new jobs: into another queue, with
    another priority (both optional)."""

    queue = forms.CharField(required=False, help_text="Retry into another queue (optional).")
    priority = forms.IntegerField(
        required=False,
        min_value=-100,
        max_value=100,
        help_text="Retry with another priority (optional).",
    )


class FlowLimitsForm(forms.Form):
    """The "Set flow limits" action's form: the limits that replace each selected queue's, or
    ``clear`` (the queue's ``AWA["QUEUES"]`` settings apply again). Checked like
    ``set_queue_limits`` checks them: a bad value is shown on the page and nothing changes."""

    #: Help texts by field, where the kind form words them for kinds.
    help_texts: ClassVar[dict[str, str]] = {}

    global_concurrency = forms.IntegerField(
        required=False,
        min_value=FLOW_CONCURRENCY_RANGE[0],
        max_value=FLOW_CONCURRENCY_RANGE[1],
        help_text="The most attempts of the queue running at once across every worker "
        "(counted by job weight). Empty: no concurrency limit.",
    )
    rate_limit = forms.FloatField(
        required=False,
        help_text="The most jobs started per second across every worker (from 0.001 to "
        "1,000,000). Empty: no rate limit.",
    )
    rate_burst = forms.IntegerField(
        required=False,
        min_value=FLOW_BURST_RANGE[0],
        max_value=FLOW_BURST_RANGE[1],
        help_text="Jobs the rate lets through at once (with a rate; empty: a tenth of a "
        "second's worth).",
    )
    clear = forms.BooleanField(
        required=False,
        help_text="Drop the operator's limits instead: the queue's AWA['QUEUES'] settings "
        "apply again (the fields above are ignored).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, text in self.help_texts.items():
            if name in self.fields:
                self.fields[name].help_text = text

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        if data.get("clear"):  # the fields show the limits in force: clearing drops them all,
            for name in _LIMITS:  # whatever they hold
                self.errors.pop(name, None)
            return {**data, **dict.fromkeys(_LIMITS)}
        if self.errors:
            return data
        limits = [data.get(f) for f in _LIMITS]
        try:
            check_flow_limits(*limits)
        except InvalidOptionError as exc:
            raise ValidationError(str(exc)) from None
        return data


def limits_in_force(limits: list[Any]) -> dict[str, Any] | None:
    """The flow-limits form's initial values: the limits in force when every selected queue
    (or kind) has the same ones (``None`` in ``limits``: none), so that changing one field
    keeps the others; ``None`` when they differ."""
    seen = {
        (None, None, None) if x is None else (x.global_concurrency, x.rate_limit, x.rate_burst)
        for x in limits
    }
    if len(seen) != 1:
        return None
    values = dict(zip(_LIMITS, seen.pop(), strict=True))
    return {name: value for name, value in values.items() if value is not None}


class KindFlowLimitsForm(FlowLimitsForm):
    """The limits that replace each selected kind's, or ``clear`` (its ``@job`` options and
    ``AWA["KINDS"]`` apply again); checked like ``set_kind_limits`` checks them."""

    help_texts: ClassVar[dict[str, str]] = {
        "global_concurrency": "The most attempts of the kind running at once, in every queue "
        "and across every worker (counted by job weight). Empty: no concurrency limit.",
        "rate_limit": "The most jobs of the kind started per second across every worker (from "
        "0.001 to 1,000,000). Empty: no rate limit.",
        "clear": "Drop the operator's limits instead: the kind's @job options and "
        "AWA['KINDS'] apply again (the fields above are ignored).",
    }


class LimitKindForm(KindFlowLimitsForm):
    """The "limit a kind" page: a kind this project knows (registered by ``@job`` or named in
    ``AWA["KINDS"]``) and its limits."""

    field_order = ["kind", "global_concurrency", "rate_limit", "rate_burst"]
    kind = forms.CharField(
        max_length=255,
        strip=False,
        help_text="The job kind (registered by @job in this project, or named in AWA['KINDS']).",
    )
    clear = None  # type: ignore[assignment]

    def clean_kind(self) -> str:
        kind = self.cleaned_data["kind"]
        try:
            check_kind_name(kind)
        except InvalidOptionError as exc:
            raise ValidationError(str(exc)) from None
        if kind not in registered_kinds() and kind not in awa_settings.KINDS:
            raise ValidationError(
                f"Unknown job kind {kind!r}: not registered by @job in this project and not "
                "named in AWA['KINDS']."
            )
        return str(kind)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class ResolveForm(forms.Form):
    result = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60}),
        initial="null",
        help_text="The result, as JSON (null, a number, a string in quotes, an object...).",
    )

    def clean_result(self) -> str:
        text = str(self.cleaned_data["result"])
        try:
            value = json.loads(text, parse_constant=_no_constants)
            return serialization.dumps(
                value,
                "result",
                max_bytes=awa_settings.RESULT_MAX_BYTES,
                max_depth=awa_settings.JSON_MAX_DEPTH,
            )
        except (ValueError, RecursionError) as exc:  # JobValidationError is a ValueError
            raise forms.ValidationError(f"Not a result that can be stored: {exc}") from None


class FailForm(forms.Form):
    error = forms.CharField(
        max_length=MAX_TEXT, help_text="The error message recorded for the attempt."
    )
    terminal = forms.BooleanField(
        required=False, help_text="Fail the jobs at once instead of retrying them."
    )

    def clean_error(self) -> str:
        text = str(self.cleaned_data["error"])
        if "\x00" in text:
            raise forms.ValidationError("The message cannot hold a NUL character.")
        return text


class ExtendForm(forms.Form):
    seconds = forms.FloatField(
        min_value=1,
        max_value=MAX_SECONDS,
        initial=3600,
        help_text="The waits time out this many seconds from now (never earlier than before).",
    )

    def clean_seconds(self) -> float:
        value = float(self.cleaned_data["seconds"])
        if not math.isfinite(value):
            raise forms.ValidationError("Give a number of seconds.")
        return value
