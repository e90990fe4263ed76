"""``manage.py awa_worker`` follows Django's conventions for commands: ``--verbosity`` sets the
package logger's level, logs go through the command's stderr, ``--reload`` restarts on code
changes (Django's autoreloader), and ``--processes N`` reaches every child of the supervisor.

Workers are real subprocesses; tests wait on database state or output with a timeout.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import textwrap
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from awa_django.worker.supervisor import child_command, launcher
from tests.jobs import DEFAULT_MODULES, worker_env
from tests.jobs import common as testjobs
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import enqueue_sql
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

clean_awa = pytest.mark.usefixtures("clean_awa")

Start = Callable[..., ManagedProcess]


def rows() -> list[tuple[Any, ...]]:
    with pg() as conn:
        return conn.execute(
            "SELECT instance_id, pid, concurrency FROM awa.runtime_instances ORDER BY pid"
        ).fetchall()


def stopped(proc: ManagedProcess, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    proc.send_signal(sig)
    return proc.wait(timeout)


# --verbosity -----------------------------------------------------------------------------------


@clean_awa
@pytest.mark.worker
@pytest.mark.parametrize(
    ("verbosity", "present", "absent"),
    [
        ("0", [], ["INFO", "WARNING", "DEBUG"]),
        (
            "1",
            [
                "INFO awa_django.worker: awa worker",
                "WARNING awa_django.worker: job",
                "INFO tests.obs: sync handler says 7",  # a handler's own INFO line
            ],
            ["DEBUG"],
        ),
        ("2", ["DEBUG awa_django.worker: job", "INFO"], ["DEBUG asyncio"]),
        ("3", ["DEBUG awa_django.worker: job", "DEBUG asyncio"], []),
    ],
)
def test_verbosity_sets_the_level_of_the_package_logger(
    manage_py: Start, verbosity: str, present: list[str], absent: list[str]
) -> None:
    from tests.jobs import observability as obsjobs

    ok = testjobs.ledger_sync.enqueue(1).id
    failed = testjobs.terminal.enqueue().id  # logged at WARNING
    obsjobs.says.using(queue="work").enqueue(7)
    proc = manage_py(
        "awa_worker",
        "--burst",
        "--queue",
        "work",
        "--verbosity",
        verbosity,
        extra_env=worker_env(obsjobs),
    )
    assert proc.wait(60) == 0, proc.output()
    assert "moved to the DLQ after 1 attempt (it ran" in proc.output() or verbosity == "0"
    with pg() as conn:
        assert [job_state(conn, i)["state"] for i in (ok, failed)] == ["completed", "failed"]  # type: ignore[index]
    output = proc.output()
    for text in present:
        assert text in output, f"{text!r} missing at --verbosity {verbosity}:\n{output}"
    for text in absent:
        assert text not in output, f"{text!r} present at --verbosity {verbosity}:\n{output}"


@pytest.mark.parametrize(("verbosity", "most"), [("0", 0), ("1", 1)])
def test_djangos_own_log_lines_follow_verbosity_and_never_print_twice(
    manage_py: Start, verbosity: str, most: int
) -> None:
    # With DEBUG on, Django's default logging writes the "django" loggers (django.tasks logs
    # every task's state at INFO on Django 6) through a console handler of its own; the
    # worker's handler must not write them again, and -v 0 silences them.
    from tests.jobs import tasks as tasks_for_tests

    result = tasks_for_tests.add.enqueue(2, 3)
    proc = manage_py(
        "awa_worker",
        "--burst",
        "--verbosity",
        verbosity,
        extra_env={"DJANGO_SETTINGS_MODULE": "tests.settings_debug"},
    )
    assert proc.wait(60) == 0, proc.output()
    assert tasks_for_tests.add.get_result(result.id).return_value == 5
    output = proc.output()
    for state in ("RUNNING", "SUCCESSFUL"):
        lines = [
            line for line in output.splitlines() if f"id={result.id} " in line and state in line
        ]
        assert len(lines) <= most, f"{state} logged {len(lines)} times:\n{output}"


@clean_awa
def test_an_explicit_verbosity_sets_the_package_level_under_a_projects_logging() -> None:
    # pytest's own handlers count as configured logging: the project's setup is kept, and only
    # the awa_django logger's level follows an explicit --verbosity.
    package = logging.getLogger("awa_django")
    before = package.level
    try:
        call_command("awa_maintenance", "--once", verbosity=3, stderr=StringIO())
        assert package.level == logging.DEBUG
        call_command("awa_maintenance", "--once", verbosity=0, stderr=StringIO())
        assert package.level == logging.ERROR
        call_command("awa_maintenance", "--once", verbosity=1, stderr=StringIO())
        assert package.level == logging.ERROR  # the default leaves the configuration alone
    finally:
        package.setLevel(before)


# --reload ----------------------------------------------------------------------------------------

RELOAD_JOBS = """
from awa_django import job


