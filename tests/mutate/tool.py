"""mutmut, driven for this project: its configuration from ``modules.toml``;
each mutant run against the tests of its module's list that run a line it
changes (measured by ``lines``), fastest first; survivors checked again on
every run (mutmut keeps a verdict until the function changes, but a new test
can kill a mutant that survived before).

mutmut is pinned to one version in ``pyproject.toml``: this module sets its
configuration and replaces three of its steps through its internals (the
tests of each mutant, its measuring run, its run of the unmutated tests).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
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

from .lines import Measured, measure, tests_of
from .settings import PACKAGES, PYTEST_ARGS, Module

#: The rest of the repository the tests import (the launcher and the proxy).
ALSO_COPY = ["azurite/__init__.py", "azurite/launcher.py", "azurite/proxy.py"]
#: mypy as ``make typecheck`` runs it, reporting on the mutated files alone
#: (mutmut's generated lines carry ignores that may go unused).
MYPY_ARGS = ["--output", "json", "--follow-imports", "silent", "--no-warn-unused-ignores"]
#: Where the test lists each module's verdicts were reached with are kept.
LISTS = Path("mutants") / "streamstone-test-lists.json"


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


def _select_tests(modules: list[Module], measured: Measured) -> None:
    """Hand mutmut, for each mutant, the tests of its module's list that run a
    line it changes, fastest first, in place of every test that calls its
    function (which mutmut would learn from a run of its own: ``measure``'s
    run replaces it).

    mutmut looks a mutant's tests up by its function's name: that lookup gets
    the mutant's own name, under which its tests are kept.
    """
    cli = _cli()
    by_function: Callable[[str], str] = cli.mangled_name_from_mutant_name
    chosen: dict[str, set[str]] = {}

    def load(*args: Any, **kwargs: Any) -> None:
        lined = 0
        found = state().tests_by_mangled_function_name
        found.clear()
        state().duration_by_test.clear()
        state().duration_by_test.update(measured.durations)
        for module in modules:
            own = set(module.tests)
            names = [n for path, n, _ in verdicts() if path == module.path]
            for name, tests, by_line in tests_of(
                module.path, names, measured.lines.get(module.path, {})
            ):
                chosen[name] = {t for t in tests if t.split("::")[0] in own}
                lined += by_line
        found.update(chosen)
        print(
            f"    {len(chosen)} mutants: {lined} with the tests that run their lines, "
            f"{len(chosen) - lined} (of a signature) with those that run their function"
        )

    def runner(*args: Any, **kwargs: Any) -> Any:
        made = original_runner(*args, **kwargs)
        submit = made.submit

        def fastest_first(name: str, tests: list[str], *rest: Any) -> None:
            submit(name, sorted(tests, key=lambda t: (measured.durations.get(t, 0.0), t)), *rest)

        made.submit = fastest_first
        # The measuring run ran every one of these tests on the code as it is,
        # and stops `make mutate` if one fails; a kept measure is of that code.
        made.run_clean_tests = lambda tests: 0
        return made

    original_runner = cli.get_mutant_runner
    cli.collect_or_load_stats = load
    cli.get_mutant_runner = runner
    cli.mangled_name_from_mutant_name = lambda name: name if name in chosen else by_function(name)


def _generate(children: int) -> None:
    """Write the mutants (only those of changed functions are new), as
    ``mutmut run`` does first, so that the verdicts can be read before it runs."""
    for extra in ALSO_COPY:  # mutmut copies a file, not the directory it is in
        (Path("mutants") / extra).parent.mkdir(parents=True, exist_ok=True)
    cli = _cli()
    with cli.CatchOutput(spinner_title="Generating mutants"):  # a line per file otherwise
        copy_src_dir()
        copy_also_copy_files()
        setup_source_paths()
        cli.create_mutants(children)


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
    before = json.loads(LISTS.read_text()) if LISTS.exists() else {}
    before.update({m.path: list(m.tests) for m in modules})
    LISTS.write_text(json.dumps(before, indent=1))


#: Verdicts worth another run: nothing yet, or a mutant no test has killed so far.
RECHECK = {"not checked", "survived", "no tests", "suspicious", "check was interrupted by user"}


def run(
    everything: list[Module],
    modules: list[Module],
    children: int,
    equivalent: Callable[[str, str], bool],
    forced: tuple[str, ...] = (),
) -> None:
    """Test the mutants of ``modules`` that need it: new ones, and survivors
    that are not known to be equivalent (``equivalent(path, name)``);
    ``forced`` globs: those again."""
    _forget_modules_whose_tests_changed(everything)
    _generate(children)
    _remember_test_lists(everything)
    paths = {m.path for m in modules}
    again = [
        (path, name)
        for path, name, status in verdicts()
        if path in paths and status in RECHECK and not equivalent(path, name)
    ]
    if not again and not forced:
        print("Every mutant has a verdict that stands; nothing to run.")
        return
    _select_tests(modules, measure(modules))
    os.environ.setdefault("PY_IGNORE_IMPORTMISMATCH", "1")
    if forced or modules != everything:
        _cli()._run(list(forced) or [name for _, name in again], children)
        return
    # mutmut runs, of the mutants not named, those without a verdict.
    _forget_verdicts(again)
    print(f"Testing {len(again)} mutants.")
    _cli()._run([], children)


def _forget_verdicts(mutants: list[tuple[str, str]]) -> None:
    for path in {path for path, _ in mutants}:
        data = SourceFileMutationData(path=Path(path))
        data.load()
        for _, name in (m for m in mutants if m[0] == path):
            data.exit_code_by_key[name] = None
        data.save()
