"""The packages' structure: a layered import graph without a circle, rooms
entered only by their doors, folders and modules of a readable size, and error
trees drawn as the classes are (the graph and the rooms: tests/structure.py).

``streamstone_py`` knows nothing of ``handlers`` or Spark, ``handlers``
nothing of Spark, and inside each package no two modules import each other,
directly or around a loop. For the layers, only the imports that run count
(those under ``if TYPE_CHECKING:`` never run, so they cannot make the order
of loading matter). For circles and rooms the type checker's imports count
too: a module that names another's type depends on it as much as one that
calls it.
"""

from __future__ import annotations

import ast
import importlib
import tomllib
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from .structure import (
    LAYERS,
    ROOT,
    Room,
    breaches,
    cycles,
    drawn_tree,
    graph,
    held,
    matches,
    module_name,
    modules,
    package_folders,
    within,
)


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


#: Circles of the type checker's imports still to untangle, by package.
TYPED_CIRCLES_LEFT: dict[str, str] = {}


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(name, marks=[pytest.mark.xfail(reason=TYPED_CIRCLES_LEFT[name], strict=True)])
        if name in TYPED_CIRCLES_LEFT
        else name
        for name in LAYERS
    ],
)
def test_no_import_circle_the_type_checkers_imports_included(package: str) -> None:
    edges = {
        module: {t for t in targets if within(t, package)}
        for module, targets in graph(typing=True).items()
        if within(module, package)
    }
    assert [" -> ".join(c) for c in cycles(edges)] == []


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
    assert "handlers._batch._fold" in real["handlers._batch._writing"]
    assert "streamstone_py" in real["handlers._processor"]
    assert "handlers._processor" in real["handlers"]
    assert "handlers" in real["spark_driver._tasks._executor"]
    # From a room (a subpackage) to the room beside it and to the package above.
    assert "streamstone_py._transport._protocol" in real["streamstone_py._transport._runner"]
    assert "streamstone_py._transport._wire._client" in real["streamstone_py._transport._runner"]
    assert "streamstone_py._codec._values" in real["streamstone_py._rows"]
    # The type checker's imports only where asked for.
    assert "handlers._outcome" not in real["handlers._batch._records"]
    assert "handlers._outcome" in graph(typing=True)["handlers._batch._records"]


# --- Rooms ------------------------------------------------------------------
# A room is a set of modules with rules at its door (see tests/structure.py):
# who outside it may import it, what outside it it may import. Every import
# counts, the type checker's too: naming a module's type is knowing it.

#: The runner modules: the two drivers, the SDK's I/O and the wire client. The
#: verbs yield requests (``_transport._protocol``) and never know which of these
#: performs them.
RUNNERS = (
    "streamstone_py._transport._runner*",
    "streamstone_py._transport._sdk",
    "streamstone_py._transport._wire*",
)
#: The engine's front doors: where a caller's client picks its runner.
ENGINE_DOORS = (
    "streamstone_py",  # WireTableClient
    "streamstone_py.aio",  # the verbs as coroutines, and AsyncWireTableClient
    "streamstone_py._stream",  # Stream's verbs, run by the sync runner
    "streamstone_py._tables",  # rows beside the streams, through the same runners
    "streamstone_py._config",  # clients built from configuration
)


#: Each room and its rules. A room entered only from above names who may, e.g.
#: ``Room("...", ("handlers._queue*",), importers=("handlers", "spark_driver*"))``.
ROOMS = (
    Room("the verbs know no runner", RUNNERS, importers=ENGINE_DOORS),
    Room("the runners know requests, not streams", ("streamstone_py._transport*",), imports=()),
    Room("the value codec stands alone", ("streamstone_py._codec*",), imports=()),
    # The queue rooms are entered from above only: the package's front door,
    # and in spark_driver what joins the room to the rest (the command and its
    # checks, run_queue, the micro-batch sink that sends any stream's outputs to
    # queues, the queue demo). The core never imports them.
    Room(
        "a batch is decided below the processor",
        ("handlers._batch*",),
        importers=("handlers._processor", "handlers._retention"),
    ),
    Room(
        "a task knows the job's settings, never the driver",
        ("spark_driver._tasks*",),
        imports=("spark_driver._logs", "spark_driver._settings", "handlers*", "streamstone_py*"),
    ),
    Room(
        "handlers' core knows no queue",
        ("handlers._queues*",),
        importers=("handlers", "handlers._failed*"),
    ),
    # Failed messages are taken off the shelf from above the queue path: the
    # core never reads a poison queue.
    Room(
        "the shelf is read from above",
        ("handlers._failed*",),
        importers=("handlers",),
        imports=("handlers._queues*", "handlers._messages*"),
    ),
    Room(
        "the Spark job's core knows no queue",
        ("spark_driver._queues*",),
        importers=(
            "spark_driver",
            "spark_driver.__main__",
            "spark_driver._checks",
            "spark_driver._queue_stream",
            "spark_driver._stream",
            "spark_driver.demo_queue",
        ),
    ),
)


