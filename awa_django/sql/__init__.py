"""Access to the SQL shipped with awa_django.

* ``tables.sql``, ``functions/*.sql``, ``views.sql``: the awa schema, one definition per object,
  run by the Django migrations (``RunAwaSQL``). A function whose statements name one ring
  partition each (the claim, the finalize) is written once, as a template: the lines between
  ``--@each queue_slot`` (or ``claim_slot``, ``lease_slot``) and ``--@end`` are repeated once
  per slot of that ring, with ``{queue_slot}`` replaced by the slot's number; ``{queue_slots}``
  (and the others) anywhere are the rings' slot counts (``RING_SLOTS``). :func:`sql_file`
  returns a file rendered.
* ``upgrades.sql`` and ``superseded.sql``: what a database migrated by a development version
  needs to match the schema (table changes made since; functions dropped).
* The schema these produce is pictured in docs/reference/schema.sql (``scripts/schema_dump``;
  tests check it against a migrated database).
* ``roles.sql``: the GRANT/REVOKE blocks of ``manage.py awa_roles``, one per role, whose
  placeholders ``awa_django.db.roles`` fills with quoted identifiers.
* ``queries/*.sql``: named statements (``-- name: foo`` headers) used by the Python code. Python
  refers to them by name and passes every value as a parameter.

Every file is written for the schema ``awa``. For another ``AWA["SCHEMA"]`` (docs/schema.md),
:func:`for_schema` moves the text to it as it is loaded: the schema's objects, its name as a
string, its NOTIFY channels (``awa_jobs``, ``awa_cancel``, ``awa_done``), its custom settings
(``awa.*``) and
its advisory-lock key spaces, so that two schemas in one database share nothing.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Mapping, Sequence
from importlib import resources
from types import MappingProxyType

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from awa_django.limits import check_schema_name

__all__ = [
    "DEFAULT_SCHEMA",
    "RING_SLOTS",
    "for_schema",
    "lock_space",
    "notify_channel",
    "query",
    "render",
    "roles_blocks",
    "schema",
    "schema_setting",
    "sql_file",
    "table_name",
]

#: The schema the SQL files are written for, and ``AWA["SCHEMA"]``'s default.
DEFAULT_SCHEMA = "awa"

#: The number of partitions (slots) of each ring, for a new database.
RING_SLOTS: Mapping[str, int] = MappingProxyType({"queue": 8, "claim": 8, "lease": 8})

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_EACH_RE = re.compile(
    r"^[ \t]*--@each (queue|claim|lease)_slot[ \t]*\n(.*?)^[ \t]*--@end[ \t]*\n",
    re.MULTILINE | re.DOTALL,
)


def render(
    text: str,
    slots: Mapping[str, int] = RING_SLOTS,
    numbers: Mapping[str, Sequence[int]] | None = None,
) -> str:
    """``text`` with its ``--@each`` blocks repeated once per ring slot and the slot counts
    (``{queue_slots}``, ``{claim_slots}``, ``{lease_slots}``) filled in. ``numbers`` renders
    the blocks for other slot numbers than ``0 .. count - 1`` (tests render a claim whose
    per-slot branches are never taken, to compare them with its generic statements)."""

    def each(match: re.Match[str]) -> str:
        ring, block = match.group(1), match.group(2)
        token = "{" + ring + "_slot}"
        chosen = numbers[ring] if numbers is not None else range(slots[ring])
        return "".join(block.replace(token, str(slot)) for slot in chosen)

    text = _EACH_RE.sub(each, text)
    for ring, count in slots.items():
        text = text.replace("{" + ring + "_slots}", str(count))
    return text


_pinned: str | None = None


def schema() -> str:
    """The schema of awa_django's tables and functions: ``AWA["SCHEMA"]`` as this process first
    read it (``awa`` while Django's settings are not configured), pinned from then on, because
    the models named their tables with it: an ``override_settings(AWA=...)`` cannot move a
    running process to another schema."""
    global _pinned
    if _pinned is not None:
        return _pinned
    if not settings.configured:
        return DEFAULT_SCHEMA
    _pinned = schema_setting(getattr(settings, "AWA", None))
    return _pinned


def schema_setting(raw: object) -> str:
    """The schema an ``AWA`` settings dict ``raw`` names, ``awa`` when it names none. Read on
    its own, not with the other settings, so that a bad value elsewhere in ``AWA`` still
    reaches ``manage.py check``; a bad schema name raises ``ImproperlyConfigured``, since no
    model could name its table."""
    value = raw.get("SCHEMA", DEFAULT_SCHEMA) if isinstance(raw, Mapping) else DEFAULT_SCHEMA
    if value == DEFAULT_SCHEMA:
        return DEFAULT_SCHEMA
    try:
        return check_schema_name(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{exc}.") from None


def table_name(name: str, in_schema: str | None = None) -> str:
    """A model's ``db_table`` for the table or view ``name`` of the schema (``in_schema``, or
    the configured one): ``'awa"."live_jobs'``, which Django quotes to ``"awa"."live_jobs"``."""
    return f'{in_schema or schema()}"."{name}'


def notify_channel(kind: str, in_schema: str | None = None) -> str:
    """The NOTIFY channel of ``kind`` (``jobs``: new work in a queue, ``cancel``: stop a running
    attempt) for the schema: ``awa_jobs`` and ``awa_cancel`` for ``awa``."""
    return f"{in_schema or schema()}_{kind}"


_LOCK_CLASS = re.compile(r"\b42821(7[7-9]|8[0-5])\b")
_LEADER_KEY = 4708303813012965710  # 0x4157415f4d41494e, "AWA_MAIN"
_LEADER_OBJID = _LEADER_KEY & 0xFFFFFFFF
_SETTINGS = re.compile(r"'awa\.(xact_lanes|enqueue_shards)'")
_SCHEMA_RULES = (
    (re.compile(r"\bawa\."), "{schema}."),
    (re.compile(r"\b(SCHEMA (?:IF (?:NOT )?EXISTS )?)awa\b"), r"\g<1>{schema}"),
    (re.compile(r"'awa'"), "'{schema}'"),
    (re.compile(r"\bawa_(jobs|cancel|done)\b"), r"{schema}_\g<1>"),
)


def for_schema(text: str, name: str) -> str:
    """SQL written for the schema ``awa`` (``text``) moved to the schema ``name``, a plain
    identifier that :func:`awa_django.limits.check_schema_name` accepts. For ``awa``, ``text``
    itself. Otherwise, every ``awa.`` qualifier of an object and ``SCHEMA awa`` names ``name``, the
    custom settings ``awa.xact_lanes`` and ``awa.enqueue_shards`` become ``awa.name_xact_lanes``
    and ``awa.name_enqueue_shards``, the string ``'awa'`` becomes ``'name'``, the channels
    ``awa_jobs``, ``awa_cancel`` and ``awa_done`` become ``name_jobs``, ``name_cancel`` and
    ``name_done``, and the advisory
    locks move to key spaces of their own: the classes 4282177-4282185 by a multiple of 16
    derived from the name (CRC-32), the leader's 64-bit key to the same high half and a low half
    derived from the name, so no lock of one schema is ever a lock of another's (short of a
    CRC-32 collision between two schema names, which ``migrate`` refuses)."""
    if name == DEFAULT_SCHEMA:
        return text
    # Custom settings keep the prefix awa (a schema's name may be a prefix an extension
    # reserves, such as plpgsql) and carry the schema's name in their own.
    text = _SETTINGS.sub(lambda m: "'\x00" + m.group(1) + "'", text)
    for pattern, replacement in _SCHEMA_RULES:
        text = pattern.sub(replacement.replace("{schema}", name), text)
    text = text.replace("'\x00", f"'awa.{name}_")
    shift, objid = lock_space(name)
    text = _LOCK_CLASS.sub(lambda m: str(int(m.group(0)) + shift), text)
    text = re.sub(rf"\b{_LEADER_KEY}\b", str((_LEADER_KEY >> 32 << 32) | objid), text)
    return re.sub(rf"\b{_LEADER_OBJID}\b", str(objid), text)


def lock_space(name: str) -> tuple[int, int]:
    """The advisory-lock key space of the schema ``name``: how far its lock classes are moved
    from ``awa``'s (4282177-4282185), and the low half of its leader key. ``(0, 1296124238)``
    for ``awa``; two schemas with the same first number share their locks, which ``migrate``
    refuses."""
    if name == DEFAULT_SCHEMA:
        return 0, _LEADER_OBJID
    crc = zlib.crc32(name.encode())
    return 16 * (1 + crc % (1 << 26)), crc if crc != _LEADER_OBJID else crc ^ 1


def sql_file(path: str, in_schema: str | None = None) -> str:
    """The rendered text of the schema file ``path`` (``tables.sql``, ``functions/claim.sql``)
    for the schema ``in_schema``, or the configured one."""
    return _schema_file(path, in_schema or schema())


@functools.cache
def _schema_file(path: str, name: str) -> str:
    return for_schema(_rendered_file(path), name)


@functools.cache
def _rendered_file(path: str) -> str:
    folder = resources.files(__package__)
    for part in path.split("/"):
        folder = folder / part
    return render(folder.read_text(encoding="utf-8"))


def _named_blocks(text: str, source: str, into: dict[str, str], *, strip: bool) -> None:
    matches = list(_NAME_RE.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        name = match.group(1)
        if name in into:
            raise RuntimeError(f"duplicate query name {name!r} in {source}")
        block = text[match.end() : end].strip()
        into[name] = block.rstrip(";") if strip else block


@functools.cache
def _load_queries(name: str) -> dict[str, str]:
    queries: dict[str, str] = {}
    folder = resources.files(__package__) / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = for_schema(entry.read_text(encoding="utf-8"), name)
        _named_blocks(text, entry.name, queries, strip=True)
    return queries


def roles_blocks(in_schema: str | None = None) -> dict[str, str]:
    """The named blocks of ``roles.sql`` (``owner``, ``app``, ``worker``, ``maintenance``,
    ``operator``, ``entry_points``) for the schema ``in_schema`` or the configured one, each
    several statements with ``{placeholders}`` for identifiers only."""
    return _roles_blocks(in_schema or schema())


@functools.cache
def _roles_blocks(name: str) -> dict[str, str]:
    blocks: dict[str, str] = {}
    text = (resources.files(__package__) / "roles.sql").read_text(encoding="utf-8")
    _named_blocks(for_schema(text, name), "roles.sql", blocks, strip=False)
    return blocks


def query(name: str, in_schema: str | None = None) -> str:
    """Return the named statement ``name`` from ``queries/*.sql``, for the schema ``in_schema``
    or the configured one.

    Raises ``KeyError`` for an unknown name. The text is a constant shipped with the package;
    values are always passed separately as parameters.
    """
    return _load_queries(in_schema or schema())[name]
