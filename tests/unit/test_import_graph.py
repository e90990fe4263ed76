"""Imports inside awa_django run one way: no module imports, directly or through others, a module
that imports it back. Imports inside functions count too (a lazy import hides a cycle; it does
not remove it); imports under ``if TYPE_CHECKING:`` do not (they never run)."""

from __future__ import annotations

import ast
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
            for target in imported(node, name, path.name == "__init__.py"):
                # A name imported from a module is an edge to that module; a submodule
                # imported from a package, an edge to the submodule.
                while target and target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
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


#: Folders that must never import another (directly; imports inside functions count too): the
#: worker runs the maintenance leader and both use awa_django.db, never the other way round; the
#: django.tasks backend's runner is run by the worker and imports none of it; nothing imports
#: the admin but Django.
LAYERS = {
    "awa_django.db": ("awa_django.maintenance", "awa_django.worker", "awa_django.admin"),
    "awa_django.maintenance": ("awa_django.worker", "awa_django.admin"),
    "awa_django.backends": ("awa_django.worker", "awa_django.admin"),
    "awa_django.worker": ("awa_django.admin",),
}


def inside(name: str, folder: str) -> bool:
    return name == folder or name.startswith(folder + ".")


def test_lower_folders_never_import_upwards() -> None:
    edges = graph()
    assert "awa_django.maintenance.leader" in edges["awa_django.worker.runtime"]
    upward = [
        (name, target)
        for name, targets in edges.items()
        for folder, above in LAYERS.items()
        if inside(name, folder)
        for target in targets
        if any(inside(target, higher) for higher in above)
    ]
    assert upward == []


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