@pytest.mark.parametrize("room", ROOMS, ids=lambda room: room.name)
def test_each_room_is_entered_and_left_only_as_its_rules_say(room: Room) -> None:
    edges = graph(typing=True)
    # Each name stands for modules that exist: a rule over nothing proves nothing.
    patterns = (*room.members, *(room.importers or ()), *(room.imports or ()))
    assert [p for p in patterns if not any(fnmatchcase(m, p) for m in edges)] == []
    assert breaches(edges, room) == []


def test_the_door_check_sees_a_breach_either_way() -> None:
    room = Room("made up", ("p._room*",), importers=("p._door",), imports=("p._below",))
    edges = {
        "p._door": {"p._room._a"},
        "p._verb": {"p._room._a"},
        "p._room._a": {"p._room._b", "p._below", "p._verb"},
        "p._room._b": set(),
    }
    assert breaches(edges, room) == ["p._room._a imports p._verb", "p._verb imports p._room._a"]


#: A folder of a package holds at most this many modules directly: each ``.py``
#: file but ``__init__.py``, and each subpackage (a room) as one; data files
#: (``py.typed``, a log configuration) do not count.
MOST_MODULES = 20
#: Folders still over it, each with what brings it down.
OVER: dict[str, str] = {}


def _folder(folder: Path) -> object:
    name = module_name(folder / "__init__.py")
    marks = [pytest.mark.xfail(reason=OVER[name], strict=True)] if name in OVER else []
    return pytest.param(folder, id=name, marks=marks)


@pytest.mark.parametrize("folder", [_folder(folder) for folder in package_folders()])
def test_a_package_folder_holds_at_most_20_modules(folder: Path) -> None:
    assert len(held(folder)) <= MOST_MODULES, held(folder)


@pytest.mark.parametrize(
    "init",
    [init for layer in LAYERS for init in sorted((ROOT / layer).glob("*/**/__init__.py"))],
    ids=lambda init: module_name(init),
)
def test_each_room_says_in_about_two_lines_what_it_owns(init: Path) -> None:
    docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
    assert 1 <= len(docstring.splitlines()) <= 3, docstring


def test_the_wheel_takes_every_room() -> None:
    # Every folder of a package that holds modules is a package (an __init__.py)
    # that the build's list or patterns (setuptools matches them as fnmatch does) take.
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]
    patterns = tuple(packages["find"]["include"] if isinstance(packages, dict) else packages)
    folders = {path.parent for layer in LAYERS for path in modules(layer)}
    assert (
        sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()) == []
    )
    names = [module_name(folder / "__init__.py") for folder in package_folders()]
    assert [name for name in names if not matches(name, patterns)] == []


#: Where the 350-line rule holds: the packages, and the benchmarks (scripts
#: and the modules they share).
SIZED = (*LAYERS, "benchmarks")


def test_no_package_or_benchmark_module_is_over_350_lines() -> None:
    # Every module, those of the rooms (subpackages) included.
    assert ROOT / "streamstone_py" / "_transport" / "_wire" / "_client.py" in modules(
        "streamstone_py"
    )
    long = {
        str(path.relative_to(ROOT)): lines
        for folder in SIZED
        for path in modules(folder)
        if (lines := len(path.read_text().splitlines())) > 350
    }
    assert long == {}


@pytest.mark.parametrize("package", ["streamstone_py", "handlers"])
def test_each_error_tree_is_drawn_as_the_classes_are(package: str) -> None:
    module = importlib.import_module(f"{package}._errors")
    drawn = drawn_tree(module.__doc__ or "")
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
