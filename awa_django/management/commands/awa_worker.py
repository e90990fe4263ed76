"""``manage.py awa_worker``: run workers (thin: parse options, call the runtime)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.utils import autoreload

from awa_django.conf import get_awa_settings
from awa_django.db.schema_guard import schema_problem
from awa_django.jobs import autodiscover_jobs
from awa_django.management.commands._cli import configure_logging, integer
from awa_django.sql import schema
from awa_django.worker.config import (
    MAX_PROCESSES,
    MAX_SLOTS,
    WorkerConfig,
    build_config,
    parse_queue_option,
)
from awa_django.worker.guards import EXIT_LOOP_FAILED, hard_exit
from awa_django.worker.runtime import WorkerRuntime
from awa_django.worker.supervisor import Supervisor, child_command, die_with_parent, launcher

log = logging.getLogger("awa_django.worker")

#: The autoreloader restarts a child that exits with this status.
_EXIT_RELOAD = 3


def _queue_option(value: str) -> str:
    try:
        parse_queue_option(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--queue {value!r}: ")) from None
    return value


class Command(BaseCommand):
    help = (
        "Run awa_django workers: claim jobs, run them, write their outcomes. Without --queue, "
        "serve every queue that exists, including queues that appear while it runs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            type=_queue_option,
            metavar="NAME[=N]",
            help=(
                "Serve only this queue (repeatable), running at most N of its jobs at once. "
                "Default: every queue, found in the database as it appears."
            ),
        )
        parser.add_argument(
            "--concurrency",
            type=integer("the concurrency", 1, MAX_SLOTS),
            default=None,
            metavar="N",
            help=(
                "Jobs one process runs at once, across all its queues (default "
                "AWA['CONCURRENCY'], or the sum of the --queue numbers when that is larger)."
            ),
        )
        parser.add_argument(
            "--processes",
            type=integer("the number of processes", 1, MAX_PROCESSES),
            default=None,
            metavar="N",
            help="Worker processes under one supervisor (default AWA['PROCESSES']).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit 0 once the queues have nothing available or running.",
        )
        parser.add_argument(
            "--no-maintenance",
            action="store_true",
            help="Do not take part in the maintenance leader election.",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help=(
                "Development: restart the worker when Python code changes (Django's "
                "autoreloader, like runserver); one process only."
            ),
        )
        parser.add_argument(
            "--metrics-port",
            type=integer("the metrics port", 1, 65535),
            default=None,
            metavar="PORT",
            help=(
                "Serve this worker's OpenTelemetry metrics for Prometheus on PORT (/metrics; "
                "with --processes N, ports PORT to PORT+N-1). Needs awa-django[otel]."
            ),
        )
        parser.add_argument(
            "--metrics-host",
            default="0.0.0.0",
            metavar="ADDRESS",
            help="The address --metrics-port listens on (default 0.0.0.0).",
        )
        # One process of a --processes N fleet, started by the supervisor.
        parser.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        cfg = get_awa_settings()
        processes = options["processes"] if options["processes"] is not None else cfg.PROCESSES
        queues = [parse_queue_option(value) for value in options["queue"]]
        if options["reload"] and processes > 1:
            given = (
                f"--processes {processes}"
                if options["processes"] is not None
                else f"AWA['PROCESSES'] = {processes}"
            )
            raise CommandError(
                f"--reload runs one worker process; it cannot be combined with {given}",
                returncode=2,  # a usage error, like argparse's
            )
        port = options["metrics_port"]
        if port is not None and port + processes - 1 > 65535:
            raise CommandError(
                f"--metrics-port {port} with {processes} processes needs ports {port} to "
                f"{port + processes - 1}; the highest port is 65535",
                returncode=2,
            )
        configure_logging(options["verbosity"], self.stderr, self.style)
        try:  # contradictions between options, before any process starts
            build_config(queues=queues or None, concurrency=options["concurrency"])
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        _require_queue_schema(cfg.DATABASE_ALIAS)
        if processes > 1 and not options["supervised"]:
            self._supervise(processes, options)
            return
        if options["reload"]:
            self._reloading(processes, queues, options)
            return
        autodiscover_jobs()
        config = self._config(processes, queues, options)
        if options["metrics_port"] is not None:
            self._serve_metrics(options["metrics_port"], options["metrics_host"])
        try:
            code = asyncio.run(WorkerRuntime(config).run())
        except BaseException as exc:
            _loop_ended(exc)
        if code:
            sys.exit(code)

    @staticmethod
    def _config(
        processes: int, queues: list[tuple[str, int | None]], options: dict[str, Any]
    ) -> WorkerConfig:
        return build_config(
            queues=queues or None,
            concurrency=options["concurrency"],
            processes=processes,
            burst=options["burst"],
            maintenance=not options["no_maintenance"],
        )

    @staticmethod
    def _serve_metrics(port: int, host: str) -> None:
        from awa_django.telemetry.prometheus import serve, slot_port

        port = slot_port(port)
        try:
            serve(port, host)
        except (ImportError, OSError, OverflowError) as exc:
            raise CommandError(f"--metrics-port: {exc}") from exc
        log.info("awa worker: metrics for Prometheus on http://%s:%d/metrics", host, port)

    def _supervise(self, processes: int, options: dict[str, Any]) -> None:
        """Run ``processes`` children, each this command with the same options."""
        from_command_line = getattr(self, "_called_from_command_line", False)
        launch = launcher("awa_worker", from_command_line=from_command_line)
        env: dict[str, str] = {}
        if launch[1:] == ["-m", "django"]:
            if not os.environ.get("DJANGO_SETTINGS_MODULE"):
                raise CommandError(
                    "--processes needs DJANGO_SETTINGS_MODULE in the environment to start its "
                    "children (python -m django awa_worker ...)"
                )
            if sys.path and sys.path[0]:
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (sys.path[0], os.environ.get("PYTHONPATH")) if p
                )
        code = Supervisor(
            child_command(launch, "awa_worker", _forwarded(options, processes)),
            processes,
            burst=options["burst"],
            stop_timeout=2 * get_awa_settings().SHUTDOWN_TIMEOUT + 15.0,
            env=env,
        ).run()
        if code:
            sys.exit(code)

    def _reloading(
        self, processes: int, queues: list[tuple[str, int | None]], options: dict[str, Any]
    ) -> None:
        """``--reload``: Django's autoreloader runs the worker in a child process and restarts
        it when code changes. The child drains (as on SIGTERM) before it restarts; Ctrl-C
        drains it too, and a second Ctrl-C stops it at once."""
        if os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) != "true":
            # The watching parent: Ctrl-C reaches the child too (same process group), which
            # drains and exits; the parent then exits with the child's status.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            sys.exit(_watch_and_restart())
        signal.signal(signal.SIGINT, signal.default_int_handler)
        die_with_parent()
        reloading = _Reloading()
        autoreload.autoreload_started.connect(reloading.take_signals, weak=False)
        autoreload.file_changed.connect(reloading.file_changed, weak=False)

        def serve() -> None:
            autodiscover_jobs()
            if options["metrics_port"] is not None:
                self._serve_metrics(options["metrics_port"], options["metrics_host"])
            runtime = WorkerRuntime(self._config(processes, queues, options), handle_signals=False)
            reloading.runtime = runtime
            try:
                code = asyncio.run(runtime.run())
            except BaseException as exc:
                _loop_ended(exc)
            hard_exit(_EXIT_RELOAD if reloading.reload else code)

        autoreload.run_with_reloader(serve)


def _watch_and_restart() -> int:
    """The watching parent of ``--reload``: runs the worker child under Django's autoreloader
    (which restarts it at once when it exits with status 3). A child that fails (a syntax
    error in a module it imports, say; Django only guards ``runserver``'s start-up that way) is
    started again once a Python file this process loaded changes, instead of ending the
    watch. Returns the status of a child that stopped (0 after a drain, 128+n after a second
    signal)."""
    # The job modules are imported here too, so that their files are watched; one that fails
    # to import now is watched by the path its error names.
    extra: set[Path] = set()
    try:
        autodiscover_jobs()
    except Exception as exc:
        extra.update(_error_files(exc))
    while True:
        # Taken before the child starts: a file saved while the failed child was still starting
        # (or in the instant before the wait began) restarts it at once instead of being missed.
        # At worst one futile restart follows an edit made during a long run.
        before = _stamps(extra)
        code = autoreload.restart_with_reloader()
        if code == 0 or code < 0 or code >= 128:
            return code
        log.error(
            "awa worker: the worker exited with status %s; fix the code, it restarts when a "
            "Python file changes",
            code,
        )
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            _wait_for_a_change(extra, before)
        except KeyboardInterrupt:
            return 130
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _error_files(exc: BaseException) -> set[Path]:
    """The source files an import error points at (a SyntaxError's file, the traceback's)."""
    files = {Path(exc.filename)} if isinstance(exc, SyntaxError) and exc.filename else set()
    tb = exc.__traceback__
    while tb is not None:
        files.add(Path(tb.tb_frame.f_code.co_filename))
        tb = tb.tb_next
    return {f for f in files if f.suffix == ".py"}


def _stamps(extra: set[Path]) -> dict[str, float | None]:
    """The modification time of every Python module file this process loaded and of
    ``extra`` (None for a file that is gone)."""
    found: dict[str, float | None] = {}
    for path in {*autoreload.iter_all_python_module_files(), *extra}:
        try:
            found[str(path)] = path.stat().st_mtime
        except OSError:
            found[str(path)] = None
    return found


def _wait_for_a_change(
    extra: set[Path], before: dict[str, float | None], interval: float = 1.0
) -> None:
    """Returns once a Python module file this process loaded, or one of ``extra``, differs
    from ``before`` (changed, appeared or gone)."""
    while _stamps(extra) == before:
        time.sleep(interval)


class _Reloading:
    """The worker side of ``--reload``: the runtime runs on Django's main thread, the
    autoreloader on the process's main thread, which forwards signals to the runtime."""

    def __init__(self) -> None:
        self.runtime: WorkerRuntime | None = None
        self.reload = False

    def take_signals(self, sender: object, **kwargs: object) -> None:
        """``autoreload_started`` (on the main thread): drain on SIGTERM/SIGINT instead of the
        autoreloader's immediate exit."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object = None) -> None:
        if self.runtime is None:
            hard_exit(0)  # not serving yet: nothing to drain
        else:
            self.runtime.signal_received(signum)

    def file_changed(self, sender: object, file_path: object, **kwargs: object) -> bool:
        """``file_changed``: drain, then exit with status 3 so that the autoreloader starts a
        fresh worker. Before the worker runs, the autoreloader restarts at once."""
        runtime = self.runtime
        if runtime is None:
            return False
        if not self.reload:
            self.reload = True
            log.info("awa worker: %s changed; draining, then restarting", file_path)
            runtime.request_stop()
        return True


def _forwarded(options: dict[str, Any], processes: int) -> list[str]:
    """The options a supervised child gets: the parent's own (``--processes`` included)."""
    args: list[str] = []
    for value in options["queue"]:
        args += ["--queue", value]
    if options["concurrency"] is not None:
        args += ["--concurrency", str(options["concurrency"])]
    for flag in ("burst", "no_maintenance", "traceback", "no_color", "force_color", "skip_checks"):
        if options.get(flag):
            args.append("--" + flag.replace("_", "-"))
    if options.get("metrics_port") is not None:
        args += ["--metrics-port", str(options["metrics_port"])]
        args += ["--metrics-host", str(options["metrics_host"])]
    for name in ("settings", "pythonpath"):
        if options.get(name):
            args += [f"--{name}", str(options[name])]
    args += ["--verbosity", str(options["verbosity"]), "--processes", str(processes)]
    return args


def _require_queue_schema(alias: str) -> None:
    """Refuse to start when the database answers and ``AWA["SCHEMA"]`` holds no queue (not
    migrated, or the setting changed after ``migrate``) or another project's: a restart would
    not help. A database that does not answer is left to the worker, which waits for it."""
    try:
        with connections[alias].cursor() as cursor:
            problem = schema_problem(cursor, schema())
    except DatabaseError:
        return
    finally:
        connections[alias].close()
    if problem is not None:
        raise CommandError(
            f"AWA['SCHEMA'] is {schema()!r}, and on the database of {alias!r} {problem}: run "
            f"`manage.py check --database {alias}`, which says what to do (docs/schema.md)"
        )


def _loop_ended(exc: BaseException) -> NoReturn:
    # Handler code can end the shared event loop (loop.stop(), SystemExit raised from a loop
    # callback, cancelling the worker's own tasks): never a silent exit.
    log.critical(
        "awa worker: the event loop ended abnormally (%s: %s); exiting with status %d so that "
        "the process is restarted; its attempts will be rescued",
        type(exc).__name__,
        exc,
        EXIT_LOOP_FAILED,
        exc_info=exc,
    )
    hard_exit(EXIT_LOOP_FAILED)
