"""Probes for the observability tests (docs/observability.md): a free port, a scrape of
``/metrics`` parsed with prometheus_client's text parser, a database server that accepts
connections and never answers (the ``hung_server`` fixture, loaded as a plugin by
tests/conftest.py), a Python child with the test settings.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.jobs import observability, worker_env
from tests.support.polling import wait_for
from tests.support.processes import REPO, ManagedProcess

__all__ = [
    "BAD_QUEUES",
    "FORGED",
    "HOSTILE_TEXT",
    "HOSTILE_TRACEPARENTS",
    "WEIRD_KINDS",
    "BadRepr",
    "circular",
    "deep",
    "free_port",
    "hung_server",
    "job_state",
    "observability_env",
    "record",
    "run_python",
    "scrape",
    "start_metrics_worker",
    "strict_json",
    "total",
    "try_scrape",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a /metrics page, parsed with prometheus_client's text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def total(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def try_scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
    try:
        return scrape(port)
    except OSError:
        return None


def job_state(job_id: int) -> tuple[str, bool] | None:
    from awa_django.operator import job_show

    detail = job_show(job_id)
    return None if detail is None else (str(detail.state), bool(detail.in_dlq))


def observability_env() -> dict[str, str]:
    return worker_env(observability)


@pytest.fixture
def hung_server() -> Iterator[str]:
    """A DATABASE_URL whose server accepts TCP connections and then never says a word (a
    frozen PostgreSQL, a half-open firewall, a SIGSTOPped pgbouncer)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/awa"
    finally:
        listener.close()


def run_python(
    code: str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str] | None:
    """Run ``code`` with tests.settings; None when it did not end within ``timeout``."""
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None


def start_metrics_worker(
    manage_py: Callable[..., ManagedProcess], queue: str, *extra: str
) -> tuple[ManagedProcess, int]:
    port = free_port()
    worker = manage_py(
        "awa_worker",
        "--queue",
        queue,
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        *extra,
        extra_env=observability_env(),
    )
    wait_for(lambda: try_scrape(port), timeout=30, message=worker.output)
    return worker, port


HOSTILE_TRACEPARENTS: list[Any] = [
    "00-" + "a" * 40000,
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\u200b",
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
    "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",
    "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future-fields",
    "",
    5,
    None,
    ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
    {"nested": {"deep": [1, 2, 3]}},
]


def record(msg: str = "m", **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("tests.atk", logging.INFO, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


def strict_json(line: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    line.encode("utf-8")  # what a StreamHandler on a UTF-8 file or stdout must write
    return json.loads(line, parse_constant=refuse)


def circular() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def deep() -> list[Any]:
    value: list[Any] = []
    for _ in range(50000):
        value = [value]
    return value


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr refuses")


BAD_QUEUES = {"QUEUES": {"BAD QUEUE": {"dlq": False}, "atk-good": {"dlq": False}}}


HOSTILE_TEXT = ["a\x00b", "x" * 100_000, "{a,b}", "'); DROP TABLE x; --", "%", "\\", "\u202e", ""]


FORGED = "1999-01-01 00:00:00,000 CRITICAL awa_django.worker: forged line"


WEIRD_KINDS = ['weird"kind{x}\\', "é\u2028kind", " lead", "atk.kind\n" + FORGED]
