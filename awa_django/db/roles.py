"""The least-privilege grants of ``manage.py awa_roles`` (docs/roles.md).

The script comes from ``awa_django/sql/roles.sql``, one block per role and one list per group
of functions; role and database names are validated here and composed into it as quoted
identifiers (``psycopg.sql.Identifier``), never pasted as text, and so are the function names of
the lists, each checked to be an ``awa`` function name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from awa_django.exceptions import InvalidOptionError
from awa_django.sql import query, roles_blocks, schema

__all__ = [
    "FUNCTION_LISTS",
    "ROLE_KINDS",
    "RoleNames",
    "SchemaFacts",
    "check_role_name",
    "function_names",
    "read_schema_facts",
    "roles_script",
]

#: The roles the script knows, in the order their blocks are printed.
ROLE_KINDS = ("owner", "app", "worker", "maintenance", "operator", "reader")

#: The lists of functions of roles.sql, each a block of that name.
FUNCTION_LISTS = (
    "producer_functions",
    "app_functions",
    "read_functions",
    "worker_functions",
    "maintenance_functions",
    "operator_functions",
)

# A plain identifier: what every example and every DBA uses. Quoting would make any text safe,
# but names with spaces, quotes or dollars are refused so that the printed script reads plainly.
_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# Names PostgreSQL keeps for itself: PUBLIC is not a role, pg_* roles are predefined.
_RESERVED = re.compile(r"(?i)public|none|current_user|session_user|current_role|pg_.*")
# One entry of a function list: an awa function by name (each name has one signature).
_FUNCTION = re.compile(r"[a-z_][a-z0-9_]{0,62}\.([a-z_][a-z0-9_]{0,62})")


def check_role_name(option: str, value: str) -> str:
    """Return ``value`` when it is a plain role name (1 to 63 ASCII letters, digits and ``_``,
    not starting with a digit, not ``PUBLIC`` or ``pg_*``); else raise ``InvalidOptionError``
    naming ``option``."""
    if not isinstance(value, str) or _ROLE.fullmatch(value) is None:
        raise InvalidOptionError(
            option,
            f"{str(value)[:40]!r} is not a role name (1 to 63 ASCII letters, digits and _, "
            "not starting with a digit)",
        )
    if _RESERVED.fullmatch(value):
        raise InvalidOptionError(option, f"{value!r} is reserved by PostgreSQL")
    return value


@dataclass(frozen=True)
class RoleNames:
    """The roles to grant to; ``None`` leaves a role's block out. ``owner`` is the migration
    owner: given, its block is printed; absent, the current owner of the awa schema still names
    whose future objects the default privileges cover."""

    owner: str | None = None
    app: str | None = None
    worker: str | None = None
    maintenance: str | None = None
    operator: str | None = None
    reader: str | None = None

    def __post_init__(self) -> None:
        for kind in ROLE_KINDS:
            value = getattr(self, kind)
            if value is not None:
                check_role_name(f"--{kind}", value)
        if all(getattr(self, kind) is None for kind in ROLE_KINDS):
            raise InvalidOptionError(
                "roles",
                "name at least one role (--owner, --app, --worker, --maintenance, --operator, "
                "--reader)",
            )
        seen: dict[str, str] = {}
        for kind in ROLE_KINDS:
            value = getattr(self, kind)
            if value is None:
                continue
            if value in seen:
                # Each block revokes what the others grant: the last one would silently win.
                raise InvalidOptionError(
                    f"--{kind}", f"{value!r} is already the {seen[value]} role; one role each"
                )
            seen[value] = kind


@dataclass(frozen=True)
class SchemaFacts:
    """What the script needs from the database: its name, the owner of the awa schema and
    whether that owner is a superuser."""

    database: str
    schema_owner: str
    owner_is_superuser: bool
    #: The other queues of the database (other ``AWA["SCHEMA"]``s): (schema, owner) each.
    other_queues: tuple[tuple[str, str], ...] = ()


def read_schema_facts(cursor: Any) -> SchemaFacts | None:
    """Read :class:`SchemaFacts` with ``cursor``; ``None`` when the awa schema does not exist
    (``migrate`` has not run)."""
    cursor.execute(query("roles_schema"))
    row = cursor.fetchone()
    if row is None:
        return None
    cursor.execute(query("roles_other_queues"))
    others = tuple((str(name), str(owner)) for name, owner in cursor.fetchall())
    return SchemaFacts(row[0], row[1], bool(row[2]), others)


def _statement_text(blocks: Mapping[str, str], name: str) -> str:
    lines = [line for line in blocks[name].splitlines() if not line.startswith("--")]
    return "\n".join(lines).strip()


def function_names(name: str) -> tuple[str, ...]:
    """The functions of the list ``name`` of roles.sql (one of :data:`FUNCTION_LISTS`), as
    names in the awa schema, in their order."""
    if name not in FUNCTION_LISTS:
        raise KeyError(name)
    entries = [e for e in re.split(r"[\s,]+", _statement_text(roles_blocks(), name)) if e]
    names = []
    for entry in entries:
        match = _FUNCTION.fullmatch(entry)
        if match is None:  # pragma: no cover - the packaged file is checked by the tests
            raise ValueError(f"roles.sql, {name}: {entry!r} is not an awa function name")
        names.append(match.group(1))
    return tuple(names)


def _functions(name: str) -> sql.Composed:
    """The list ``name`` as a GRANT names its functions, one a line: ``"awa"."a",
    "awa"."b"`` (by name alone: each awa function name has one signature)."""
    return sql.SQL(",\n    ").join(sql.Identifier(schema(), fn) for fn in function_names(name))


def roles_script(
    roles: RoleNames, facts: SchemaFacts, *, lock_advisory: bool = False
) -> sql.Composed:
    """The GRANT/REVOKE script for ``roles`` on the database ``facts`` describes: the blocks of
    ``roles.sql`` of the roles given, in :data:`ROLE_KINDS` order, with every name an
    identifier. Running it twice changes nothing the first run did not. ``lock_advisory``
    adds the superuser block that takes the advisory-lock functions from ``PUBLIC`` in this
    database and gives them to the owner, the maintenance role (named: it is required) and the
    owners of the database's other queues (``facts.other_queues``)."""
    if lock_advisory and roles.maintenance is None:
        raise InvalidOptionError(
            "--lock-advisory",
            "name the --maintenance role, which keeps the advisory-lock functions (the "
            "maintenance leader takes its lock outside any function)",
        )
    if roles.owner is not None and roles.owner != facts.schema_owner:
        raise InvalidOptionError(
            "--owner",
            f"the {schema()} schema is owned by {facts.schema_owner!r}, not {roles.owner!r} "
            "(--owner names the role that ran migrate)",
        )
    for kind in ROLE_KINDS[1:]:
        if getattr(roles, kind) == facts.schema_owner:
            # Its block revokes from the role it names: the owner would lose its own rights,
            # and with them every function that runs as the owner, for every role.
            raise InvalidOptionError(
                f"--{kind}",
                f"{facts.schema_owner!r} owns the {schema()} schema; the {kind} role must be "
                "another",
            )
    blocks = roles_blocks()
    owner = facts.schema_owner
    values: dict[str, sql.Composable] = {
        "database": sql.Identifier(facts.database),
        "owner": sql.Identifier(owner),
        "advisory_functions": sql.SQL(_statement_text(blocks, "advisory_functions")),
        # The functions are the database's, not the schema's: the owners of the other queues
        # in it keep them too, or their own functions could no longer take their locks.
        "advisory_roles": sql.SQL(", ").join(
            sql.Identifier(name)
            for name in dict.fromkeys(
                [owner, *(other for _, other in facts.other_queues), roles.maintenance]
            )
            if name is not None
        ),
    }
    for name in FUNCTION_LISTS:
        values[name] = _functions(name)
    for kind in ROLE_KINDS[1:]:
        role = getattr(roles, kind)
        if role is not None:
            values[kind] = sql.Identifier(role)
    parts: list[sql.Composable] = [
        sql.SQL(blocks[kind].strip() + "\n").format(**values)
        for kind in ROLE_KINDS
        if getattr(roles, kind) is not None
    ]
    if lock_advisory:
        parts.append(sql.SQL(blocks["advisory"].strip() + "\n").format(**values))
    return sql.SQL("\n").join(parts)
