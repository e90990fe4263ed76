"""``manage.py awa_roles``: print (or run) the least-privilege grants of docs/roles.md (thin:
the script is built by awa_django.db.roles from awa_django/sql/roles.sql)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections, transaction

from awa_django.conf import awa_settings
from awa_django.db.roles import ROLE_KINDS, RoleNames, read_schema_facts, roles_script
from awa_django.exceptions import JobValidationError
from awa_django.management.commands._cli import database_errors
from awa_django.sql import schema

_HELP = {
    "owner": "the migration owner (runs migrate, owns the awa schema; not a superuser)",
    "app": "the application: enqueue, resolve callbacks, read one job by id",
    "worker": "workers run with --no-maintenance: claim, heartbeat, finalize",
    "maintenance": "the maintenance leader: a worker's functions plus the leader's tasks",
    "operator": "the admin's and the CLI's actions (cancel, retry, purge, pause) and reads",
    "reader": "read-only: the admin's lists, awa_status, awa_job show and list",
}


class Command(BaseCommand):
    help = (
        "Print the GRANT/REVOKE script that gives each named role only what it needs on the "
        "awa schema (--print-sql), or run it (--apply). Run it as the schema owner or a "
        "superuser, again after each migrate."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        mode = parser.add_mutually_exclusive_group(required=True)
        mode.add_argument("--print-sql", action="store_true", help="print the script")
        mode.add_argument("--apply", action="store_true", help="run the script in one transaction")
        for kind in ROLE_KINDS:
            parser.add_argument(f"--{kind}", metavar="ROLE", help=_HELP[kind])
        parser.add_argument(
            "--lock-advisory",
            action="store_true",
            help="also take PostgreSQL's advisory-lock functions from PUBLIC in this database "
            "and give them to the owner and the maintenance role (run as a superuser; "
            "docs/roles.md)",
        )
        parser.add_argument(
            "--database",
            default=None,
            help="database alias (default: AWA['DATABASE_ALIAS'])",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or awa_settings.DATABASE_ALIAS
        try:
            roles = RoleNames(**{kind: options[kind] for kind in ROLE_KINDS})
        except JobValidationError as exc:
            raise CommandError(str(exc)) from exc
        connection = connections[alias]
        with database_errors(), transaction.atomic(using=alias), connection.cursor() as cursor:
            facts = read_schema_facts(cursor)
            if facts is None:
                raise CommandError(
                    f"the {schema()} schema does not exist on this database: run "
                    "`manage.py migrate` (as the migration owner) first"
                )
            try:
                script = roles_script(roles, facts, lock_advisory=options["lock_advisory"])
            except JobValidationError as exc:
                raise CommandError(str(exc)) from exc
            text = script.as_string(cursor.cursor.connection)
            if options["apply"]:
                cursor.execute(text)
        if options["lock_advisory"] and facts.other_queues:
            named = ", ".join(f"{name} (owner {owner})" for name, owner in facts.other_queues)
            self.stderr.write(
                "note: --lock-advisory takes the advisory-lock functions from PUBLIC in the "
                f"whole database; the owners of its other queues keep them: {named}. Their "
                "maintenance roles, if any, need `awa_roles --lock-advisory --maintenance ROLE` "
                "run in their own projects (docs/schema.md)."
            )
        if facts.owner_is_superuser:
            self.stderr.write(
                f"warning: the {schema()} schema is owned by {facts.schema_owner}, a superuser: "
                "the functions the other roles call run as it. Migrate as a dedicated owner role "
                "(docs/roles.md)."
            )
        if options["apply"]:
            if options["verbosity"] > 0:
                named = ", ".join(
                    f"{kind} {getattr(roles, kind)}"
                    for kind in ROLE_KINDS
                    if getattr(roles, kind) is not None
                )
                self.stdout.write(f"granted: {named}")
            return
        self.stdout.write(text, ending="")
