"""Plumbing shared by the awa_* management commands (a ``_`` module: not a command itself).

* Argument types that turn every bad value into a clear usage error: ``CommandError`` under
  ``call_command``, a usage message and exit status 2 on the command line; never a traceback.
* :func:`database_errors`: a database error becomes a ``CommandError`` that says what failed.
* :func:`configure_logging`: ``--verbosity`` mapped onto the ``awa_django`` logger.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import logging
import math
import re
from collections.abc import Callable, Iterator

from django.core.management.base import CommandError, OutputWrapper
from django.core.management.color import Style
from django.db import DatabaseError

from awa_django.exceptions import JobValidationError
from awa_django.limits import MAX_BIGINT, check_queue_name, check_text
from awa_django.sql import schema
from awa_django.telemetry.logs import in_job

__all__ = [
    "LOG_LEVELS",
    "configure_logging",
    "database_errors",
    "integer",
    "job_id",
    "number",
    "operator_name",
    "queue_name",
    "text",
]

_DECIMAL = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,4})?")


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 40 else repr(value[:37] + "...")


def integer(what: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high`` written in ASCII digits
    (not NaN, not ``1.5``, not ``1e3``, not ``0x10``), named ``what`` in the error."""

    def parse(value: str) -> int:
        digits = value.strip()
        if not _DECIMAL.fullmatch(digits):
            raise argparse.ArgumentTypeError(
                f"{_shown(value)} is not {what}: give a whole number from {low} to {high}"
            )
        number = int(digits) if len(digits) <= 30 else None  # no int() of huge texts
        if number is None or not low <= number <= high:
            raise argparse.ArgumentTypeError(
                f"{_shown(digits)} is out of range: {what} is a whole number from {low} to {high}"
            )
        return number

    parse.__name__ = what
    return parse


def number(what: str, high: float, low: float = 0.0) -> Callable[[str], float]:
    """An argparse ``type``: a finite number above 0 (at least ``low`` when given) and at most
    ``high``, written in ASCII decimal (``50``, ``0.5``, ``2e3``; not NaN, not ``inf``), named
    ``what`` in the error."""
    bounds = f"from {low:g} to {high:g}" if low else f"above 0 and at most {high:g}"

    def parse(value: str) -> float:
        digits = value.strip()
        if not _NUMBER.fullmatch(digits):
            raise argparse.ArgumentTypeError(
                f"{_shown(value)} is not {what}: give a number {bounds}"
            )
        result = float(digits)
        if not (math.isfinite(result) and 0 < result <= high and result >= low):
            raise argparse.ArgumentTypeError(
                f"{_shown(digits)} is out of range: {what} is a number {bounds}"
            )
        return result

    parse.__name__ = what
    return parse


def operator_name(command: str) -> str:
    """Who a command acts as, for the records it writes: ``command (OS user)``."""
    try:
        return f"{command} ({getpass.getuser()})"
    except Exception:  # no user name in this environment
        return command


#: A job id: ``bigint``, from 1.
job_id = integer("a job id", 1, MAX_BIGINT)


def queue_name(value: str) -> str:
    """An argparse ``type``: a valid queue name."""
    try:
        return check_queue_name(value)
    except JobValidationError:
        raise argparse.ArgumentTypeError(
            f"{_shown(value)} is not a valid queue name (1-63 characters of a-z 0-9 _ . -)"
        ) from None


def text(what: str, max_length: int = 255) -> Callable[[str], str]:
    """An argparse ``type``: text PostgreSQL can store, of at most ``max_length`` characters."""

    def parse(value: str) -> str:
        try:
            return check_text(what, value, max_length=max_length)
        except JobValidationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what
    return parse


@contextlib.contextmanager
def database_errors(read_alias: str | None = None) -> Iterator[None]:
    """Turn a ``JobValidationError`` or a database error into a ``CommandError`` that says what
    failed (and, when the awa schema is missing, that ``migrate`` has not run). ``read_alias``:
    the block reads from ``AWA["READ_DATABASE_ALIAS"]`` (a replica), which the message names;
    no migrate hint then (a standby cannot be migrated)."""
    try:
        yield
    except JobValidationError as exc:
        raise CommandError(str(exc)) from exc
    except DatabaseError as exc:
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if read_alias is not None:
            raise CommandError(
                f"database error reading from the replica {read_alias!r} "
                f"(AWA['READ_DATABASE_ALIAS']): {message}"
            ) from exc
        hint = ""
        if schema() in message and "does not exist" in message:
            hint = " (has `manage.py migrate` run on this database?)"
        raise CommandError(f"database error: {message}{hint}") from exc


