"""``manage.py awa_roles`` (docs/roles.md, "The command"): the script it prints, the names it
refuses before anything runs, and the mistakes that would break every role."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from psycopg import sql

from awa_django.db.roles import FUNCTION_LISTS, function_names
from tests.support.database import pg

pytestmark = pytest.mark.django_db

APP = "awa_cmd_app"


def _print(*args: str) -> str:
    out = StringIO()
    call_command("awa_roles", "--print-sql", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _schema_owner() -> str:
    with pg() as conn:
        row = conn.execute(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'awa'"
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_print_sql_names_every_role_and_function_as_a_quoted_identifier() -> None:
    script = _print("--app", "shop_app", "--maintenance", "Shop_Maint", "--reader", "shop_ro")
    assert 'GRANT USAGE ON SCHEMA awa TO "shop_app";' in script
    assert '"awa"."enqueue_one_v2",' in script and '"awa"."prune_v1",' in script
    assert 'TO "Shop_Maint";' in script and 'TO "shop_ro";' in script
    assert "--worker" not in script and '"shop_worker"' not in script
    statements = [line for line in script.splitlines() if not line.startswith("--")]
    for word in ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "USAGE, SELECT"):
        assert not [line for line in statements if word in line], word


def test_the_function_lists_name_awa_functions() -> None:
    for name in FUNCTION_LISTS:
        functions = function_names(name)
        assert functions and len(set(functions)) == len(functions), name
    # What changes the queue is never granted to the reader or the application.
    reads = set(function_names("read_functions"))
    app = set(function_names("app_functions")) | set(function_names("producer_functions"))
    for writer in ("cancel_v1", "dlq_purge_v1", "prune_v1", "claim_v3", "finalize_v2"):
        assert writer not in reads and writer not in app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--app", 'x"; DROP SCHEMA awa; --'], "--app: "),
        (["--operator", "public"], "reserved"),
        (["--worker", "pg_monitor"], "reserved"),
        (["--reader", "current_user"], "reserved"),
        (["--owner", "1abc"], "not a role name"),
        (["--app", "a" * 64], "not a role name"),
        ([], "name at least one role"),
        (["--app", "same", "--reader", "same"], "already the app role"),
        (["--lock-advisory", "--worker", "w"], "--maintenance"),
    ],
)
def test_bad_role_names_and_options_are_refused_before_anything_runs(
    args: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("awa_roles", "--apply", *args, stdout=StringIO(), stderr=StringIO())


@pytest.mark.parametrize("kind", ["app", "worker", "maintenance", "operator", "reader"])
def test_the_schema_owner_is_refused_as_any_other_role(kind: str) -> None:
    # Each block revokes from the role it names: named the owner, it would take the owner's own
    # privileges away, and with them every function that runs as the owner, for every role.
    with pytest.raises(CommandError, match="owns the awa schema"):
        _print(f"--{kind}", _schema_owner())


def test_an_owner_that_does_not_own_the_schema_is_refused() -> None:
    # --owner names the migration owner; once the awa schema exists it has one. Naming another
    # role (a typo: --owner shop_app) would print GRANT CONNECT, CREATE ON DATABASE to it.
    with pg() as conn:
        conn.execute(
            sql.SQL(
                "DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {n}) "
                "THEN CREATE ROLE {i}; END IF; END$$"
            ).format(n=sql.Literal(APP), i=sql.Identifier(APP))
        )
    with pytest.raises(CommandError, match="--owner"):
        _print("--owner", APP)
