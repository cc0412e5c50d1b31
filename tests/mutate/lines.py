"""Which tests run which lines of the mutated modules, so that each mutant
runs only the tests that run a line it changes.

One run of every module's tests under coverage.py, with a context per test,
measures it (``python -m tests.mutate.lines``, in a process of its own); the
result is kept in ``mutants/`` until a source or a test changes. A mutant's
changed lines are found by diffing its function with the original, and a
line counts as run when any line of its statement ran (of a compound
statement, any line of its header: ``if``, ``for``, ``except`` ...). A
mutant of a function's signature (a default value) runs the tests that call
the function, as mutmut records them.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst
from mutmut.mutation.diff_apply import read_functions_from_index
from mutmut.utils.format_utils import orig_function_and_class_names_from_key

from .settings import HERE, PACKAGES, PYTEST_ARGS, Module

#: Where the measure is kept, with the fingerprint of what it was measured on.
CACHE = Path("mutants") / "streamstone-lines.json"


@dataclass(frozen=True)
class Measured:
    #: The tests that ran each line of each module: {path: {line: test ids}}.
    lines: dict[str, dict[int, set[str]]]
    #: Each test's time, setup and teardown included, in seconds.
    durations: dict[str, float]


def _code() -> str:
    """Changes when a source or a test changes."""
    digest = hashlib.sha256()
    for folder in [*PACKAGES, "tests"]:
        for path in sorted(Path(folder).rglob("*.py")):
            if path.parent.resolve() != HERE:  # this driver is not what the tests run
                digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def measure(modules: list[Module]) -> Measured:
    """The tests that run each line of each module: kept, or measured now (for
    the modules whose code, tests or list of tests changed since)."""
    code = _code()
    kept = json.loads(CACHE.read_text()) if CACHE.exists() else {"modules": {}, "durations": {}}

    def key(module: Module) -> str:
        return hashlib.sha256(json.dumps([code, module.path, module.tests]).encode()).hexdigest()

    stale = [m for m in modules if kept["modules"].get(m.path, {}).get("key") != key(m)]
    if stale:
        tests = sorted({t for m in stale for t in m.tests})
        print(f"Measuring which tests run which lines ({len(tests)} test files) ...", flush=True)
        out = CACHE.with_suffix(".new")
        command = [sys.executable, "-m", "tests.mutate.lines", str(out), *(m.path for m in stale)]
        done = subprocess.run([*command, "--", *tests], check=False)
        if done.returncode != 0:
            raise SystemExit(
                f"the tests fail on the unmutated code (pytest exit {done.returncode})"
            )
        measured = json.loads(out.read_text())
        out.unlink()
        for module in stale:
            kept["modules"][module.path] = {
                "key": key(module),
                "lines": measured["lines"][module.path],
            }
        kept["durations"].update(measured["durations"])
        CACHE.write_text(json.dumps(kept))
    lines = {
        m.path: {int(n): set(ids) for n, ids in kept["modules"][m.path]["lines"].items()}
        for m in modules
    }
    return Measured(lines, kept["durations"])


def changed_lines(path: str, name: str, source: list[str]) -> list[int] | None:
    """The lines of ``path`` that the mutant ``name`` changes; ``None`` if they
    cannot be placed in the source (its function is not where it was)."""
    functions = read_functions_from_index(name, path)
    if functions is None:
        return None
    original, mutant = (cst.Module([f]).code.strip().split("\n") for f in functions)
    node = _function(ast.parse("\n".join(source)), *orig_function_and_class_names_from_key(name))
    first = next(
        (i for i, line in enumerate(original) if line.startswith(("def ", "async def "))), None
    )
    if node is None or first is None:
        return None
    start = node.lineno
    indexes: set[int] = set()
    matcher = difflib.SequenceMatcher(None, original, mutant, autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag != "equal":
            indexes.update(range(i1, i2) if i2 > i1 else [max(i1 - 1, 0)])
    lines = sorted(start + i - first for i in indexes)
    placed = all(
        0 < n <= len(source) and source[n - 1].strip() == original[n - start + first].strip()
        for n in lines
    )
    return lines if lines and placed else None


def _function(
    tree: ast.Module, function: str, cls: str | None
) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    body: list[ast.stmt] = tree.body
    if cls is not None:
        owner = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        body = owner.body if owner is not None else []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            return node
    return None


def probe(tree: ast.Module, line: int) -> range | None:
    """The lines whose running shows that ``line`` ran: its statement's (a
    compound statement's header); ``None`` for a line of a signature."""
    found: ast.stmt | ast.excepthandler | None = None
    for node in ast.walk(tree):  # breadth first: the innermost statement comes last
        if isinstance(node, ast.stmt | ast.excepthandler):
            found = node if node.lineno <= line <= (node.end_lineno or node.lineno) else found
    if found is None or isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return None
    body: list[ast.stmt] | None = getattr(found, "body", None)
    if body:
        return range(found.lineno, max(found.lineno, body[0].lineno - 1) + 1)
    return range(found.lineno, (found.end_lineno or found.lineno) + 1)


def tests_of(
    path: str, names: Iterable[str], ran: dict[int, set[str]]
) -> Iterator[tuple[str, set[str], bool]]:
    """Each mutant with the tests that run a line it changes, and true; or,
    for a mutant of a signature, those that run its function, and false."""
    source = Path(path).read_text().split("\n")
    tree = ast.parse("\n".join(source))
    for name in names:
        lines = changed_lines(path, name, source)
        probes = [probe(tree, n) for n in lines] if lines is not None else [None]
        if all(p is not None for p in probes):
            yield (
                name,
                {t for p in probes if p is not None for n in p for t in ran.get(n, ())},
                True,
            )
            continue
        function = _function(tree, *orig_function_and_class_names_from_key(name))
        body = range(function.body[0].lineno, (function.end_lineno or 0) + 1) if function else ()
        yield name, {t for n in body for t in ran.get(n, ())}, False


# --- the measuring run (its own process) ------------------------------------------


class _PerTest:
    """A coverage context per test (setup, call and teardown), and its time."""

    def __init__(self, cov: Any) -> None:
        self.cov = cov
        self.durations: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.cov.switch_context(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        self.cov.switch_context("")


def _measure(out: Path, paths: list[str], tests: list[str]) -> int:
    import coverage
    import pytest

    files = {str(Path(p).resolve()): p for p in paths}
    cov = coverage.Coverage(data_file=None, include=list(files), config_file=False)
    per_test = _PerTest(cov)
    cov.start()
    try:
        code = int(pytest.main(["-q", "-p", "no:randomly", *PYTEST_ARGS, *tests],
                               plugins=[per_test]))  # fmt: skip
    finally:
        cov.stop()
    data = cov.get_data()
    lines: dict[str, dict[str, list[str]]] = {p: {} for p in paths}
    for measured in data.measured_files():
        path = files.get(str(Path(measured).resolve()))
        if path is None:
            continue
        for number, contexts in data.contexts_by_lineno(measured).items():
            ids = sorted(c for c in contexts if c)
            if ids:
                lines[path][str(number)] = ids
    out.write_text(json.dumps({"lines": lines, "durations": per_test.durations}))
    return code


if __name__ == "__main__":
    args = sys.argv[1:]
    split = args.index("--")
    sys.exit(_measure(Path(args[0]), args[1:split], args[split + 1 :]))
