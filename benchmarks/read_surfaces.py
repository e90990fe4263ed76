"""Every read surface over a large history: admin pages, commands, SQL surfaces, get_result.

    .venv/dj52/bin/python benchmarks/read_surfaces.py [--scale 1.0] [--rounds 5]
        [--reuse] [--stale-stats]
        [--timeout 60] [--output PATH] [--plans PATH] [--write-cost N [--only-write-cost]]

Seeds the engine's tables directly with set-based SQL (``read_surfaces.sql``): at scale 1,
10,000,000 rows of terminal history over the last 24 hours (one ready row and one done row per
job, in the queue-ring slot of its time) and 100,000 live jobs (60,000 available, 10,000
running with open claims, 500 of them waiting on a callback, 20,000 deferred, 10,000
dead-lettered), 210,000 closed claims in the claim ring, across five queues (one of them
0.01 % of the jobs) and eleven kinds (one of them 0.002 %). Then ANALYZE (or, with
``--stale-stats``, statistics taken while every table was empty and autovacuum off), and
times every surface: the median of ``--rounds`` runs (one run when the first takes over 2 s; a
statement over ``--timeout`` seconds counts as a timeout). Prints a table and writes JSON
(``--output``) and the EXPLAIN (ANALYZE, BUFFERS) plan of every SQL surface and of the slowest
statement of every page (``--plans``).

To compare two versions of the SQL, run it in a checkout of each (``git worktree add
../awa-before REF``) with the same arguments and compare the JSON (``--output``).
``benchmarks/write_cost.py --before REF`` compares the write path of a git ref with the working
tree's. ``--write-cost N`` also measures the write path here: the server CPU per job of
enqueueing N jobs, then claiming and finalizing them, with the history in place.
Without DATABASE_URL it runs its own PostgreSQL 18 (fsync off: this measures reads); with it,
it uses that database (which should be empty, or seeded by an earlier ``--reuse`` run).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from awa_django.sql import RING_SLOTS  # noqa: E402 (after the checkout is on sys.path)

SEED_SQL = Path(__file__).with_name("read_surfaces.sql")
#: Rows at scale 1.
SIZES = {
    "history": 10_000_000,
    "running": 10_000,
    "available": 60_000,
    "closed": 210_000,
    "deferred": 20_000,
    "dlq": 10_000,
}
HISTORY_CHUNK = 1_000_000
SLOW = 2.0  # seconds: a surface slower than this is run once


def __getattr__(name: str) -> Any:
    # The benchmark's ROOT_URLCONF is this module: the admin, built once Django is set up.
    if name == "urlpatterns":
        from django.contrib import admin
        from django.urls import path

        return [path("admin/", admin.site.urls)]
    raise AttributeError(name)


#: The queue ring's slot count (a new database's), and its current slot in the seed: the last.
QUEUE_SLOTS = RING_SLOTS["queue"]
SLOT_PARAMS = {"qslots": QUEUE_SLOTS, "qcur": QUEUE_SLOTS - 1}


def statements() -> dict[str, str]:
    import re

    # A partition's name is not a parameter: {qcur} in a statement is the current slot.
    text = SEED_SQL.read_text().replace("{qcur}", str(SLOT_PARAMS["qcur"]))
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


# Django ----------------------------------------------------------------------------------------


def setup_django(url: str) -> None:
    import django
    import environ
    from django.conf import settings

    database = environ.Env().db_url_config(url)
    settings.configure(
        SECRET_KEY="benchmarks-only",
        DEBUG=False,
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        DATABASES={"default": database},
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.admin",
            "django.contrib.sessions",
            "django.contrib.messages",
            "awa_django",
            *([] if _has_django_tasks() else ["django_tasks"]),
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        ROOT_URLCONF="benchmarks.read_surfaces",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        TASKS={"default": {"BACKEND": "awa_django.backends.tasks.AwaTaskBackend"}},
        AWA={},
    )
    django.setup()


def _has_django_tasks() -> bool:
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        return False
    return True


def migrate(target: str | None) -> None:
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    for app in ("contenttypes", "auth", "admin", "sessions"):
        call_command("migrate", app, verbosity=0)
    if (
        target is not None
        and MigrationRecorder(connection)
        .migration_qs.filter(app="awa_django", name__gt=target)
        .exists()
    ):
        # Reversing a RunAwaSQL migration only forgets it: the newer SQL would stay.
        raise SystemExit(f"this database is already migrated past {target}; use a fresh one")
    call_command("migrate", "awa_django", *([target] if target else []), verbosity=0)


def applied() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT max(name) FROM awa.schema_migrations")
        return str(cursor.fetchone()[0])


# Seed ------------------------------------------------------------------------------------------


def seeded(sizes: dict[str, int]) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('public.seed_params') IS NOT NULL")
        if not cursor.fetchone()[0]:
            return False
        cursor.execute("SELECT history, running, available FROM seed_params")
        row = cursor.fetchone()
    if row != (sizes["history"], sizes["running"], sizes["available"]):
        raise SystemExit(f"the database holds another seed {row}; use a fresh one")
    return True


def seed(sizes: dict[str, int], *, scale: float, stale_stats: bool) -> None:
    import psycopg
    from django.db import connection

    sql = statements()
    settings = connection.settings_dict
    conninfo = psycopg.conninfo.make_conninfo(
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None,
        port=str(settings["PORT"]) if settings["PORT"] else None,
    )
    params: dict[str, Any] = {**sizes, **SLOT_PARAMS, "scale": scale, "lo": 0, "hi": 0}
    started = time.perf_counter()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = psycopg.ClientCursor(conn)
        # Terminal rows name their kind where awa.done_entries.kind is NOT NULL; in older
        # schemas only the wide ones did, and a migration filled in the others.
        params["done_kinds"] = conn.execute(
            "SELECT attnotnull FROM pg_attribute "
            "WHERE attrelid = 'awa.done_entries'::regclass AND attname = 'kind'"
        ).fetchone()[0]  # type: ignore[index]

        def run(name: str, **extra: Any) -> None:
            t0 = time.perf_counter()
            cur.execute(sql[name], {**params, **extra})
            print(f"  seed {name} {extra or ''}: {time.perf_counter() - t0:.1f} s", flush=True)

        run("drop_seed_helpers")
        if stale_stats:
            # Statistics of empty tables, and nobody to refresh them: the planner sees every
            # ring partition as it was before any job ran.
            run("analyze")
            run("autovacuum_off")
        run("seed_params")
        run("seed_lanes")
        run("seed_meta")
        run("seed_map")
        run("seed_functions")
        for lo in range(0, sizes["history"], HISTORY_CHUNK):
            hi = min(lo + HISTORY_CHUNK, sizes["history"])
            run("seed_history_ready", lo=lo, hi=hi)
            run("seed_history_done", lo=lo, hi=hi)
            run("seed_history_counts", lo=lo, hi=hi)
        for name in (
            "seed_closed_claims",
            "seed_markers",
            "seed_live_ready",
            "seed_running",
            "seed_cancelled_available",
            "seed_deferred",
            "seed_dlq",
            "seed_rings",
            "seed_runtimes",
            "seed_sequences",
        ):
            run(name)
        cur.execute("CHECKPOINT")
    print(f"  seeded in {time.perf_counter() - started:.0f} s", flush=True)


def analyze(stale_stats: bool) -> None:
    from django.db import connection

    if stale_stats:
        return
    with connection.cursor() as cursor:
        cursor.execute(statements()["analyze"])


def superuser() -> Any:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first()
    return user or user_model.objects.create_superuser("bench", "bench@example.com", "bench")


# Surfaces --------------------------------------------------------------------------------------


@dataclass
class Surface:
    name: str
    kind: str  # sql, page, command, call
    run: Callable[[], Any]
    sql: tuple[str, list[Any]] | None = None


@dataclass
class Result:
    name: str
    kind: str
    seconds: list[float] = field(default_factory=list)
    error: str | None = None
    slowest_sql: str | None = None
    slowest_ms: float | None = None
    plan: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None


def sample_ids() -> dict[str, int]:
    """Ids of one job per place, from the seed's arithmetic (see read_surfaces.sql)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT history, running, available, deferred, dlq FROM seed_params")
        history, running, available, deferred, dlq = cursor.fetchone()
    base = history - 1000  # recent history; i % 100 picks the outcome, i % 500 = 250 is wide
    return {
        "completed": base + 10 + 1,
        "failed": base + 1 + 1,
        "cancelled": base + 5 + 1,
        "wide": base + 250 + 1,
        "old_completed": 1000 + 10 + 1,
        "running": history + 100 + 1,
        "waiting": history + 107 + 1,
        "available": (history + running + available // 2) // 100 * 100 + 1,
        "scheduled": history + running + available + 1,
        "retryable": history + running + available + 3 + 1,
        "dlq": history + running + available + deferred + 1,
        "unknown": history + running + available + deferred + dlq + 1000,
    }


def surfaces(ids: dict[str, int]) -> list[Surface]:
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from awa_django.backends.compat import TaskResultDoesNotExist
    from awa_django.sql import query

    client = Client()
    client.force_login(superuser())
    out: list[Surface] = []

    def sql(name: str, text: str, params: list[Any] | None = None) -> None:
        def run() -> Any:
            with connection.cursor() as cursor:
                cursor.execute(text, params or [])
                return cursor.fetchall()

        out.append(Surface(name, "sql", run, (text, params or [])))

    def page(name: str, url: str) -> None:
        def run() -> Any:
            response = client.get(url, follow=True)  # the find box redirects
            if response.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {response.status_code}")
            return response

        out.append(Surface(name, "page", run))

    def command(name: str, *args: str) -> None:
        def run() -> Any:
            call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())

        out.append(Surface(name, "command", run))

    # SQL surfaces, as the operator API, the worker and SQL users call them.
    sql("queue_counts_v1()", query("queue_counts"))
    sql("queue_stats_v1()", query("queue_stats"))
    sql("queue_stats view", "SELECT * FROM awa.queue_stats ORDER BY queue")
    sql("queue_depth_v1()", query("queue_depth"), [None])
    sql("throughput_v1(NULL)", query("throughput"), [None])
    sql("outcomes_per_minute_v1('emails')", query("outcomes_per_minute"), ["emails"])
    sql("throughput_v1('emails')", query("throughput"), ["emails"])
    sql("ring_state", query("rings"))
    sql("ring_slots_v1()", "SELECT * FROM awa.ring_slots_v1()")
    sql("workers", query("workers"))
    sql(
        "queues_idle_v2(all)",
        query("queues_idle"),
        [["default", "emails", "reports", "webhooks", "rare"]],
    )
    sql("dlq_list", query("dlq_list"), {"queue": None, "kind": None, "limit": 100})  # type: ignore[arg-type]
    live = "SELECT * FROM awa.live_jobs"
    sql("live_jobs newest 50", f"{live} ORDER BY id DESC LIMIT 50")
    for state in ("available", "running", "waiting_external", "scheduled", "retryable"):
        sql(
            f"live_jobs {state} newest 50",
            f"{live} WHERE state = %s ORDER BY id DESC LIMIT 50",
            [state],
        )
        sql(
            f"live_jobs {state} count",
            "SELECT count(*) FROM (SELECT id FROM awa.live_jobs WHERE state = %s LIMIT 10001) x",
            [state],
        )
    sql("live_jobs queue=emails count", "SELECT count(*) FROM awa.live_jobs WHERE queue = 'emails'")
    sql("live_jobs all count", "SELECT count(*) FROM awa.live_jobs")
    for what in ("running", "available", "scheduled", "completed"):
        sql(f"live_jobs id={what}", f"{live} WHERE id = %s", [ids[what]])
    terminal = "SELECT * FROM awa.terminal_jobs"
    order = "ORDER BY finalized_at DESC, id DESC LIMIT 50"
    sql("terminal_jobs newest 50", f"{terminal} {order}")
    for column, value in (
        ("state", "failed"),
        ("state", "cancelled"),
        ("queue", "rare"),
        ("kind", "app.sync.pull_crm"),
        ("kind", "app.rare.kind"),
    ):
        sql(
            f"terminal_jobs {column}={value} newest 50",
            f"{terminal} WHERE {column} = %s {order}",
            [value],
        )
        sql(
            f"terminal_jobs {column}={value} count",
            "SELECT count(*) FROM (SELECT id FROM awa.terminal_jobs "
            f"WHERE {column} = %s LIMIT 10001) x",
            [value],
        )
    for what in ("completed", "wide", "running"):
        sql(f"terminal_jobs id={what}", f"{terminal} WHERE id = %s", [ids[what]])
    for what in (
        "completed",
        "old_completed",
        "running",
        "available",
        "scheduled",
        "dlq",
        "unknown",
    ):
        sql(f"get_result SQL id={what}", query("task_row"), [ids[what]])
        sql(f"job_show id={what}", query("job_show"), [ids[what]])

    # get_result through the django.tasks backend.
    import importlib

    try:
        tasks: Any = importlib.import_module("django.tasks")
    except ImportError:
        tasks = importlib.import_module("django_tasks")
    backend = tasks.task_backends["default"]
    for what in ("completed", "running", "available", "scheduled", "dlq", "unknown"):

        def get(job_id: int = ids[what]) -> None:
            with suppress(TaskResultDoesNotExist):
                backend.get_result(str(job_id))

        out.append(Surface(f"get_result({what})", "call", get))

    # Admin pages.
    admin = "/admin/awa_django"
    page("admin: queue list", f"{admin}/queuestat/")
    page("admin: dashboard", f"{admin}/queuestat/dashboard/")
    page("admin: jobs", f"{admin}/livejob/")
    for state in ("available", "running", "waiting_external", "scheduled", "retryable"):
        page(f"admin: jobs state={state}", f"{admin}/livejob/?state={state}")
    page("admin: jobs queue=emails", f"{admin}/livejob/?queue=emails")
    page("admin: jobs kind=app.rare.kind", f"{admin}/livejob/?kind=app.rare.kind")
    page("admin: jobs search 'billing'", f"{admin}/livejob/?q=billing")
    page("admin: jobs search id", f"{admin}/livejob/?q={ids['running']}")
    for what in ("running", "waiting", "available", "scheduled"):
        page(f"admin: job {what}", f"{admin}/livejob/{ids[what]}/change/")
    page("admin: terminal jobs", f"{admin}/terminaljob/")
    for state in ("completed", "failed", "cancelled"):
        page(f"admin: terminal state={state}", f"{admin}/terminaljob/?state={state}")
    for queue in ("default", "emails", "rare"):
        page(f"admin: terminal queue={queue}", f"{admin}/terminaljob/?queue={queue}")
    for kind in ("app.emails.send_welcome", "app.sync.pull_crm", "app.rare.kind"):
        page(f"admin: terminal kind={kind}", f"{admin}/terminaljob/?kind={kind}")
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    day = urlencode(
        {
            "finalized_at__gte": midnight.isoformat(),
            "finalized_at__lt": (midnight + timedelta(days=1)).isoformat(),
        }
    )
    page("admin: terminal finished today", f"{admin}/terminaljob/?{day}")
    page(
        "admin: terminal failed in emails",
        f"{admin}/terminaljob/?state=failed&queue=emails",
    )
    page(
        "admin: terminal failed app.rare.kind",
        f"{admin}/terminaljob/?state=failed&kind=app.rare.kind",
    )
    page(
        "admin: terminal rare queue app.emails.send_digest",
        f"{admin}/terminaljob/?queue=rare&kind=app.emails.send_digest",
    )
    page("admin: terminal search 'billing'", f"{admin}/terminaljob/?q=billing")
    page(
        "admin: terminal search kind app.rare.kind",
        f"{admin}/terminaljob/?q=app.rare.kind",
    )
    page("admin: terminal search 'nothing-matches'", f"{admin}/terminaljob/?q=nothing-matches")
    page("admin: terminal search id", f"{admin}/terminaljob/?q={ids['completed']}")
    for what in ("completed", "wide", "old_completed"):
        page(f"admin: terminal job {what}", f"{admin}/terminaljob/{ids[what]}/change/")
    page("admin: DLQ", f"{admin}/deadletter/")
    page("admin: DLQ queue=emails", f"{admin}/deadletter/?queue=emails")
    page("admin: DLQ kind=app.sync.pull_crm", f"{admin}/deadletter/?kind=app.sync.pull_crm")
    page("admin: DLQ job", f"{admin}/deadletter/{ids['dlq']}/change/")
    page("admin: workers", f"{admin}/worker/")
    page("admin: find a job (history)", f"{admin}/livejob/find/?id={ids['completed']}")
    page("admin: jobs page 150", f"{admin}/livejob/?p=150")
    page("admin: terminal page 500", f"{admin}/terminaljob/?p=500")

    command("awa_status", "awa_status")
    command("awa_status --json", "awa_status", "--json")
    command("awa_queue stats emails", "awa_queue", "stats", "emails")
    command("awa_job show (completed)", "awa_job", "show", str(ids["completed"]))
    command("awa_job show (running)", "awa_job", "show", str(ids["running"]))
    command("awa_dlq list", "awa_dlq", "list")
    return out


