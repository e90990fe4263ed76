"""The benchmark's named queries (``queries.sql``) and the ledger its handlers write."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

__all__ = ["LEDGER_URL_ENV", "ahandle", "arecord", "handle", "query", "record"]

LEDGER_URL_ENV = "BENCH_LEDGER_URL"
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _queries() -> dict[str, str]:
    text = (Path(__file__).with_name("queries.sql")).read_text()
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def query(name: str) -> str:
    """The text of query ``name``."""
    return _queries()[name]


def _connect_ledger() -> psycopg.Connection[Any]:
    conn = psycopg.connect(os.environ[LEDGER_URL_ENV], autocommit=True)
    # The ledger is measurement, not the system under test: keep its writes cheap.
    conn.execute("SET synchronous_commit = off")
    return conn


_local = threading.local()


def record(key: int, started: float) -> None:
    """Write one handler run to the ledger (sync handlers; one connection per thread).

    ``started`` is ``time.perf_counter()`` at handler entry: the row's start time is the
    database clock minus the elapsed time, so both ends of a latency are on one clock.
    """
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = _connect_ledger()
    conn.execute(query("done"), [key, time.perf_counter() - started])


_aconn: psycopg.AsyncConnection[Any] | None = None
_alock: asyncio.Lock | None = None


async def arecord(key: int, started: float) -> None:
    """Async ``record``: one connection per process, shared by the event loop's handlers."""
    global _aconn, _alock
    if _aconn is None:
        _alock = _alock or asyncio.Lock()
        async with _alock:
            if _aconn is None:
                conn = await psycopg.AsyncConnection.connect(
                    os.environ[LEDGER_URL_ENV], autocommit=True
                )
                await conn.execute("SET synchronous_commit = off")
                _aconn = conn
    await _aconn.execute(query("done"), [key, time.perf_counter() - started])


MODE = os.environ.get("BENCH_MODE", "noop")
WORK_SECONDS = float(os.environ.get("BENCH_WORK_MS", "0")) / 1000


async def ahandle(key: int) -> None:
    """The benchmark's async job body: nothing (``noop``) or a ledger row (``ledger``)."""
    if MODE == "noop":
        return
    started = time.perf_counter()
    if WORK_SECONDS:
        await asyncio.sleep(WORK_SECONDS)
    await arecord(key, started)


def handle(key: int) -> None:
    """The benchmark's sync job body (see :func:`ahandle`)."""
    if MODE == "noop":
        return
    started = time.perf_counter()
    if WORK_SECONDS:
        time.sleep(WORK_SECONDS)
    record(key, started)
