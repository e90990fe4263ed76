"""How a flow rate reads on the admin's pages and in summaries: as people write it, and never an
exception, whatever the float."""

from __future__ import annotations

import pytest

from awa_django.limits import rate_text


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        (2.0, "2"),
        (0.5, "0.5"),
        (1_000_000.0, "1,000,000"),
        (123_456.5, "123,456.5"),
        (0.001, "0.001"),
        (float("inf"), "inf"),
        (float("nan"), "nan"),
    ],
)
def test_a_rate_reads_as_written(rate: float, text: str) -> None:
    assert rate_text(rate) == text