@contextmanager
def statement_timeout(seconds: float) -> Iterator[None]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('statement_timeout', %s, false)", [f"{int(seconds * 1000)}"]
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 0")


def measure(surface: Surface, rounds: int, timeout: float, plans: bool) -> Result:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    result = Result(surface.name, surface.kind)
    with statement_timeout(timeout):
        for _ in range(rounds):
            t0 = time.perf_counter()
            try:
                surface.run()
            except Exception as exc:  # a timeout or a failure: recorded, not fatal
                result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                connection.close()  # leave no aborted transaction behind
                return result
            result.seconds.append(time.perf_counter() - t0)
            if result.seconds[-1] > SLOW:
                break
        if not plans:
            return result
        try:
            if surface.sql is not None:
                result.plan = explain(*surface.sql)
            elif surface.kind == "page" and result.seconds:
                with CaptureQueriesContext(connection) as captured:
                    surface.run()
                slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
                result.slowest_sql = slowest["sql"]
                result.slowest_ms = float(slowest["time"]) * 1000
                if slowest["sql"].lstrip().upper().startswith("SELECT"):
                    result.plan = explain(slowest["sql"], None)
        except Exception as exc:
            result.plan = f"(no plan: {type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
            connection.close()
    return result


def explain(text: str, params: Any) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        if params is None:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + text)
        else:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def run_all(args: argparse.Namespace, label: str) -> list[Result]:
    ids = sample_ids()
    results = []
    print(f"\n== {label}: migrated to {applied()} ==", flush=True)
    for surface in surfaces(ids):
        result = measure(surface, args.rounds, args.timeout, plans=not args.no_plans)
        results.append(result)
        shown = (
            result.error
            if result.error
            else f"{result.median * 1000:9.1f} ms (n={len(result.seconds)})"  # type: ignore[operator]
        )
        print(f"  {surface.kind:7} {surface.name:48} {shown}", flush=True)
    return results


