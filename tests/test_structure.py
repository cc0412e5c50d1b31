"""The packages' structure: a layered import graph without a circle, modules
of a readable size, and error trees drawn as the classes are.

The import graph:

``streamstone_py`` knows nothing of ``handlers`` or Spark, ``handlers``
nothing of Spark, and inside each package no two modules import each other,
directly or around a loop. Imports under ``if TYPE_CHECKING:`` are left out:
they never run, so they cannot make the order of loading matter; they only
name types for the checker.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Lowest first: a package may import only the ones before it.
LAYERS = ("streamstone_py", "handlers", "spark_driver")


def _runtime_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node of the module except those under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def _imports(path: Path, package: str) -> set[str]:
    """The project modules ``path`` imports when it runs (package-relative resolved)."""
    here = f"{package}.{path.stem}" if path.stem != "__init__" else package
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - node.level + (path.stem == "__init__")])
                if node.module:
                    found.add(f"{base}.{node.module}")
                else:  # from . import _stream
                    found.update(f"{base}.{alias.name}" for alias in node.names)
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in LAYERS}


def graph() -> dict[str, set[str]]:
    modules: dict[str, set[str]] = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).glob("*.py")):
            name = f"{package}.{path.stem}" if path.stem != "__init__" else package
            modules[name] = _imports(path, package)
    # Keep only edges to modules (``from x import name`` also listed x.name).
    return {name: {m for m in targets if m in modules} for name, targets in modules.items()}


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


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in sorted(targets)
        if LAYERS.index(target.split(".")[0]) > LAYERS.index(module.split(".")[0])
    ]
    assert upward == []


def test_no_import_circle() -> None:
    assert [" -> ".join(c) for c in cycles(graph())] == []


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    # The walk itself is tested on a made-up graph, so that an empty answer
    # above means no circle, not a checker that finds none.
    edges = {
        "handlers._a": {"handlers._b"},
        "handlers._b": {"handlers._c"},
        "handlers._c": {"handlers._a"},
        "handlers": {"handlers._a"},
    }
    assert cycles(edges) == [["handlers._a", "handlers._b", "handlers._c", "handlers._a"]]
    # And the parser finds real edges of each kind: relative, absolute, package.
    real = graph()
    assert "handlers._fold" in real["handlers._writing"]
    assert "streamstone_py" in real["handlers._processor"]
    assert "handlers._processor" in real["handlers"]
    assert "handlers" in real["spark_driver._executor"]


#: Where the 350-line rule holds: the packages, and the benchmarks (scripts
#: and the modules they share).
SIZED = (*LAYERS, "benchmarks")


def test_no_package_or_benchmark_module_is_over_350_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for folder in SIZED
        for path in sorted((ROOT / folder).glob("*.py"))
        if (lines := len(path.read_text().splitlines())) > 350
    }
    assert long == {}


def _drawn_tree(doc: str) -> dict[str, str]:
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


@pytest.mark.parametrize("package", ["streamstone_py", "handlers"])
def test_each_error_tree_is_drawn_as_the_classes_are(package: str) -> None:
    module = importlib.import_module(f"{package}._errors")
    drawn = _drawn_tree(module.__doc__ or "")
    exported = {
        name
        for name in importlib.import_module(package).__all__
        if name.endswith("Error") and getattr(module, name, None) is not None
    }
    # Every public error of the package is drawn, under its nearest public base.
    assert set(drawn) == exported
    for name, parent in drawn.items():
        cls = getattr(module, name)
        public_bases = [b.__name__ for b in cls.__mro__[1:] if b.__name__ in exported]
        assert parent == (public_bases[0] if public_bases else ""), name


#: Each queue room, and who besides its own modules may import it: the
#: package's front door; in spark_driver also what joins the room to the rest
#: (the command and its checks, run_queue, the micro-batch sink that sends any
#: stream's outputs to queues, the queue demo). The core never does.
QUEUE_ROOMS = {
    "handlers._queues": {"handlers"},
    "spark_driver._queues": {
        "spark_driver", "spark_driver.__main__", "spark_driver._checks",
        "spark_driver._queue_stream", "spark_driver._stream", "spark_driver.demo_queue",
    },
}  # fmt: skip


def _dotted_imports() -> dict[str, set[str]]:
    """Each module of the packages, subpackages included, with every name it
    imports (lazy and ``TYPE_CHECKING`` imports too), relative ones resolved."""
    found: dict[str, set[str]] = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            home = list(parts[:-1])  # the package a relative import starts from
            targets: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    base = home[: len(home) - node.level + 1] if node.level else []
                    module = ".".join([*base, *([node.module] if node.module else [])])
                    targets |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
                elif isinstance(node, ast.Import):
                    targets |= {alias.name for alias in node.names}
            found[".".join(home if parts[-1] == "__init__" else parts)] = targets
    return found


def _room_breaches(edges: dict[str, set[str]]) -> list[str]:
    def inside(module: str, room: str) -> bool:
        return module == room or module.startswith(f"{room}.")

    return sorted(
        f"{module} imports {target}"
        for module, targets in edges.items()
        for target in targets & edges.keys()  # modules, not the names taken from them
        for room, above in QUEUE_ROOMS.items()
        if inside(target, room) and not inside(module, room) and module not in above
    )


def test_the_queue_rooms_are_imported_only_from_above() -> None:
    edges = _dotted_imports()
    # The walk sees the rooms' real edges, so an empty answer is not a blind one.
    assert "handlers._queues._consumer" in edges["handlers"]
    assert "handlers._processor" in edges["handlers._queues._rounds"]
    assert "spark_driver._queues._sink" in edges["spark_driver._stream"]
    assert _room_breaches(edges) == []
    edges["handlers._fold"].add("handlers._queues._consumer")
    assert _room_breaches(edges) == ["handlers._fold imports handlers._queues._consumer"]
