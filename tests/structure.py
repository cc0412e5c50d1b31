"""The packages' import graph and rooms, as tests/test_structure.py checks them.

A module is named as Python names it (``streamstone_py._transport._runner``; a
package's ``__init__.py`` is the package). A room is a set of modules with
rules at its door (:class:`Room`); its names are patterns of module names
(fnmatch: ``*`` matches any run of characters, dots included), so
``handlers._queue*`` is the package ``handlers._queue`` and all under it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Lowest first: a package may import only the ones before it.
LAYERS = ("streamstone_py", "handlers", "spark_driver")


def module_name(path: Path) -> str:
    """``streamstone_py/_transport/_runner.py`` -> ``streamstone_py._transport._runner``;
    a package's ``__init__.py`` is the package itself."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(folder: str) -> list[Path]:
    """Every module under ``folder``, its subpackages' included."""
    return sorted((ROOT / folder).rglob("*.py"))


def _runtime_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node of the module except those under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def _imports(path: Path, typing: bool) -> set[str]:
    """The project modules ``path`` imports (package-relative resolved): when it
    runs, and with ``typing`` those it names for the type checker too."""
    here = module_name(path)
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree) if typing else _runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                # A package's own name is its __init__: `.` from there is the package.
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - node.level + (path.stem == "__init__")])
                if node.module:
                    found.add(f"{base}.{node.module}")
                    found.update(f"{base}.{node.module}.{alias.name}" for alias in node.names)
                else:  # from . import _stream
                    found.update(f"{base}.{alias.name}" for alias in node.names)
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in LAYERS}


def graph(*, typing: bool = False) -> dict[str, set[str]]:
    """Each module of the packages, and the modules it imports (with ``typing``,
    those under ``if TYPE_CHECKING:`` too)."""
    found = {
        module_name(path): _imports(path, typing) for package in LAYERS for path in modules(package)
    }
    # Keep only edges to modules (``from x import name`` also listed x.name).
    return {name: {m for m in targets if m in found} for name, targets in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each circle found by a depth-first walk, as the modules around it."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return found


def within(module: str, package: str) -> bool:
    """Is ``module`` the package ``package`` or one of the modules under it?"""
    return module == package or module.startswith(package + ".")


def matches(module: str, patterns: tuple[str, ...]) -> bool:
    """Does ``module`` match one of the patterns?"""
    return any(fnmatchcase(module, pattern) for pattern in patterns)


@dataclass(frozen=True)
class Room:
    """Modules with rules at their door; ``name`` says why."""

    name: str
    members: tuple[str, ...]
    #: Who outside the room may import its members (``None``: anyone).
    importers: tuple[str, ...] | None = None
    #: What of the packages outside the room its members may import (``None``: anything).
    imports: tuple[str, ...] | None = None


def breaches(edges: dict[str, set[str]], room: Room) -> list[str]:
    """Each import through the room's door that its rules do not let through."""
    found = []
    for module, targets in sorted(edges.items()):
        inside = matches(module, room.members)
        for target in sorted(targets):
            if inside == matches(target, room.members):
                continue  # within the room, or beside it
            if not inside and room.importers is not None and not matches(module, room.importers):
                found.append(f"{module} imports {target}")
            if inside and room.imports is not None and not matches(target, room.imports):
                found.append(f"{module} imports {target}")
    return found


def package_folders() -> list[Path]:
    return [p.parent for layer in LAYERS for p in sorted((ROOT / layer).rglob("__init__.py"))]


def held(folder: Path) -> list[str]:
    """What the folder holds directly, as the count above counts it."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    )


def drawn_tree(doc: str) -> dict[str, str]:
    """Each class of a drawn error tree, with the class drawn as its parent."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        found = re.match(r"^(\s*)((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w*Error)\b", line)
        if not found or not line.startswith("    "):
            continue
        depth = len(found.group(2)) // 4 + (1 if "──" in line else 0)
        name = found.group(3)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else ""
        stack.append((depth, name))
    return parents
