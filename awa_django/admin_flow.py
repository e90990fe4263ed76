"""The admin's "Set flow limits" forms (docs/flow.md): one for queues, one for job kinds. Both
check their values as ``set_queue_limits`` and ``set_kind_limits`` do, so a bad value is shown
on the page and nothing changes; ``clear`` goes back to the project's settings."""

from __future__ import annotations

from typing import Any, ClassVar

from django import forms
from django.core.exceptions import ValidationError

from awa_django.exceptions import InvalidOptionError
from awa_django.limits import FLOW_BURST_RANGE, FLOW_CONCURRENCY_RANGE, check_flow_limits

__all__ = ["FlowLimitsForm", "KindFlowLimitsForm"]

_LIMITS = ("global_concurrency", "rate_limit", "rate_burst")


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
        "apply again (leave the fields above empty).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, text in self.help_texts.items():
            if name in self.fields:
                self.fields[name].help_text = text

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        if self.errors:
            return data
        limits = [data.get(f) for f in _LIMITS]
        if data.get("clear"):
            if any(v is not None for v in limits):
                raise ValidationError("Clear takes no limits: leave the fields empty or untick it.")
            return data
        try:
            check_flow_limits(*limits)
        except InvalidOptionError as exc:
            raise ValidationError(str(exc)) from None
        return data


class KindFlowLimitsForm(FlowLimitsForm):
    """The limits that replace each selected kind's, or ``clear`` (its ``@job`` options and
    ``AWA["KINDS"]`` apply again); checked like ``set_kind_limits`` checks them."""

    help_texts: ClassVar[dict[str, str]] = {
        "global_concurrency": "The most attempts of the kind running at once, in every queue "
        "and across every worker (counted by job weight). Empty: no concurrency limit.",
        "rate_limit": "The most jobs of the kind started per second across every worker (from "
        "0.001 to 1,000,000). Empty: no rate limit.",
        "clear": "Drop the operator's limits instead: the kind's @job options and "
        "AWA['KINDS'] apply again (leave the fields above empty).",
    }
