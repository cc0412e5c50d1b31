"""mutmut, driven for this project: its configuration from ``modules.toml``,
each mutant run against its own module's tests only, and survivors checked
again on every run (mutmut keeps a verdict until the function changes, but
a new test can kill a mutant that survived before).

mutmut is pinned to one version in ``pyproject.toml``: this module sets its
configuration and wraps one of its steps through its internals.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mutmut import configuration
from mutmut.mutation.data import SourceFileMutationData
from mutmut.state import state
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import (
    copy_also_copy_files,
    copy_src_dir,
    setup_source_paths,
    walk_mutatable_files,
)
from mutmut.utils.format_utils import get_module_from_key

HERE = Path(__file__).resolve().parent
#: The packages copied into ``mutants/``: what the tests import besides ``tests``.
PACKAGES = ["streamstone_py", "handlers", "spark_driver"]
#: The rest of the repository the tests import (the launcher and the proxy).
ALSO_COPY = ["azurite/__init__.py", "azurite/launcher.py", "azurite/proxy.py"]
#: What each mutant's pytest gets besides its tests: the same draws of every
#: hypothesis test in every run (a verdict must not depend on luck), and a test
#: that hangs under a mutant fails within two minutes, not the suite's five.
PYTEST_ARGS = ["-p", "no:cacheprovider", "--hypothesis-seed=0", "--timeout=120"]
#: mypy as ``make typecheck`` runs it, reporting on the mutated files alone
#: (mutmut's generated lines carry ignores that may go unused).
MYPY_ARGS = ["--output", "json", "--follow-imports", "silent", "--no-warn-unused-ignores"]
#: Where the test lists each module's verdicts were reached with are kept.
LISTS = Path("mutants") / "streamstone-test-lists.json"


@dataclass(frozen=True)
class Module:
    path: str  # streamstone_py/_writes.py
    tests: tuple[str, ...]
    all_killed: bool

    @property
    def name(self) -> str:  # streamstone_py._writes, as mutmut names a mutant's module
        return self.path.removesuffix(".py").replace("/", ".")


def load_modules(path: Path = HERE / "modules.toml") -> list[Module]:
    table = tomllib.loads(path.read_text())["modules"]
    return [
        Module(name, tuple(entry["tests"]), bool(entry.get("all_killed", False)))
        for name, entry in table.items()
    ]


def configure(modules: list[Module], *, debug: bool = False) -> None:
    """mutmut's configuration, from ``modules.toml`` rather than a file of its own."""
    union = sorted({test for m in modules for test in m.tests})
    settings: dict[str, Any] = {
        "source_paths": PACKAGES,
        "only_mutate": [m.path for m in modules],
        "also_copy": ALSO_COPY,
        "pytest_add_cli_args": PYTEST_ARGS,
        "pytest_add_cli_args_test_selection": union,
        # The tests share one Azurite and its sockets: each pytest runs in a
        # process forked from a server that has imported but run nothing.
        "process_isolation": "forkserver",
        # `make typecheck` is part of `make test`: a mutant mypy --strict
        # rejects (an argument made None, a call left short) cannot land, and
        # needs no test run. Only the mutated files' errors count.
        "type_check_command": [
            sys.executable,
            "-m",
            "mypy",
            *MYPY_ARGS,
            *(m.path for m in modules),
        ],
        # Most of a test's time is spent waiting on Azurite, not on the CPU:
        # a hung mutant is stopped by its wall time, three times its tests' own.
        "timeout_multiplier": 3.0,
        "timeout_constant": 5.0,
        "debug": debug,
    }

    def read(key: str, default: Any) -> Any:
        return settings.get(key, default)

    configuration._config_reader = lambda: read  # see the module doc: a private hook of mutmut
    configuration.reset_config()


def _cli() -> Any:
    """mutmut's command module: it reads the configuration when imported, so
    only once :func:`configure` has set it."""
    return importlib.import_module("mutmut.__main__")


def _only_own_tests(modules: list[Module]) -> None:
    """After mutmut has found which tests call each function: keep, for each
    function, only the tests in its module's list."""
    allowed = {m.name: set(m.tests) for m in modules}
    cli = _cli()
    original: Callable[..., None] = cli.collect_or_load_stats

    def collect(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        found = state().tests_by_mangled_function_name
        for function, tests in found.items():
            own = allowed.get(get_module_from_key(function), set())
            found[function] = {t for t in tests if t.split("::")[0] in own}

    cli.collect_or_load_stats = collect


def _generate(children: int) -> None:
    """Write the mutants (only those of changed functions are new), as
    ``mutmut run`` does first, so that the verdicts can be read before it runs."""
    for extra in ALSO_COPY:  # mutmut copies a file, not the directory it is in
        (Path("mutants") / extra).parent.mkdir(parents=True, exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    _cli().create_mutants(children)


def verdicts() -> Iterator[tuple[str, str, str]]:
    """(source path, mutant name, status) of every mutant."""
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, code in data.exit_code_by_key.items():
            yield str(path), name, status_by_exit_code[code]


def _forget_modules_whose_tests_changed(modules: list[Module]) -> None:
    """mutmut notices when its whole list of tests changes, not when the share
    of one module does, nor a module added to the list: such a module's
    mutants are made again, and tested again."""
    before = json.loads(LISTS.read_text()) if LISTS.exists() else {}
    for module in modules:
        if before.get(module.path) != list(module.tests):
            for suffix in ("", ".meta", ".spans"):
                (Path("mutants") / (module.path + suffix)).unlink(missing_ok=True)


def _remember_test_lists(modules: list[Module]) -> None:
    LISTS.write_text(json.dumps({m.path: list(m.tests) for m in modules}, indent=1))


#: Verdicts worth another run: nothing yet, or a mutant no test has killed so far.
RECHECK = {"not checked", "survived", "no tests", "suspicious", "check was interrupted by user"}


def run(
    modules: list[Module],
    children: int,
    equivalent: Callable[[str, str], bool],
    forced: tuple[str, ...] = (),
) -> None:
    """Test the mutants that need it: new ones, and survivors that are not known
    to be equivalent (``equivalent(path, name)``); ``forced`` globs: those again."""
    _only_own_tests(modules)
    _forget_modules_whose_tests_changed(modules)
    _generate(children)
    _remember_test_lists(modules)
    names = list(forced) or [
        name
        for path, name, status in verdicts()
        if status in RECHECK and not equivalent(path, name)
    ]
    if not names:
        print("Every mutant has a verdict that stands; nothing to run.")
        return
    print(f"Testing {len(names)} mutants.")
    os.environ.setdefault("PY_IGNORE_IMPORTMISMATCH", "1")
    _cli()._run(names, children)
