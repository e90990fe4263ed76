"""Imports inside awa_django run one way: down the rooms of docs/development.md ("Where things
live in the code"), and never in a cycle. Imports inside functions count too (a lazy import
hides a cycle; it does not remove it); imports under ``if TYPE_CHECKING:`` do not (they never
run). A name imported from a package that holds the importing module (``from awa_django import
__version__``) is an import of that package's ``__init__``."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "awa_django"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.relative_to(PACKAGE).parts
    }


def imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The modules (or names in modules) an import statement of module ``name`` refers to."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    return [source, *(f"{source}.{alias.name}" for alias in node.names)]


def targets(
    node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: Iterable[str]
) -> set[str]:
    """The modules of ``known`` that an import statement of module ``name`` depends on: a name
    imported from a module is an edge to that module, a submodule imported from a package an
    edge to the submodule, and a name imported from a package that holds ``name`` an edge to
    that package's ``__init__``; the package a submodule of it is imported from is none."""
    known = set(known)
    found = set()
    for named in imported(node, name, is_package):
        target = named
        while target and target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        if target not in known or target == name:
            continue
        if name.startswith(target + ".") and named == target:
            continue
        found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in skipped:
                continue
            edges[name] |= targets(node, name, path.name == "__init__.py", known)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_of_the_package_has_no_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    edges = graph()
    assert "awa_django.types" in edges["awa_django.producer"]
    edges["awa_django.types"].add("awa_django.producer")  # and back: a cycle
    assert any({"awa_django.producer", "awa_django.types"} <= set(c) for c in cycles(edges))


def test_operator_reads_never_reach_a_write() -> None:
    """The operator API's split: ``operator.reads`` imports neither ``write_transaction`` nor
    ``operator.actions``; every write lives in ``operator.actions``."""
    tree = ast.parse((PACKAGE / "operator" / "reads.py").read_text())
    names = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert "write_transaction" not in names
    assert "awa_django.operator.actions" not in graph()["awa_django.operator.reads"]


#: The rooms of docs/development.md ("Where things live in the code"), from the top down: a
#: module may import its own room and the rooms below it, never one above. An entry is a module
#: or a folder (every module in it); ``awa_django`` itself is only the package's ``__init__``.
ROOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "the public API, admin and commands",
        (
            "awa_django",
            "awa_django.apps",
            "awa_django.models",
            "awa_django.admin",
            "awa_django.management",
        ),
    ),
    (
        "HTTP views",
        ("awa_django.urls", "awa_django.views", "awa_django.callbacks", "awa_django.http_targets"),
    ),
    ("operator API", ("awa_django.operator",)),
    ("worker", ("awa_django.worker", "awa_django.maintenance", "awa_django.testing")),
    ("django.tasks", ("awa_django.backends",)),
    (
        "job API",
        (
            "awa_django.producer",
            "awa_django.workflows",
            "awa_django.jobs",
            "awa_django.periodic",
            "awa_django.outcomes",
            "awa_django.context",
            "awa_django.middleware",
        ),
    ),
    ("storage and telemetry", ("awa_django.db", "awa_django.telemetry")),
    (
        "foundations",
        (
            "awa_django._version",
            "awa_django.types",
            "awa_django.conf",
            "awa_django.connection_budget",
            "awa_django.cron",
            "awa_django.checks",
            "awa_django.limits",
            "awa_django.serialization",
            "awa_django.exceptions",
            "awa_django.retry",
            "awa_django.unique",
            "awa_django.states",
            "awa_django.timetext",
            "awa_django.sql",
        ),
    ),
)


def inside(name: str, folder: str) -> bool:
    return name == folder or name.startswith(folder + ".")


def room(name: str) -> int:
    """The index in :data:`ROOMS` of module ``name``'s room (0 is the top)."""
    found = [
        index
        for index, (_, entries) in enumerate(ROOMS)
        for entry in entries
        if name == entry or (entry != "awa_django" and inside(name, entry))
    ]
    assert len(found) == 1, f"{name} is in {len(found)} rooms; give it one in ROOMS"
    return found[0]


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of a module from a room above its own."""
    return sorted(
        (name, target)
        for name, targets in edges.items()
        for target in targets
        if room(target) < room(name)
    )


def test_every_module_has_a_room() -> None:
    for name in modules():
        room(name)


def test_no_module_imports_from_a_room_above_its_own() -> None:
    assert upward(graph()) == []


def test_the_room_check_finds_an_upward_import() -> None:
    edges = graph()
    assert "awa_django.maintenance.leader" in edges["awa_django.worker.runtime"]
    edges["awa_django.checks"].add("awa_django.worker.config")  # foundations -> worker
    edges["awa_django.telemetry.metrics"].add("awa_django")  # a name from the package
    assert upward(edges) == [
        ("awa_django.checks", "awa_django.worker.config"),
        ("awa_django.telemetry.metrics", "awa_django"),
    ]


def test_a_name_from_the_package_is_an_import_of_its_init() -> None:
    """``from awa_django import __version__`` runs ``awa_django/__init__.py``, which imports the
    producer and most of the package: an edge to ``awa_django``, which the room check refuses
    below the top room. Importing a submodule from its package is not."""
    known = modules()

    def edges_of(statement: str) -> set[str]:
        node = ast.parse(statement).body[0]
        assert isinstance(node, ast.ImportFrom)
        return targets(node, "awa_django.telemetry.metrics", False, known)

    assert edges_of("from awa_django import __version__") == {"awa_django"}
    assert edges_of("from awa_django import serialization") == {"awa_django.serialization"}
    assert edges_of("from awa_django._version import __version__") == {"awa_django._version"}
    assert "awa_django" not in graph()["awa_django.telemetry.metrics"]


def test_the_public_job_context_needs_no_worker() -> None:
    edges = graph()
    assert not any(inside(target, "awa_django.worker") for target in edges["awa_django.context"])


def test_admin_modules_never_import_their_package() -> None:
    """``awa_django.admin`` registers the pages when Django imports it: a module of the package
    that imported it back would be a cycle the graph above cannot see (it skips parents)."""
    for path in (PACKAGE / "admin").glob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "awa_django.admin", path.name
                assert not (node.level and not node.module), path.name
