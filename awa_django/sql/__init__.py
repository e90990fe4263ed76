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
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from types import MappingProxyType

__all__ = ["RING_SLOTS", "query", "render", "roles_blocks", "sql_file"]

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


@functools.cache
def sql_file(path: str) -> str:
    """The rendered text of the schema file ``path`` (``tables.sql``, ``functions/claim.sql``)."""
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
def _load_queries() -> dict[str, str]:
    queries: dict[str, str] = {}
    folder = resources.files(__package__) / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        _named_blocks(entry.read_text(encoding="utf-8"), entry.name, queries, strip=True)
    return queries


@functools.cache
def roles_blocks() -> dict[str, str]:
    """The named blocks of ``roles.sql`` (``owner``, ``app``, ``worker``, ``maintenance``,
    ``operator``, ``entry_points``), each several statements with ``{placeholders}`` for
    identifiers only."""
    blocks: dict[str, str] = {}
    text = (resources.files(__package__) / "roles.sql").read_text(encoding="utf-8")
    _named_blocks(text, "roles.sql", blocks, strip=False)
    return blocks


def query(name: str) -> str:
    """Return the named statement ``name`` from ``queries/*.sql``.

    Raises ``KeyError`` for an unknown name. The text is a constant shipped with the package;
    values are always passed separately as parameters.
    """
    return _load_queries()[name]
