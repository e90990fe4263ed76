"""The least-privilege grants of ``manage.py awa_roles`` (docs/roles.md).

The script comes from ``awa_django/sql/roles.sql``, one block per role; role and database names
are validated here and composed into it as quoted identifiers (``psycopg.sql.Identifier``),
never pasted as text. The ring partitions that the maintenance role may truncate are read from
the catalog, so the script matches the database it is printed for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from awa_django.exceptions import InvalidOptionError
from awa_django.sql import query, roles_blocks

__all__ = [
    "RING_PARENTS",
    "ROLE_KINDS",
    "RoleNames",
    "SchemaFacts",
    "check_role_name",
    "read_schema_facts",
    "roles_script",
]

#: The roles the script knows, in the order their blocks are printed.
ROLE_KINDS = ("owner", "app", "worker", "maintenance", "operator")

# A plain identifier: what every example and every DBA uses. Quoting would make any text safe,
# but names with spaces, quotes or dollars are refused so that the printed script reads plainly.
_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# Names PostgreSQL keeps for itself: PUBLIC is not a role, pg_* roles are predefined.
_RESERVED = re.compile(r"(?i)public|none|current_user|session_user|current_role|pg_.*")

# The parents of the ring partitions (what awa.prune_v1 truncates, child by child).
RING_PARENTS = (
    "ready_entries",
    "ready_tombstones",
    "done_entries",
    "claims",
    "claim_closures",
    "leases",
)


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

    def __post_init__(self) -> None:
        for kind in ROLE_KINDS:
            value = getattr(self, kind)
            if value is not None:
                check_role_name(f"--{kind}", value)
        if all(getattr(self, kind) is None for kind in ROLE_KINDS):
            raise InvalidOptionError(
                "roles",
                "name at least one role (--owner, --app, --worker, --maintenance, --operator)",
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
    """What the script needs from the database: its name, the owner of the awa schema, whether
    that owner is a superuser, and the ring partitions (schema-qualified names)."""

    database: str
    schema_owner: str
    owner_is_superuser: bool
    ring_partitions: tuple[str, ...]


def read_schema_facts(cursor: Any) -> SchemaFacts | None:
    """Read :class:`SchemaFacts` with ``cursor``; ``None`` when the awa schema does not exist
    (``migrate`` has not run)."""
    cursor.execute(query("roles_schema"))
    row = cursor.fetchone()
    if row is None:
        return None
    cursor.execute(query("roles_ring_partitions"), [list(RING_PARENTS)])
    partitions = tuple(r[0] for r in cursor.fetchall())
    return SchemaFacts(row[0], row[1], bool(row[2]), partitions)


def _entry_points(blocks: Mapping[str, str], name: str = "entry_points") -> sql.SQL:
    lines = [line for line in blocks[name].splitlines() if not line.startswith("--")]
    return sql.SQL("\n".join(lines).strip())


def roles_script(
    roles: RoleNames, facts: SchemaFacts, *, lock_advisory: bool = False
) -> sql.Composed:
    """The GRANT/REVOKE script for ``roles`` on the database ``facts`` describes: the blocks of
    ``roles.sql`` of the roles given, in :data:`ROLE_KINDS` order, with every name an
    identifier. Running it twice changes nothing the first run did not. ``lock_advisory``
    adds the superuser block that takes the advisory-lock functions from ``PUBLIC`` in this
    database and gives them to the owner and the worker and maintenance roles named."""
    if lock_advisory and roles.worker is None and roles.maintenance is None:
        raise InvalidOptionError(
            "--lock-advisory",
            "name the --worker and --maintenance roles that keep the advisory-lock functions",
        )
    if roles.owner is not None and roles.owner != facts.schema_owner:
        raise InvalidOptionError(
            "--owner",
            f"the awa schema is owned by {facts.schema_owner!r}, not {roles.owner!r} (--owner "
            "names the role that ran migrate)",
        )
    for kind in ROLE_KINDS[1:]:
        if getattr(roles, kind) == facts.schema_owner:
            # Its block revokes from the role it names: the owner would lose its own rights,
            # and with them every SECURITY DEFINER entry point, for every role.
            raise InvalidOptionError(
                f"--{kind}",
                f"{facts.schema_owner!r} owns the awa schema; the {kind} role must be another",
            )
    blocks = roles_blocks()
    owner = facts.schema_owner
    values: dict[str, sql.Composable] = {
        "database": sql.Identifier(facts.database),
        "owner": sql.Identifier(owner),
        "entry_points": _entry_points(blocks),
        "ring_partitions": sql.SQL(", ").join(
            sql.Identifier("awa", name) for name in facts.ring_partitions
        ),
    }
    for kind in ROLE_KINDS[1:]:
        name = getattr(roles, kind)
        if name is not None:
            values[kind] = sql.Identifier(name)
    values["advisory_functions"] = _entry_points(blocks, "advisory_functions")
    values["advisory_roles"] = sql.SQL(", ").join(
        sql.Identifier(name)
        for name in (owner, roles.worker, roles.maintenance)
        if name is not None
    )
    parts: list[sql.Composable] = []
    for kind in ROLE_KINDS:
        if getattr(roles, kind) is None:
            continue
        if kind == "maintenance" and not facts.ring_partitions:
            raise InvalidOptionError("--maintenance", "the awa schema has no ring partitions")
        parts.append(sql.SQL(blocks[kind].strip() + "\n").format(**values))
    if lock_advisory:
        parts.append(sql.SQL(blocks["advisory"].strip() + "\n").format(**values))
    return sql.SQL("\n").join(parts)
