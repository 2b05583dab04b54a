"""The package's import graph: no import circles among epic_slime modules, no private names across the losses.

Read from the source (no module is imported), counting every import statement wherever it stands:
a deferred import inside a function still ties two modules together, it only hides the circle
until the function runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "epic_slime"

# No circle is allowed any more (issue 18 removed the last four); a new one fails the test.
KNOWN_TO_BE_REMOVED: tuple[frozenset, ...] = ()


def module_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package (packages as their __init__)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its source.

    ``from X import y`` counts as an import of X.y when that is a module, else of X; the parent
    packages Python initialises on the way are not counted (a submodule import from a partly
    initialised parent is fine; a circle between two modules is what breaks)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source)
    return {module for module in found if module in known and module != name}


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    files = module_files(package_dir)
    known = set(files)
    return {name: imported_modules(name, path, known) for name, path in files.items()}


def import_circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, circles = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circles_among_epic_slime_modules():
    circles = [sorted(c) for c in import_circles(import_graph()) if c not in KNOWN_TO_BE_REMOVED]
    assert not circles, f"import circles: {circles}"


def private_names_crossing(path: Path, sibling_modules: set[str]) -> list[str]:
    """``from M import _x`` and ``m._x`` on a sibling module ``m`` bound by ``from . import m``."""
    tree = ast.parse(path.read_text())
    crossings, module_aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            crossings += [
                f"from {'.' * node.level}{node.module or ''} import {alias.name}"
                for alias in node.names
                if alias.name.startswith("_")
            ]
            if node.level == 1 and node.module is None:
                module_aliases |= {alias.asname or alias.name for alias in node.names if alias.name in sibling_modules}
    crossings += [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in module_aliases
        and node.attr.startswith("_")
    ]
    return crossings


def test_no_losses_module_uses_a_private_name_of_another():
    files = module_files(PACKAGE_DIR / "losses")
    siblings = {name.rsplit(".", 1)[-1] for name in files}
    crossings = {name: found for name, path in files.items() if (found := private_names_crossing(path, siblings))}
    assert not crossings, crossings


def test_the_private_name_scan_sees_imports_and_attributes(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from .core import _a, b\nfrom . import bounds as _bounds\nx = _bounds._c(b) + _bounds.d\n")
    assert private_names_crossing(path, {"core", "bounds"}) == ["from .core import _a", "_bounds._c"]


@pytest.fixture
def package_with_circle(tmp_path):
    """A two-module circle held by a deferred import, and a relative import from a package."""
    root = tmp_path / "epic_slime"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("from .a import f\n")
    (root / "sub" / "a.py").write_text("from . import b\n\ndef f():\n    return b.g()\n")
    (root / "sub" / "b.py").write_text("def g():\n    from .a import f  # deferred\n    return f\n")
    (root / "c.py").write_text("from epic_slime.sub import f\n")
    return root


def test_the_scan_finds_a_circle_held_by_a_deferred_import(package_with_circle):
    graph = import_graph(package_with_circle)
    assert graph["epic_slime.sub"] == {"epic_slime.sub.a"}
    assert graph["epic_slime.sub.a"] == {"epic_slime.sub.b"}
    assert graph["epic_slime.c"] == {"epic_slime.sub"}
    assert import_circles(graph) == [frozenset({"epic_slime.sub.a", "epic_slime.sub.b"})]