#: ``--verbosity`` → (level of the ``awa_django`` logger, level of the root logger when the
#: command configures logging itself).
LOG_LEVELS = {
    0: (logging.ERROR, logging.ERROR),
    1: (logging.INFO, logging.WARNING),
    2: (logging.DEBUG, logging.WARNING),
    3: (logging.DEBUG, logging.DEBUG),
}

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _CommandLogHandler(logging.Handler):
    """Writes log records to a command's ``stderr`` wrapper, styled by level."""

    def __init__(self, out: OutputWrapper, style: Style) -> None:
        super().__init__()
        self.out = out
        self.styles: dict[int, Callable[[str], str]] = {
            logging.CRITICAL: style.ERROR,
            logging.ERROR: style.ERROR,
            logging.WARNING: style.WARNING,
        }

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            self.out.write(message, style_func=self.styles.get(record.levelno, _plain))
            self.flush()
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self.out.flush()


def _plain(message: str) -> str:
    return message


def configure_logging(verbosity: int, stderr: OutputWrapper, style: Style) -> None:
    """Map ``--verbosity`` onto the ``awa_django`` logger: 0 errors only, 1 INFO (the default),
    2 DEBUG of awa_django's jobs (every job's start and end; the maintenance leader's detail
    stays at INFO), 3 DEBUG of every logger, maintenance included.

    When the project configured no logging handler (no ``LOGGING`` that reaches the
    ``awa_django`` or root logger), records go to the command's stderr, styled by level. When
    it did, its configuration is left alone at the default verbosity 1, and an explicit
    ``--verbosity 0``, ``2`` or ``3`` sets only the level of the ``awa_django`` logger.
    """
    package_level, root_level = LOG_LEVELS[max(0, min(verbosity, 3))]
    package, root = logging.getLogger("awa_django"), logging.getLogger()
    # Six lines a second of rotation and prune detail would bury the job lines of -v 2.
    maintenance = logging.getLogger("awa_django.maintenance")
    maintenance.setLevel(logging.INFO if verbosity == 2 else logging.NOTSET)
    if package.handlers or root.handlers:
        if verbosity != 1:
            package.setLevel(package_level)
        return
    handler = _CommandLogHandler(stderr, style)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(_LevelsFilter(package_level, root_level))
    root.addHandler(handler)
    # A handler's own records (any logger, while a job runs) show from the package's level:
    # a job's INFO line is the user's; the filter holds other libraries to root_level.
    root.setLevel(min(root_level, package_level))
    package.setLevel(package_level)
    if verbosity == 0:
        # Django's default logging sets the "django" logger to INFO with a console handler of
        # its own (DEBUG=True): at -v 0 it too reports errors only (django.tasks logs every
        # task's state at INFO).
        logging.getLogger("django").setLevel(logging.ERROR)


class _LevelsFilter(logging.Filter):
    """Lets through what the verbosity asks for: ``awa_django`` records, and those a job's
    handler logs while it runs, from ``package``, others from ``other`` (records that reach
    the root logger by propagation skip the root's level), and never a record a handler on its
    way up already wrote (Django's own console handler on the ``django`` logger, with
    DEBUG=True): no line twice."""

    def __init__(self, package: int, other: int) -> None:
        super().__init__()
        self.package, self.other = package, other

    def filter(self, record: logging.LogRecord) -> bool:
        own = (
            record.name == "awa_django"
            or record.name.startswith("awa_django.")
            or in_job()  # logged by a handler, while its job runs
        )
        if record.levelno < (self.package if own else self.other):
            return False
        logger: logging.Logger | None = logging.getLogger(record.name)
        root = logging.getLogger()
        while logger is not None and logger is not root:
            if logger.handlers:
                return False
            if not logger.propagate:
                break
            logger = logger.parent
        return True