def write_cost(jobs: int, rounds: int) -> dict[str, float]:
    """Server CPU per job of the write path with the indexes in place: enqueue (awa.enqueue_v1,
    500 per call), then claim (awa.claim_v3, 256 per call) and finalize (awa.finalize_v2, all
    completed), on a queue of its own. CPU of the backend from /proc (so another process's load
    on this machine does not count); wall time when /proc cannot be read. Median of rounds."""
    import psycopg
    from django.db import connection

    from awa_django.db import storage
    from awa_django.db.storage import Finalization

    settings = connection.settings_dict
    conninfo = psycopg.conninfo.make_conninfo(
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None,
        port=str(settings["PORT"]) if settings["PORT"] else None,
    )
    results: dict[str, list[float]] = {"enqueue_us": [], "claim_finalize_us": []}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET default_transaction_isolation = 'read committed'")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]

        def clock() -> float:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().split()
                return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
            except OSError:
                return time.perf_counter()

        batch = json.dumps([{"kind": "bench.write", "queue": "writecost"}] * 500)
        for _ in range(rounds):
            t0 = clock()
            for _ in range(jobs // 500):
                conn.execute("SELECT count(*) FROM awa.enqueue_v1(%s::jsonb)", [batch])
            results["enqueue_us"].append((clock() - t0) / jobs * 1e6)
            t0 = clock()
            while claimed := storage.claim(conn, "writecost", 256):
                storage.finalize(
                    conn,
                    [
                        Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")
                        for c in claimed
                    ],
                )
            results["claim_finalize_us"].append((clock() - t0) / jobs * 1e6)
        # Leave the claim ring as the seed made it: the read surfaces scan it.
        cur = psycopg.ClientCursor(conn)
        cur.execute(statements()["write_cost_cleanup"], SLOT_PARAMS)
        cur.execute(statements()["write_cost_vacuum"])
    return {k: statistics.median(v) for k, v in results.items()}


def report(runs: dict[str, list[Result]], output: Path | None, plans: Path | None) -> None:
    labels = list(runs)
    names = [r.name for r in runs[labels[-1]]]
    by = {label: {r.name: r for r in results} for label, results in runs.items()}

    def cell(r: Result | None) -> str:
        if r is None:
            return "-"
        if r.error:
            return "timeout" if "timeout" in r.error or "cancel" in r.error else "error"
        return f"{r.median * 1000:.1f}"  # type: ignore[operator]

    print("\n| surface | " + " | ".join(f"{label} (ms)" for label in labels) + " |")
    print("| --- | " + " | ".join("---:" for _ in labels) + " |")
    for name in names:
        print(f"| {name} | " + " | ".join(cell(by[label].get(name)) for label in labels) + " |")
    if output:
        output.write_text(
            json.dumps(
                {
                    label: [
                        {
                            "name": r.name,
                            "kind": r.kind,
                            "median_ms": None if r.median is None else r.median * 1000,
                            "runs_ms": [s * 1000 for s in r.seconds],
                            "error": r.error,
                            "slowest_sql_ms": r.slowest_ms,
                        }
                        for r in results
                    ]
                    for label, results in runs.items()
                },
                indent=2,
            )
        )
    if plans:
        with plans.open("w") as f:
            for label, results in runs.items():
                for r in results:
                    if r.plan or r.slowest_sql:
                        f.write(f"===== [{label}] {r.kind}: {r.name}\n")
                        if r.slowest_sql:
                            f.write(
                                f"-- slowest statement ({r.slowest_ms:.1f} ms):\n{r.slowest_sql}\n"
                            )
                        f.write(f"{r.plan or ''}\n\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="1.0: 10M history, 100k live")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="keep an existing seed")
    parser.add_argument("--stale-stats", action="store_true", help="statistics of empty tables")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per statement")
    parser.add_argument("--no-plans", action="store_true")
    parser.add_argument(
        "--write-cost",
        type=int,
        default=0,
        metavar="N",
        help="also measure the write path's server CPU per job over N jobs",
    )
    parser.add_argument("--only-write-cost", action="store_true", help="skip the read surfaces")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--plans", type=Path)
    args = parser.parse_args()
    sizes = {k: max(int(v * args.scale), 1) for k, v in SIZES.items()}
    sizes["closed"] = min(sizes["closed"], sizes["history"] // 16)

    import pgserver  # type: ignore[import-not-found,unused-ignore]

    url, stop = pgserver.start(
        ROOT / ".pgdata" / "bench-read-surfaces",
        database="awa_bench",
        ephemeral=True,
        fsync=False,
        settings={"shared_buffers": "1GB", "max_wal_size": "16GB", "checkpoint_timeout": "30min"},
    )
    try:
        setup_django(url)
        runs: dict[str, list[Result]] = {}
        migrate(None)
        if not (args.reuse and seeded(sizes)):
            print(f"seeding {sizes}", flush=True)
            seed(sizes, scale=args.scale, stale_stats=args.stale_stats)
        analyze(args.stale_stats)
        costs: dict[str, dict[str, float]] = {}
        for phase in [applied()]:
            if args.write_cost:
                costs[phase] = write_cost(args.write_cost, 3)
                print(f"write path, server CPU per job: {costs[phase]}", flush=True)
            if not args.only_write_cost:
                runs[phase] = run_all(args, "measure")
        if runs:
            report(runs, args.output, args.plans)
        if costs:
            print(json.dumps(costs, indent=2))
    finally:
        stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