@job(queue="reload")
def version() -> str:
    return {version!r}
"""


def _reload_job() -> int:
    body = json.dumps(
        [{"kind": "reload_jobs.version", "queue": "reload", "args": {"args": [], "kwargs": {}}}]
    )
    with pg() as conn:
        [(job_id, _)] = enqueue_sql(conn, body)
    return job_id


def _result(job_id: int) -> Any:
    with pg() as conn:
        state = job_state(conn, job_id)
    return state["result"] if state and state["state"] == "completed" else None


def _reloading_worker(manage_py: Start, module: Path) -> ManagedProcess:
    """``awa_worker --reload`` serving the job module ``module`` (version "v1"), once it ran a
    job of it."""
    module.write_text(textwrap.dedent(RELOAD_JOBS.format(version="v1")))
    proc = manage_py(
        "awa_worker",
        "--reload",
        "--queue",
        "reload",
        extra_env={
            "PYTHONPATH": str(module.parent),
            **worker_env(JOB_MODULES=[*DEFAULT_MODULES, "reload_jobs"]),
        },
    )
    first = _reload_job()
    wait_for(lambda: _result(first) == "v1", timeout=30, message=lambda: proc.output())
    return proc


@clean_awa
@pytest.mark.worker
def test_reload_restarts_the_worker_with_the_new_code_when_a_module_changes(
    manage_py: Start, tmp_path: Path
) -> None:
    module = tmp_path / "reload_jobs.py"
    proc = _reloading_worker(manage_py, module)
    [(before, child, _)] = rows()
    assert child != proc.pid  # the worker runs in the autoreloader's child process
    module.write_text(textwrap.dedent(RELOAD_JOBS.format(version="v2")))
    touched = [module.stat().st_mtime]

    def restarted() -> bool:
        if "changed; draining, then restarting" not in proc.output():
            touched[0] += 2  # until the reloader has seen the file once, and then its change
            os.utime(module, (touched[0], touched[0]))
            return False
        return [r[0] for r in rows()] not in ([], [before])

    wait_for(restarted, timeout=40, interval=1.0, message=lambda: proc.output())
    second = _reload_job()
    wait_for(lambda: _result(second) == "v2", timeout=30, message=lambda: proc.output())
    # Ctrl-C (SIGINT to the process group) drains the worker and ends both processes with 0.
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(30) == 0, proc.output()
    assert rows() == []  # deregistered: a graceful stop


@clean_awa
@pytest.mark.worker
def test_reload_waits_out_a_syntax_error_and_restarts_once_the_file_is_fixed(
    manage_py: Start, tmp_path: Path
) -> None:
    module = tmp_path / "reload_jobs.py"
    proc = _reloading_worker(manage_py, module)
    module.write_text("def broken(:\n")
    touched = [module.stat().st_mtime]

    def failed() -> bool:
        if "restarts when a Python file changes" not in proc.output():
            touched[0] += 2  # until the reloader has seen the file once, and then its change
            os.utime(module, (touched[0], touched[0]))
            return False
        return True

    wait_for(failed, timeout=40, interval=1.0, message=lambda: proc.output())
    assert proc.proc.poll() is None, proc.output()  # the watch goes on
    module.write_text(textwrap.dedent(RELOAD_JOBS.format(version="v3")))
    touched[0] += 2
    os.utime(module, (touched[0], touched[0]))
    second = _reload_job()
    wait_for(lambda: _result(second) == "v3", timeout=40, message=lambda: proc.output())
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(30) == 0, proc.output()


# --processes -------------------------------------------------------------------------------------


def test_children_repeat_the_command_line_with_the_same_options() -> None:
    argv = ["manage.py", "awa_worker", "--processes", "3", "--queue", "work"]
    orig = ["/usr/bin/python3", "-X", "dev", *argv]
    launch = launcher("awa_worker", from_command_line=True, argv=argv, orig_argv=orig)
    assert launch[1:] == ["-X", "dev", "manage.py"]
    module = ["/site/django/__main__.py", "awa_worker", "--burst"]
    assert launcher(
        "awa_worker",
        from_command_line=True,
        argv=module,
        orig_argv=["python", "-m", "django", "awa_worker", "--burst"],
    )[1:] == ["-m", "django"]
    # Called from code (call_command): python -m django.
    assert launcher("awa_worker", from_command_line=False, argv=argv, orig_argv=orig)[1:] == [
        "-m",
        "django",
    ]
    assert child_command(["py", "-m", "django"], "awa_worker", ["--processes", "3"]) == [
        "py",
        "-m",
        "django",
        "awa_worker",
        "--processes",
        "3",
        "--supervised",
    ]


@clean_awa
@pytest.mark.worker
def test_processes_reach_every_child_and_size_the_connection_budget(manage_py: Start) -> None:
    proc = manage_py(
        "awa_worker", "--processes", "2", "--concurrency", "9999", "--queue", "work",
        "--no-maintenance",
    )  # fmt: skip
    two = wait_for(
        lambda: found if len(found := rows()) == 2 else None,
        timeout=30,
        message=lambda: proc.output(),
    )
    assert [r[2] for r in two] == [9999, 9999]
    # Each child knows the fleet is two processes strong (9999 threads + 6 connections each:
    # claim, finalize, heartbeat, sweep, LISTEN, async handlers' ORM thread; no election).
    wait_for(
        lambda: (
            proc.output().count("2 process(es) x (9999 handler threads + 6) may need 20010") == 2
        ),
        timeout=15,
        message=lambda: proc.output(),
    )
    assert stopped(proc) == 0, proc.output()


@clean_awa
@pytest.mark.worker
def test_the_processes_setting_starts_a_supervised_fleet(manage_py: Start) -> None:
    proc = manage_py(
        "awa_worker",
        "--queue",
        "work",
        "--no-maintenance",
        extra_env=worker_env(PROCESSES=2),
    )
    wait_for(lambda: len(rows()) == 2, timeout=30, message=lambda: proc.output())
    assert stopped(proc) == 0, proc.output()
    assert rows() == []


@clean_awa
@pytest.mark.worker
def test_processes_work_when_the_command_is_called_from_code(manage_py: Start) -> None:
    jobs = [testjobs.ledger_sync.enqueue(i).id for i in range(20)]
    code = (
        "from django.core.management import call_command; "
        "call_command('awa_worker', processes=2, burst=True, queue=['work'])"
    )
    proc = manage_py("shell", "-c", code)
    assert proc.wait(60) == 0, proc.output()
    assert "started worker 1" in proc.output()
    with pg() as conn:
        done = conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state = 'completed'", [jobs]
        ).fetchone()
    assert done == (20,)


@pytest.mark.parametrize(
    "argv",
    [
        ("--queue", "a=5", "--concurrency", "3"),
        ("--reload", "--processes", "2"),
        ("--queue", "a", "--queue", "a=2"),
    ],
    ids=["concurrency-below-queue", "reload-with-processes", "queue-twice"],
)
def test_contradicting_options_are_a_usage_error_with_exit_status_2(
    manage_py: Start, argv: tuple[str, ...]
) -> None:
    proc = manage_py("awa_worker", *argv)
    assert proc.wait(timeout=60) == 2, proc.output()
    assert "CommandError" in proc.output()
